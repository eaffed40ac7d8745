// memory_model.h — what the planner knows about a model and a parallel layout, and the bytes
// each rank needs for it. A point of the planner's search is a resolved ParallelLayout
// (runtime/base/parallel_layout.h: the type the config and plans use too).
//
// Parameter and activation counts are the model's own (models/description.h: its layers'
// parameter layout and saved tensors); tests/mpi_test_memory.cc and
// tests/test_planner.cc check the prediction against the allocator's measured peak of the CPU
// runtime.
//
// Byte model (docs/planner.md):
//   fp32:  parameters 4, gradients 4, optimizer 8 (Adam m, v) bytes per parameter;
//   bf16:  parameters 2 (bf16 weights), gradients 4 (fp32 main grads), optimizer 12 (fp32
//          master weights + Adam m, v): Megatron's 18 bytes per parameter;
//   the distributed optimizer (ZeRO-1) divides the optimizer bytes by d; 2bw keeps a second
//   weight copy (parameter bytes once more). Expert parallelism of e: a rank holds E/e experts'
//   weights, gradients and optimizer state; ZeRO-1 shards the experts' state over the d/e ranks
//   of the expert-data-parallel group.
// Activations are counted tensor by tensor as the runtime saves them (element size = the
// precision's; fp32 on the CPU), times the (micro-batch, chunk) pairs in flight on the stage
// from the schedule simulator, plus the backward pass's working set.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/description.h"
#include "runtime/base/parallel_layout.h"

namespace strata {

// Precision-dependent constants.
struct MemoryOptions {
  std::string precision = "bf16";  // "bf16" or "fp32"
  // Flash attention (fused, the GPU path) keeps only the softmax statistics; the CPU runtime
  // keeps the (b, a, s, s) probabilities.
  bool flash_attention = true;
  // Per-rank memory held back from the plan: CUDA context, NCCL, allocator fragmentation (none
  // of it passes through Strata's allocator).
  double reserve_bytes = 0;
  // GPU: the GEMM library's workspace, held by the backend for the whole run (kBuffers).
  double workspace_bytes = 0;
  // Attention backward scratch of the CPU kernels: threads · s · s floats.
  int cpu_threads = 0;
  // Data-parallel gradient buckets (parallel.bucket_mb).
  double bucket_mb = 25;
};

struct MemoryBreakdown {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, buffers = 0;
  double total() const { return parameters + gradients + optimizer + activations + buffers; }
};

// Context parallelism (parallel.context = c): each sequence is cut into 2c chunks and a rank holds
// two of them, S/c tokens of every sequence. Everything but the attention core works per token,
// so a rank's share of a part's work is the description's (made for the whole sequence: its
// RankShape has no context) divided by c: the GEMMs' rows, the memory-bound passes, the logits,
// the tensor-group collectives; the attention core's FLOPs per rank are the whole core's / c too
// (the causal load balance), computed as c blocks of S/c queries by S/c keys (its shape's seq).
// At c = 1 the work is returned as it is.
PartWork context_share(PartWork w, int context);
// A rank's share of what a part keeps: every saved and transient element divided by c.
ActivationElems context_share(ActivationElems a, int context);

// The key/value block a ring step sends (b · S/c · 2·KVH/t · HS elements), of the largest
// attention among the model's kinds of layer; 0 at c = 1 or without attention.
double ring_block_elems(const ModelDescription& m, const ParallelLayout& c);
// The ring's buffers on a rank, transient per layer (never saved), at their backward peak
// (models/layers/ring_attention.cc): the key/value block at hand and the one arriving, in the
// activation type, and four f32 blocks of key/value gradients (this rank's part being sent on,
// the one arriving, two of each): block·(2·element bytes + 16).
double ring_buffer_bytes(const ModelDescription& m, const ParallelLayout& c, double element_bytes);

// Ranks the weight gradients are summed over: data × context (every rank of a context group
// holds the same weights and computes gradients of its own tokens); ZeRO-1 shards the optimizer
// state over them.
inline int gradient_reduction_ranks(const ParallelLayout& c) {
  return c.data * c.context;
}

// Activation bytes one transformer layer of kind `kind` keeps for the backward pass of one
// micro-batch.
double layer_activation_bytes(const ModelDescription& m, const ParallelLayout& c,
                              const MemoryOptions& o, int kind);

// [stage] bytes per rank. inflight: [stage] the most (micro-batch, chunk) pairs alive at once
// (SimResult::peak_inflight). Each stage counts the kinds of layer its pieces hold
// (ModelDescription::layer_kind); a pair keeps the activations of 1/v of the stage's layers (the
// mean chunk: exact when the chunks hold the same layers, as they do for one kind of layer).
// Precondition: c.layers_per_piece has p · v entries.
std::vector<MemoryBreakdown> stage_memory(const ModelDescription& m, const ParallelLayout& c,
                                          const MemoryOptions& o, const std::vector<int>& inflight);

}  // namespace strata
