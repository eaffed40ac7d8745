// trainer.h — `strata train`: the flow of a training run. The layout is computed once from the
// config (run_layout.h); the model is built through its architecture's registry entry
// (models/registry.h) for this stage's pieces; the pipeline stage (pipeline_stage.h) runs the
// schedule's instructions through the executor; checkpointing.h resumes, starts from Hugging
// Face weights and saves; reporting.h prints and writes metrics and the trace; dry_run.h is
// --dry-run and the start-up memory check. docs/architecture.md draws the picture.
//
// One loop runs the training as instruction lists: a batch each for a schedule that flushes, for
// 2bw (which never does: schedules/schedule.h's flushes_every_batch) a stretch of batches up to
// the next checkpoint or the end; checkpoints, signals and evaluation happen between lists.
//
// Thread-safety: one run per process.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launch/train/dry_run.h"
#include "models/model.h"
#include "runtime/base/config.h"
#include "runtime/memory/allocator.h"

namespace strata {

// The process world comes from init_world() (runtime/comm/comm.h): without it, one process.
struct RunContext {
  bool verbose = true;  // progress lines and summary on world rank 0
  // Train this process alone (tensor = pipeline = data = 1) even inside a multi-rank job: the
  // single-process reference that equivalence tests compare every layout with.
  bool single_process = false;
};

struct TrainResult {
  int start_iteration = 0;  // iterations a resumed checkpoint had already done
  // SIGTERM / SIGUSR1 (stop_request.h): the signal that stopped the run after iteration
  // stopped_at (its checkpoint saved when checkpoint.dir is set); 0: it ran to the end.
  int stopped_by_signal = 0;
  int stopped_at = 0;
  std::vector<double> losses;      // [iteration − start_iteration] mean training loss
  std::vector<double> grad_norms;  // [iteration] global norm before clipping
  // A mixture of experts: [iteration] its balancing term (aux_loss) and worst load (expert_load),
  // as logged; empty for a dense model.
  std::vector<double> aux_losses, expert_loads;
  std::vector<std::pair<int, double>> val_losses;             // (iteration, validation loss)
  std::vector<std::pair<int, std::vector<int32_t>>> samples;  // (iteration, log.sample_* ids)
  std::vector<bool> skipped;         // [iteration] non-finite step not applied
  std::optional<double> loss_floor;  // best achievable loss (synthetic data)
  double tokens_per_s = 0;           // over the whole run, excluding evaluation
  double wall_s = 0;
  MemStats memory;                  // allocator figures at the end (peaks over the run)
  std::vector<float> final_params;  // the flat parameters at the end (this rank's shard)
  // Data-parallel overlap, last iteration: when each bucket's reduction started and when the
  // backward pass ended, in seconds from the start of the last micro-batch's backward.
  std::vector<double> bucket_start_s;
  double backward_end_s = 0;
  std::vector<double> bubbles;      // [iteration] measured compute-idle fraction of the step
  std::vector<double> step_s;       // [iteration] wall time of the step
  std::vector<double> step_wait_s;  // [iteration] this rank's wait at the step for other ranks
  double theoretical_bubble = 0;    // the schedule's, with equal op times
  int pipeline_rank = 0;
  std::vector<int> layers_per_piece;  // [piece] the split the run used (piece = chunk·p + stage)
  std::vector<ModelPiece> pieces;     // [chunk] what this rank's model held
  // Logs a write failed on (rank 0: "log.metrics <path>", "log.trace <path>"): `strata train`
  // then exits with status 3.
  std::vector<std::string> incomplete_logs;
  // Checkpoint saves, [save]: how long each held the training thread (copy to host memory,
  // writing unless checkpoint.async, publishing), and how long its shard write took.
  std::vector<double> save_stall_s;
  std::vector<double> save_write_s;
  std::vector<int> save_published_at;  // the iteration after which each save was published
};

// Runs training. Throws InputError for bad input found at start-up.
TrainResult run_training(const Config& cfg, const RunContext& ctx);

}  // namespace strata
