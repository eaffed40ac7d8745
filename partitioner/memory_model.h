// memory_model.h — what the planner knows about a model and a parallel layout, and the bytes
// each rank needs for it.
//
// The partitioner does not depend on models/ (DESIGN.md layout), so the parameter and
// activation counts here are the planner's own closed forms of the GPT of docs/model.md;
// tests/test_planner.cc checks them against models/ (parameter layout) and against the
// allocator's measured peak of the CPU runtime.
//
// Byte model (docs/planner.md):
//   fp32:  parameters 4, gradients 4, optimizer 8 (Adam m, v) bytes per parameter;
//   bf16:  parameters 2 (bf16 weights), gradients 4 (fp32 main grads), optimizer 12 (fp32
//          master weights + Adam m, v): Megatron's 18 bytes per parameter;
//   the distributed optimizer (ZeRO-1) divides the optimizer bytes by d; 2bw keeps a second
//   weight copy (parameter bytes once more).
// Activations are counted tensor by tensor as the runtime saves them (element size = the
// precision's; fp32 on the CPU), times the (micro-batch, chunk) pairs in flight on the stage
// from the schedule simulator, plus the backward pass's working set.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "schedules/schedule.h"

namespace strata {

// The model as the planner sees it (the keys of the config's `model` section).
struct ModelSpec {
  std::string name;
  int num_layers = 12;
  int hidden_size = 768;
  int num_heads = 12;
  int ffn_hidden_size = 3072;
  int seq_len = 1024;
  int vocab_size = 50257;
  bool tie_embeddings = true;
};

enum class RecomputeKind { kNone, kSelective, kFull };
const char* to_string(RecomputeKind r);
bool parse_recompute_kind(const std::string& s, RecomputeKind* out);

// One point of the search space: a full parallel layout and schedule.
struct PlanConfig {
  int tensor = 1;
  int pipeline = 1;
  int data = 1;
  int virtual_stages = 1;  // v model chunks per stage (interleaved only)
  int micro_batch_size = 1;
  int num_microbatches = 1;  // per pipeline per iteration: B / (b · d)
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  RecomputeKind recompute = RecomputeKind::kNone;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  // [piece] layers, piece k = chunk · p + stage (Megatron's interleaving); p · v entries.
  std::vector<int> layers_per_piece;
};

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

// Parameters (elements) of the whole model, without vocabulary padding: the model size.
int64_t model_parameters(const ModelSpec& m);
// Vocabulary padded to a multiple of 128 · t, as the runtime (and Megatron) pad it.
int64_t padded_vocab(const ModelSpec& m, int tensor);
// Elements of one transformer layer on one tensor-parallel rank.
int64_t layer_parameters_per_rank(const ModelSpec& m, int tensor);
// Elements on one rank of model piece `piece` of a layout cut into `pieces` pieces holding
// `layers` layers (the first piece has wte and wpe, the last ln_f and the head; with tied
// embeddings and several pieces the last piece holds a copy of wte).
int64_t piece_parameters_per_rank(const ModelSpec& m, int tensor, int piece, int pieces,
                                  int layers);

struct MemoryBreakdown {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, buffers = 0;
  double total() const { return parameters + gradients + optimizer + activations + buffers; }
};

// Activation bytes one transformer layer keeps for the backward pass of one micro-batch.
double layer_activation_bytes(const ModelSpec& m, const PlanConfig& c, const MemoryOptions& o);

// [stage] bytes per rank. inflight: [stage] the most (micro-batch, chunk) pairs alive at once
// (SimResult::peak_inflight). Precondition: c.layers_per_piece has p · v entries.
std::vector<MemoryBreakdown> stage_memory(const ModelSpec& m, const PlanConfig& c,
                                          const MemoryOptions& o, const std::vector<int>& inflight);

}  // namespace strata
