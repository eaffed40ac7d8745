// runtime_model.h — what the training runtime a plan is made for does with the machine: which
// kernels compute the attention, what it overlaps (tensor-parallel collectives, data-parallel
// buckets, the ZeRO parameter gather, pipeline transfers) and what it moves per parameter and
// per logit. The cost model (cost_model.h) prices a plan through one of these.
//
// strata_runtime() is Strata's own, built from runtime/base/behaviour.h — the constants the runtime
// code itself reads or asserts — so a change in the runtime changes the prediction. Other
// runtimes (Megatron-LM's, for scoring the planner against published runs) are described the
// same way by bench/bench_planner_calibration.cc, each field from that runtime's code or paper.
//
// Thread-safety: plain values.
#pragma once

#include <string>

namespace strata {

struct RuntimeModel {
  std::string name = "strata";
  // Attention core: a fused (flash) kernel at the device's attention throughput; else batched
  // GEMMs for Q·Kᵀ and P·V on the GEMM curve plus the softmax (and dropout) passes over the
  // b·heads·s² scores at memory bandwidth (Megatron-LM before flash attention).
  bool fused_attention = true;
  // Unfused: bytes per score element of the passes besides the GEMMs, forward and backward
  // (the softmax reads and writes the scores; dropout adds its mask).
  double score_bytes_fwd = 0, score_bytes_bwd = 0;
  // Tensor-parallel collectives: false blocking (their whole time on the critical path); true
  // pipelined with the GEMMs in t chunks (Transformer Engine's userbuffers), exposing
  // max(comm / t, comm − GEMM time).
  bool tp_overlap = false;
  // Backward collectives only, started asynchronously beside the backward GEMMs (Megatron-LM's
  // async input-gradient all-reduce, and its re-gather of the input with sequence parallelism):
  // exposing max(0, comm − GEMM time) of the backward.
  bool tp_overlap_backward = false;
  // Data parallelism: buckets of `bucket_bytes` reduce as their gradients become final during
  // the last micro-batch's backward (false: all after the backward), on a transport that moves
  // them while the stage computes (false: paid when waited for).
  bool dp_overlap = true;
  bool collectives_progress_alone = true;
  double bucket_bytes = 25.0 * 1024 * 1024;
  double grad_wire_bytes = 4;   // per gradient element reduced
  double param_wire_bytes = 4;  // per parameter all-gathered (distributed optimizer)
  // The distributed optimizer's parameter all-gather: hidden behind the next forward pass
  // (Megatron-Core's --overlap-param-gather), else waited for after the step.
  bool param_gather_overlap = false;
  // Pipeline transfers: both ends wait for a transfer (a grouped send and receive waited for
  // together), else only the receiver does.
  bool p2p_both_ends = true;
  // Without sequence parallelism each tensor rank holds the whole boundary activation: sent
  // whole by every rank, or scattered (1/t each) and all-gathered over NVLink on the receiving
  // side (Megatron-LM's scatter/gather optimisation).
  bool p2p_scatter_gather = false;
  // Cross-entropy over the logits: bytes per logit forward and backward (0: the model's own
  // count of f32 passes, models/description.h).
  double loss_bytes_fwd = 0, loss_bytes_bwd = 0;
  // The optimizer step's bytes per parameter of the rank's shard.
  double step_bytes_per_param = 36;
  // Kernels one transformer layer launches (the device's kernel gap applies to each).
  double kernels_per_layer_fwd = 14, kernels_per_layer_bwd = 28;
  // Context parallelism (ring attention over c ranks): each step's transfer moves while the
  // step's block computes, the step taking the longer of the two (false: the transfer after the
  // block); bytes per element of the key/value gradients sent round in the backward; and the
  // kernels each step after the first adds (forward: the block's attention and the merge of its
  // partial result by log-sum-exp; backward: the block's backward).
  bool ring_overlap = true;
  double ring_grad_wire_bytes = 4;
  double ring_kernels_per_step_fwd = 2, ring_kernels_per_step_bwd = 1;
};

// Strata's runtime on `cpu` ranks (MPI, the CPU backend) or GPUs (NCCL, the CUDA backend), in
// `precision`, with data-parallel buckets of `bucket_mb` MiB of f32 gradients.
RuntimeModel strata_runtime(bool cpu, const std::string& precision, double bucket_mb = 25);

}  // namespace strata
