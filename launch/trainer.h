// trainer.h — `strata train`: builds backend, data, model and optimizer from a Config and runs
// the training loop (gradient accumulation over micro-batches, clipping, AdamW, evaluation,
// metrics), or with --dry-run prints the model size, FLOPs and predicted memory. With
// checkpoint.dir it saves every checkpoint.interval iterations and resumes (checkpoint.resume)
// from a checkpoint saved under any layout (docs/checkpoints.md); model.init_from starts from a
// Hugging Face GPT-2 safetensors file.
//
// Thread-safety: one run per process.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/allocator.h"
#include "runtime/config.h"

namespace strata {

// The process world comes from init_world() (runtime/comm.h): without it, one process.
struct RunContext {
  bool verbose = true;  // progress lines and summary on world rank 0
  // Train this process alone (tensor = pipeline = data = 1) even inside a multi-rank job: the
  // single-process reference that equivalence tests compare every layout with.
  bool single_process = false;
};

struct TrainResult {
  int start_iteration = 0;         // iterations a resumed checkpoint had already done
  std::vector<double> losses;      // [iteration − start_iteration] mean training loss
  std::vector<double> grad_norms;  // [iteration] global norm before clipping
  std::vector<std::pair<int, double>> val_losses;  // (iteration, validation loss)
  std::vector<bool> skipped;       // [iteration] non-finite step not applied
  std::optional<double> loss_floor;  // best achievable loss (synthetic data)
  double tokens_per_s = 0;         // over the whole run, excluding evaluation
  double wall_s = 0;
  MemStats memory;                 // allocator figures at the end (peaks over the run)
  std::vector<float> final_params;  // the flat parameters at the end (this rank's shard)
  // Data-parallel overlap, last iteration: when each bucket's reduction started and when the
  // backward pass ended, in seconds from the start of the last micro-batch's backward.
  std::vector<double> bucket_start_s;
  double backward_end_s = 0;
  std::vector<double> bubbles;      // [iteration] measured compute-idle fraction of the step
  std::vector<double> step_s;       // [iteration] wall time of the step
  double theoretical_bubble = 0;    // the schedule's, with equal op times
  int pipeline_rank = 0;
};

// How parallel.layers_per_stage (or an even split) cuts num_layers into pipeline·virtual pieces;
// piece k = chunk·p + stage (Megatron's interleaving). InputError when it does not cover the
// model exactly.
std::vector<int> layers_per_piece(const Config& cfg);

// Runs training. Throws InputError for bad input found at start-up.
TrainResult run_training(const Config& cfg, const RunContext& ctx);

// Prints what --dry-run promises: parameters, FLOPs per iteration, memory per category.
void print_dry_run(const Config& cfg, const RunContext& ctx, std::ostream& os);

// The planner's prediction (partitioner/) for cfg on `world_size` ranks of this machine, taken as
// one node whose memory the ranks on it share: what --dry-run prints and the memory check uses.
nlohmann::json planner_prediction(const Config& cfg, int world_size);

// Best-effort physical memory of this machine in bytes (0 when unknown).
int64_t physical_memory_bytes();

}  // namespace strata
