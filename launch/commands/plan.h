// commands/plan.h — `strata plan`: search the parallel layouts of a model on a cluster and print
// the best plans with their predicted time and memory (partitioner/planner.h).
//
//   strata plan --model FILE|PRESET --cluster FILE|PRESET --global-batch-size B [--nodes N]
//               [--fix k=v,...] [--top K] [--json OUT] [--trace OUT] [--seq-len S]
//               [--precision bf16|fp32] [--profile PROFILE.json] [--help]
//
// Also the two hooks the trainer uses: the prediction `strata train --dry-run` prints for its
// own config, and applying a plan file to a config (`strata train --plan plan.json`).
//
// Thread-safety: one call at a time (writes stdout and files).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "partitioner/cluster.h"
#include "partitioner/memory_model.h"
#include "runtime/base/config.h"

namespace strata {

// Runs the command on its arguments (those after "plan"); returns the exit status. Throws
// InputError for bad arguments or files.
int cmd_plan(const std::vector<std::string>& args);

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

// cfg with parallel.* and train.micro_batch_size / recompute taken from `plan`: a plan entry, or
// a whole `strata plan --json` document (its first plan). The plan must be for cfg's model and
// global batch: its "model" keys, its "global_batch_size" and its micro_batch_size ×
// num_microbatches × data equal the config's, its layers_per_stage sums to model.num_layers.
// The resulting layout passes the config's own checks. `plan_file` names the file in errors:
// InputError(plan_file, "plans[0].tensor", ...) when malformed, naming the field and both values
// when it does not match.
Config apply_plan(const Config& cfg, const nlohmann::json& plan,
                  const std::string& plan_file = "<plan>");

}  // namespace strata
