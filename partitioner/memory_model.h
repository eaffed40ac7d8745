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
