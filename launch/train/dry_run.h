// dry_run.h — what `strata train --dry-run` promises, and the start-up memory check: the model's
// size and FLOPs, the layer split, and the planner's memory prediction per pipeline stage
// (partitioner/), for the config as it stands on this job's ranks.
//
// Thread-safety: one call at a time.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>

#include "launch/train/run_layout.h"
#include "runtime/base/config.h"

namespace strata {

struct RunContext;  // trainer.h

// Prints parameters, FLOPs per iteration, the layout and split, memory per category and stage.
void print_dry_run(const Config& cfg, const RunContext& ctx, std::ostream& os);

// The planner's prediction (partitioner/) for a run's layout on its ranks of this machine, taken
// as one node whose memory the ranks on it share: what --dry-run prints and the memory check
// uses. The second form resolves cfg's layout on `world_size` ranks first.
nlohmann::json planner_prediction(const RunLayout& run);
nlohmann::json planner_prediction(const Config& cfg, int world_size);

// Refuses, before the model is allocated, a run whose predicted peak (the largest stage's) does
// not fit in the memory its ranks share: the host's for the CPU (a tenth left to the OS and the
// data), the GPU's for CUDA (ranks per device). device_bytes: the GPU's memory
// (Backend::device_memory_bytes), 0 for the host's. InputError naming the model.
void check_fits_in_memory(const RunLayout& run, int64_t device_bytes);

// Best-effort physical memory of this machine in bytes (0 when unknown).
int64_t physical_memory_bytes();

}  // namespace strata
