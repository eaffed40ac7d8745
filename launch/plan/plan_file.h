// plan_file.h — `strata train --plan PLAN.json`: a plan of `strata plan --json` applied to a
// config. The plan's layout fields are read through the one table of layout fields
// (launch/config/layout_fields.h), as the config's own keys and `strata plan --fix` are.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "runtime/base/config.h"

namespace strata {

// cfg with its parallel layout (parallel.*, train.micro_batch_size, train.recompute) taken from
// `plan`: a plan entry, or a whole `strata plan --json` document (its first plan). The plan must
// be for cfg's model and global batch: its "model" keys, its "global_batch_size" and its
// micro_batch_size × num_microbatches × data equal the config's, its layers_per_stage sums to
// model.num_layers. The resulting layout passes the config's own checks. `plan_file` names the
// file in errors: InputError(plan_file, "plans[0].tensor", ...) when malformed, naming the field
// and both values when it does not match.
Config apply_plan(const Config& cfg, const nlohmann::json& plan,
                  const std::string& plan_file = "<plan>");

}  // namespace strata
