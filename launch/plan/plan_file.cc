#include "launch/plan/plan_file.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/config/json_values.h"
#include "launch/config/layout_fields.h"
#include "launch/config/model_shape.h"
#include "models/registry.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

using json = nlohmann::json;
using std::to_string;

// A plan chooses the layout of one model and one global batch: applied to another it would
// train something else than the config says (its layers, its batch), so those must match.
void check_plan_is_for(const Config& cfg, const json& doc, const std::string& file) {
  if (!doc.is_object()) return;
  if (doc.contains("model")) {
    const json& planned = doc["model"];
    if (!planned.is_object()) throw InputError(file, "model", "an object (the plan's model)");
    const std::unique_ptr<ModelDescription> desc = describe_model(cfg.model);
    const json shape = model_shape_json(cfg.model, *desc);
    for (const auto& [key, want] : shape.items()) {
      const auto got = planned.find(key);
      if (got == planned.end() || *got != want) {
        throw InputError(file, "model." + key,
                         "the config's model." + key + " " + want.dump() +
                             " (a plan is made for one model), got " +
                             (got == planned.end() ? std::string("none") : got->dump()));
      }
    }
  }
  if (doc.contains("global_batch_size")) {
    const json& g = doc["global_batch_size"];
    if (!g.is_number_integer() || g.get<int64_t>() != cfg.train.global_batch_size) {
      throw InputError(file, "global_batch_size",
                       "the config's train.global_batch_size " +
                           to_string(cfg.train.global_batch_size) + ", got " + g.dump());
    }
  }
}

// The plan entry of `doc` (a plan, or a whole document's first plan) and how errors name its
// fields ("plans[0]." in a document).
std::pair<const json*, std::string> plan_entry(const json& doc, const std::string& file) {
  if (doc.is_object() && doc.contains("plans")) {
    if (!doc["plans"].is_array() || doc["plans"].empty()) {
      throw InputError(file, "plans", "a non-empty array of plans (no plan fitted?)");
    }
    if (!doc["plans"][0].is_object()) throw InputError(file, "plans[0]", "a plan object");
    return {&doc["plans"][0], "plans[0]."};
  }
  if (!doc.is_object()) throw InputError(file, "", "a plan object");
  return {&doc, ""};
}

// Layout fields plans written before the planner recorded them lack: a plan without them keeps
// the config's value (1).
bool planner_omits(const std::string& field) {
  return field == "context" || field == "expert";
}

// A plan's layers_per_stage, [stage][chunk], as the layout's pieces (chunk · pipeline + stage),
// covering the config's num_layers exactly.
std::vector<int> plan_pieces(const json& l, const ParallelLayout& layout, int num_layers,
                             const std::string& file, const std::string& w) {
  const int pipeline = layout.pipeline, virtual_stages = layout.virtual_stages;
  if (!l.is_array() || static_cast<int64_t>(l.size()) != pipeline) {
    throw InputError(file, w, "an array of " + to_string(pipeline) + " stages");
  }
  for (int s = 0; s < pipeline; ++s) {
    const json& row = l[static_cast<size_t>(s)];
    if (!row.is_array() || static_cast<int64_t>(row.size()) != virtual_stages) {
      throw InputError(file, w + "[" + to_string(s) + "]",
                       "an array of " + to_string(virtual_stages) + " layer counts");
    }
  }
  std::vector<int> pieces(static_cast<size_t>(layout.pieces()));
  int64_t sum = 0;
  for (int s = 0; s < pipeline; ++s) {
    for (int ch = 0; ch < virtual_stages; ++ch) {
      const json& n = l[static_cast<size_t>(s)][static_cast<size_t>(ch)];
      const std::string at = w + "[" + to_string(s) + "][" + to_string(ch) + "]";
      int count = 0;
      try {
        count = int_value(n, 1);
      } catch (const ValueError& e) {
        throw InputError(file, at, e.what());
      }
      pieces[static_cast<size_t>(ch) * static_cast<size_t>(pipeline) + static_cast<size_t>(s)] =
          count;
      sum += count;
    }
  }
  if (sum != num_layers) {
    throw InputError(file, w,
                     "layer counts summing to the config's model.num_layers " +
                         to_string(num_layers) + " (every layer in exactly one stage), got " +
                         to_string(sum));
  }
  return pieces;
}

// Micro-batch size × micro-batches × data-parallel size is the global batch: the config's.
void check_batch(const json& plan, const ParallelLayout& l, int global_batch,
                 const std::string& file, const std::string& prefix) {
  if (!plan.contains("num_microbatches") || l.data == 0) return;
  int m = 0;
  try {
    m = int_value(plan["num_microbatches"], 1);
  } catch (const ValueError& e) {
    throw InputError(file, prefix + "num_microbatches", e.what());
  }
  const int64_t global = int64_t{l.micro_batch_size} * m * l.data;
  if (global != global_batch) {
    throw InputError(file, prefix + "num_microbatches",
                     "micro_batch_size " + to_string(l.micro_batch_size) + " × num_microbatches " +
                         to_string(m) + " × data " + to_string(l.data) +
                         " = the config's train.global_batch_size " + to_string(global_batch) +
                         ", got " + to_string(global));
  }
}

}  // namespace

Config apply_plan(const Config& cfg, const json& doc, const std::string& file) {
  check_plan_is_for(cfg, doc, file);
  const auto [plan, prefix] = plan_entry(doc, file);
  ParallelLayout l = cfg.layout;
  for (const LayoutField& f : layout_fields()) {
    if (f.name == "layers_per_stage") continue;  // in the plan's own form, below
    const bool given = plan->contains(f.name);
    if (!given && planner_omits(f.name)) continue;
    try {
      f.read(given ? (*plan)[f.name] : json(), l);
    } catch (const ValueError& e) {
      throw InputError(file, prefix + f.name, e.what());
    }
  }
  l.layers_per_piece.clear();  // null: the even split
  if (plan->contains("layers_per_stage") && !(*plan)["layers_per_stage"].is_null()) {
    l.layers_per_piece = plan_pieces((*plan)["layers_per_stage"], l, cfg.model.num_layers, file,
                                     prefix + "layers_per_stage");
  }
  check_batch(*plan, l, cfg.train.global_batch_size, file, prefix);
  // The layout is then checked as if the config had said it, against the config's other keys.
  json layer = json::object();
  for (const LayoutField& f : layout_fields()) {
    const size_t dot = f.config_key.find('.');
    layer[f.config_key.substr(0, dot)][f.config_key.substr(dot + 1)] = f.write(l);
  }
  return config_with_layer(cfg, layer, file);
}

}  // namespace strata
