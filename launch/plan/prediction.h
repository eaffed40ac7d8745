// prediction.h — the planner's view of a config (partitioner/): the layout a config runs as a
// planner's point, the prediction `strata train --dry-run` prints and the start-up memory check
// compares with the machine, and the memory options `strata plan` and the prediction share. Both
// `strata train` and `strata plan` use it, so it belongs to neither command.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "partitioner/cluster.h"
#include "partitioner/memory_model.h"
#include "runtime/base/config.h"

namespace strata {

// What the planner's memory model assumes of the runtime. cpu: the CPU runtime (also for bf16,
// which it emulates: unfused attention keeps the probabilities, per-thread attention scratch),
// else a GPU (flash attention; the CUDA context and cuBLASLt's workspace held back). bucket_mb:
// parallel.bucket_mb.
MemoryOptions memory_options(const std::string& precision, double bucket_mb, int threads, bool cpu);

// The planner's prediction for cfg as it stands on `world_size` ranks of `cluster` (a plan
// entry of DESIGN.md's schema plus "model_flops" and "hardware_flops" per iteration). fp32
// predicts the CPU runtime (attention probabilities kept, attention scratch per thread).
// Throws InputError when the layout does not fit the world size.
nlohmann::json predict_for_config(const Config& cfg, int world_size, const Cluster& cluster);

// The config's parallel layout as the planner's point: sizes, the schedule and recompute parsed
// once into their enums, and the layer split training runs (partitioner/layer_split.h).
// num_microbatches is left for the planner to derive. Precondition: cfg passed
// validate_for_world(world_size).
PlanConfig plan_config_for(const Config& cfg, int world_size);

}  // namespace strata
