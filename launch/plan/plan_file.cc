#include "launch/plan/plan_file.h"

#include <climits>
#include <cstdint>
#include <memory>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/config/model_shape.h"
#include "models/registry.h"
#include "runtime/base/error.h"
#include "schedules/schedule.h"

namespace strata {

using nlohmann::json;

Config apply_plan(const Config& cfg, const json& plan_in, const std::string& file) {
  using std::to_string;
  // A plan chooses the layout of one model and one global batch: applied to another it would
  // train something else than the config says (its layers, its batch), so those must match.
  if (plan_in.is_object() && plan_in.contains("model")) {
    const json& planned = plan_in["model"];
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
  if (plan_in.is_object() && plan_in.contains("global_batch_size")) {
    const json& g = plan_in["global_batch_size"];
    if (!g.is_number_integer() || g.get<int64_t>() != cfg.train.global_batch_size) {
      throw InputError(file, "global_batch_size",
                       "the config's train.global_batch_size " +
                           to_string(cfg.train.global_batch_size) + ", got " + g.dump());
    }
  }
  std::string prefix;
  const json* plan = &plan_in;
  if (plan_in.is_object() && plan_in.contains("plans")) {
    if (!plan_in["plans"].is_array() || plan_in["plans"].empty()) {
      throw InputError(file, "plans", "a non-empty array of plans (no plan fitted?)");
    }
    plan = &plan_in["plans"][0];
    prefix = "plans[0].";
  }
  if (!plan->is_object()) throw InputError(file, prefix.empty() ? "" : "plans[0]", "a plan object");
  auto need_int = [&](const char* key) {
    const json* v = plan->contains(key) ? &(*plan)[key] : nullptr;
    if (!v || !v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > INT_MAX) {
      throw InputError(file, prefix + key, "a positive integer up to " + to_string(INT_MAX));
    }
    return v->get<int>();
  };
  auto need_str = [&](const char* key) {
    if (!plan->contains(key) || !(*plan)[key].is_string())
      throw InputError(file, prefix + key, "a string");
    return (*plan)[key].get<std::string>();
  };
  auto need_bool = [&](const char* key) {
    if (!plan->contains(key) || !(*plan)[key].is_boolean())
      throw InputError(file, prefix + key, "true or false");
    return (*plan)[key].get<bool>();
  };
  const int tensor = need_int("tensor"), pipeline = need_int("pipeline"), data = need_int("data");
  const int virtual_stages = need_int("virtual_stages");
  const std::string schedule = need_str("schedule");
  ScheduleKind k;
  if (!parse_schedule_kind(schedule, &k)) {
    throw InputError(file, prefix + "schedule", "gpipe, 1f1b, interleaved, 2bw or zb-h1");
  }
  const int micro = need_int("micro_batch_size");
  const std::string recompute = need_str("recompute");
  Recompute rk;
  if (!parse_recompute(recompute, &rk)) {
    throw InputError(file, prefix + "recompute", "none, selective or full");
  }
  // Micro-batch size × micro-batches × data-parallel size is the global batch: the config's.
  if (plan->contains("num_microbatches")) {
    const int m = need_int("num_microbatches");
    const int64_t global = int64_t{micro} * m * data;
    if (global != cfg.train.global_batch_size) {
      throw InputError(file, prefix + "num_microbatches",
                       "micro_batch_size " + to_string(micro) + " × num_microbatches " +
                           to_string(m) + " × data " + to_string(data) +
                           " = the config's train.global_batch_size " +
                           to_string(cfg.train.global_batch_size) + ", got " + to_string(global));
    }
  }
  json layout = {{"tensor", tensor},
                 {"pipeline", pipeline},
                 {"data", data},
                 {"virtual_stages", virtual_stages},
                 {"schedule", schedule},
                 {"sequence_parallel", need_bool("sequence_parallel")},
                 {"distributed_optimizer", need_bool("distributed_optimizer")},
                 {"layers_per_stage", nullptr}};
  if (plan->contains("layers_per_stage") && !(*plan)["layers_per_stage"].is_null()) {
    // [stage][chunk] in the plan; chunk-major (chunk · pipeline + stage) in the config.
    const json& l = (*plan)["layers_per_stage"];
    const std::string w = prefix + "layers_per_stage";
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
    std::vector<int> pieces(static_cast<size_t>(pipeline) * static_cast<size_t>(virtual_stages));
    int64_t sum = 0;
    for (int s = 0; s < pipeline; ++s) {
      for (int ch = 0; ch < virtual_stages; ++ch) {
        const json& n = l[static_cast<size_t>(s)][static_cast<size_t>(ch)];
        if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > INT_MAX) {
          throw InputError(file, w + "[" + to_string(s) + "][" + to_string(ch) + "]",
                           "a positive layer count");
        }
        pieces[static_cast<size_t>(ch) * static_cast<size_t>(pipeline) + static_cast<size_t>(s)] =
            n.get<int>();
        sum += n.get<int64_t>();
      }
    }
    if (sum != cfg.model.num_layers) {
      throw InputError(file, w,
                       "layer counts summing to the config's model.num_layers " +
                           to_string(cfg.model.num_layers) +
                           " (every layer in exactly one stage), got " + to_string(sum));
    }
    layout["layers_per_stage"] = pieces;
  }
  // The layout is then checked as if the config had said it, against the config's other keys.
  return config_with_layer(
      cfg,
      {{"parallel", layout}, {"train", {{"micro_batch_size", micro}, {"recompute", recompute}}}},
      file);
}

}  // namespace strata
