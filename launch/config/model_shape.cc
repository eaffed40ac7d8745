#include "launch/config/model_shape.h"

#include <filesystem>

#include "runtime/base/error.h"

namespace strata {

nlohmann::json model_shape_json(const ModelConfig& m, const ModelDescription& desc) {
  nlohmann::json j = desc.shape_json();
  j["arch"] = m.arch;
  return j;
}

void check_model_shape(const nlohmann::json& want, const nlohmann::json& saved,
                       const std::string& file, const std::string& what) {
  const std::string there = std::filesystem::path(file).filename().string();
  std::string diff;
  // Keys recorded since a later version, and what a record without them meant.
  static const nlohmann::json before = {{"decoder_sparse_step", 1},
                                        {"mlp_only_layers", nlohmann::json::array()}};
  for (const auto& [key, value] : want.items()) {
    const nlohmann::json got = saved.contains(key)    ? saved.at(key)
                               : before.contains(key) ? before.at(key)
                                                      : nlohmann::json();
    if (got == value) continue;
    diff += (diff.empty() ? "" : ", ") + key + " (" + there + " " + got.dump() + ", " + what + " " +
            value.dump() + ")";
  }
  if (!diff.empty())
    throw InputError(file, "model", "the model shape of the " + what + "; differing keys: " + diff);
}

}  // namespace strata
