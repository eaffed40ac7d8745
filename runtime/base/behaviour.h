// behaviour.h — what Strata's runtime overlaps and what it does not, stated once: for the code
// that does it and for the planner that prices it (partitioner/runtime_model.cc builds the
// planner's description of this runtime from these constants alone).
//
// Where the runtime has two ways (a switch), the code reads the constant and does what it says:
// GradReducer starts its buckets during the backward pass or at ReduceGrads. Where it has one
// way, the code that does it static_asserts the constant, so whoever builds the other way must
// change it here, and the planner's prediction changes with it:
//   kTensorParallelOverlap      models/layers/parallel.cc
//   kGatherParamsDuringForward  runtime/engine/grad_reducer.cc
//   kHostSendsBlock, kDeviceGroupsWaitForSends  runtime/engine/pipeline.cc
//   kGradientWireBytes          runtime/engine/grad_reducer.cc
//   kRingOverlapsAttention, kRingGradWireBytes  the ring attention (parallel.context > 1)
// docs/planner.md ("The runtime priced as it is") says how each is priced.
//
// Thread-safety: constants.
#pragma once

namespace strata::behaviour {

// Tensor-parallel collectives (all-reduce; all-gather and reduce-scatter with sequence
// parallelism) block the compute that follows them: none is hidden behind a GEMM.
inline constexpr bool kTensorParallelOverlap = false;

// Data parallelism: a gradient bucket's reduction starts as soon as every gradient in it is
// final (during the last micro-batch's backward of the piece holding it; after its weight pass
// with zero-bubble schedules), non-blocking, and ReduceGrads waits for what is left. False:
// every bucket starts at ReduceGrads.
inline constexpr bool kReduceBucketsDuringBackward = true;

// Bytes per element the data-parallel reduction moves: the f32 main gradients, in f32.
inline constexpr int kGradientWireBytes = 4;

// ZeRO-1: the updated f32 parameter shards are all-gathered right after the optimizer step and
// waited for there (not behind the next forward pass).
inline constexpr bool kGatherParamsDuringForward = false;
inline constexpr int kParamGatherWireBytes = 4;

// Pipeline transfers. On the host transport (MPI) a send never holds up its stage and a receive
// waits for its data, which moves while the receive is waited for (large messages go by
// rendezvous): the receiver pays the transfer. On a device transport with rendezvous sends
// (NCCL) a group's sends go out in one batch with its receives and the stage waits for the
// whole batch (the 1F1B steady state's send-and-receive pairs): both ends pay it.
inline constexpr bool kHostSendsBlock = false;
inline constexpr bool kDeviceGroupsWaitForSends = true;

// Progress of non-blocking collectives while the stage computes. Device collectives (NCCL) run
// on their own stream. The host transport (MPI) moves a non-blocking collective on only inside
// MPI calls (GradReducer tests its requests when a parameter becomes ready, which is not
// progress enough to count on), so on the CPU a bucket's reduction is paid at ReduceGrads.
inline constexpr bool kDeviceCollectivesProgressAlone = true;
inline constexpr bool kHostCollectivesProgressAlone = false;

// Context parallelism: ring attention overlaps each step's key/value transfer with the block it
// computes. Per attention layer the forward runs c steps over the c key/value blocks of the
// sequence; each step starts sending the block at hand to the next context rank (and receiving
// the next one), computes attention on it, then waits for the transfer (c − 1 transfers). The
// backward sends the blocks round again with their accumulated key/value gradients (c − 1 and
// c transfers), each beside the step's block backward. Whether the transfer moves while the
// block computes is the transport's: device collectives progress alone, the host's do not
// (kDeviceCollectivesProgressAlone, kHostCollectivesProgressAlone).
inline constexpr bool kRingOverlapsAttention = true;
inline constexpr int kRingGradWireBytes = 4;  // dk/dv travel in f32

// The optimizer step's memory traffic per parameter of the rank's shard: zero the gradient
// (write 4), the gradient norm (read 4), AdamW (read parameter, gradient, m, v; write
// parameter, m, v: 28), and in bf16 the compute copy (read 4, write 2).
inline constexpr double kStepBytesPerParamF32 = 36;
inline constexpr double kStepBytesPerParamBf16 = 42;

}  // namespace strata::behaviour
