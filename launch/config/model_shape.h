// model_shape.h — the model keys that fix parameter shapes (the architecture and its
// description's shape keys), as a checkpoint's run_state.json and a plan record them: a
// checkpoint loads, and a plan applies, only where they are the same.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "models/description.h"
#include "runtime/base/config.h"

namespace strata {

nlohmann::json model_shape_json(const ModelConfig& m, const ModelDescription& desc);
// InputError(file, "model", …) naming every key of `want` whose value `saved` (read from `file`)
// does not have, with both values; `what` names where `want` came from ("config"). A key that
// shape records gained later (Qwen3-MoE's decoder_sparse_step and mlp_only_layers) is, where
// `saved` lacks it, the value every model had before: 1 and [].
void check_model_shape(const nlohmann::json& want, const nlohmann::json& saved,
                       const std::string& file, const std::string& what);

}  // namespace strata
