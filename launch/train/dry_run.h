// dry_run.h — what `strata train --dry-run` promises, and the start-up memory check: the model's
// size and FLOPs, the layer split, and the planner's memory prediction per pipeline stage
// (partitioner/), for the config as it stands on this job's ranks.
//
// Thread-safety: one call at a time.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "launch/train/run_layout.h"
#include "runtime/base/config.h"

namespace strata {

struct RunContext;  // trainer.h

// The cluster a cuda config's --dry-run --world predicts for when no --cluster is given.
constexpr const char* kDefaultGpuCluster = "dgx-h100";

// Prints parameters, FLOPs per iteration, the layout and split, memory per category and stage
// and the rank table, for this job's world; a run that would not fit this machine (the start-up
// memory check, CPU) is said in a line, not refused. Rank 0 prints.
void print_dry_run(const Config& cfg, const RunContext& ctx, std::ostream& os);

// The config's prediction on `world_size` ranks of a cluster, in words: iteration time and its
// parts, tokens/s, MFU, memory against the device's; then, when `strata plan`'s search finds a
// faster layout that fits (or the config's does not fit), that layout and how much faster it is.
// The cluster: `cluster_arg` (a preset or file), else kDefaultGpuCluster for a cuda config, else
// this machine shared by the ranks. InputError for a world that is not whole nodes of it.
void print_cluster_prediction(const Config& cfg, int world_size, const std::string& cluster_arg,
                              std::ostream& os);

// `strata train --dry-run --world N`: what print_dry_run says (but the rank table) for a world of
// N ranks that need not exist, from one process, then print_cluster_prediction. Nothing is
// allocated, so any model size works.
void print_world_dry_run(const Config& cfg, int world_size, const std::string& cluster_arg,
                         std::ostream& os);

// The planner's prediction (partitioner/) for a run's layout on its ranks of this machine, taken
// as one node whose memory the ranks on it share: what --dry-run prints and the memory check
// uses. The second form resolves cfg's layout on `world_size` ranks first.
nlohmann::json planner_prediction(const RunLayout& run);
nlohmann::json planner_prediction(const Config& cfg, int world_size);

// Why run's predicted peak does not fit the memory its ranks share ("" when it does): see
// check_fits_in_memory.
std::string memory_shortfall(const RunLayout& run, int64_t device_bytes);

// Refuses, before the model is allocated, a run whose predicted peak (the largest stage's) does
// not fit in the memory its ranks share: the host's for the CPU (a tenth left to the OS and the
// data), the GPU's for CUDA (ranks per device). device_bytes: the GPU's memory
// (Backend::device_memory_bytes), 0 for the host's. InputError naming the model.
void check_fits_in_memory(const RunLayout& run, int64_t device_bytes);

// Best-effort physical memory of this machine in bytes (0 when unknown).
int64_t physical_memory_bytes();

}  // namespace strata
