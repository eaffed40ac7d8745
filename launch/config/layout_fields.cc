#include "launch/config/layout_fields.h"

#include <algorithm>
#include <utility>

#include "launch/config/json_values.h"
#include "runtime/base/error.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace {

using json = nlohmann::json;

const char kCommandLine[] = "<command line>";

// A row: `get` finds the field in a ParallelLayout and in a PinnedLayout alike (a generic
// lambda, [](auto& l) -> auto& { return l.tensor; }: both types name their fields the same);
// `read` checks a JSON value and returns the field's value; `write` is the config's JSON of the
// value; `open` says whether a value leaves the field to whoever resolves the layout.
template <class Get, class Read, class Write, class Open>
LayoutField row(const char* name, const char* config_key, const char* meaning, Get get, Read read,
                Write write, Open open) {
  LayoutField f;
  f.name = name;
  f.config_key = config_key;
  f.meaning = meaning;
  f.read = [get, read](const json& v, ParallelLayout& out) { get(out) = read(v); };
  f.write = [get, write](const ParallelLayout& l) { return write(get(l)); };
  f.pin = [get, open](const ParallelLayout& from, PinnedLayout& to) {
    if (!open(get(from))) get(to) = get(from);
  };
  return f;
}

// The kinds of field, each a (read, write, open) for row().
const auto kAsJson = [](const auto& v) { return json(v); };
const auto kNeverOpen = [](const auto&) { return false; };

template <class Get>
LayoutField positive(const char* name, const char* key, const char* meaning, Get get) {
  return row(
      name, key, meaning, get, [](const json& v) { return int_value(v, 1); }, kAsJson, kNeverOpen);
}

template <class Get>
LayoutField boolean(const char* name, const char* key, const char* meaning, Get get) {
  return row(name, key, meaning, get, bool_value, kAsJson, kNeverOpen);
}

// A JSON value for the names of an enum: to_string(E) ↔ the names, in `values`' order.
template <class E, class Get>
LayoutField named(const char* name, const char* key, const char* meaning, Get get,
                  std::vector<E> values) {
  std::vector<std::string> names;
  for (E e : values) names.push_back(to_string(e));
  return row(
      name, key, meaning, get,
      [values, names](const json& v) {
        const std::string s = one_of_value(v, names);  // one of `names`, else a ValueError
        return values[static_cast<size_t>(std::find(names.begin(), names.end(), s) -
                                          names.begin())];
      },
      [](E e) { return json(to_string(e)); }, kNeverOpen);
}

const std::vector<LayoutField>& table() {
  static const std::vector<LayoutField> fields = [] {
    const auto tensor = [](auto& l) -> auto& {
      return l.tensor;
    };
    const auto context = [](auto& l) -> auto& {
      return l.context;
    };
    const auto expert = [](auto& l) -> auto& {
      return l.expert;
    };
    const auto pipeline = [](auto& l) -> auto& {
      return l.pipeline;
    };
    const auto data = [](auto& l) -> auto& {
      return l.data;
    };
    const auto virtual_stages = [](auto& l) -> auto& {
      return l.virtual_stages;
    };
    const auto schedule = [](auto& l) -> auto& {
      return l.schedule;
    };
    const auto layers = [](auto& l) -> auto& {
      return l.layers_per_piece;
    };
    const auto sequence_parallel = [](auto& l) -> auto& {
      return l.sequence_parallel;
    };
    const auto distributed_optimizer = [](auto& l) -> auto& {
      return l.distributed_optimizer;
    };
    const auto micro_batch_size = [](auto& l) -> auto& {
      return l.micro_batch_size;
    };
    const auto recompute = [](auto& l) -> auto& {
      return l.recompute;
    };
    return std::vector<LayoutField>{
        positive("tensor", "parallel.tensor", "tensor-parallel size t", tensor),
        positive("context", "parallel.context",
                 "ranks each sequence is split over (ring attention; 2·context divides seq_len)",
                 context),
        positive("expert", "parallel.expert",
                 "data ranks each MoE layer's experts are spread over (divides data and "
                 "num_experts)",
                 expert),
        positive("pipeline", "parallel.pipeline", "pipeline stages p", pipeline),
        // 0 in the layout is the config's null: what the world leaves after t·c·p.
        row(
            "data", "parallel.data", "data-parallel size d; null: world size / (t·c·p)", data,
            [](const json& v) { return optional_int_value(v, 1).value_or(0); },
            [](int d) { return d > 0 ? json(d) : json(nullptr); }, [](int d) { return d == 0; }),
        positive("virtual_stages", "parallel.virtual_stages",
                 "model chunks per stage (interleaved schedule only)", virtual_stages),
        named("schedule", "parallel.schedule", "the pipeline schedule", schedule,
              std::vector<ScheduleKind>{ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                                        ScheduleKind::kInterleaved, ScheduleKind::kTwoBW,
                                        ScheduleKind::kZeroBubbleH1}),
        // Empty in the layout is the config's null: the even split.
        row(
            "layers_per_stage", "parallel.layers_per_stage",
            "explicit split: p·v entries summing to model.num_layers", layers,
            [](const json& v) {
              // Empty is the layout's "open" (null): [] must not pass for the even split.
              if (v.is_array() && v.empty())
                throw ValueError("expected a non-empty array of positive integers or null, got []");
              return optional_positive_array_value(v).value_or(std::vector<int>());
            },
            [](const std::vector<int>& s) { return s.empty() ? json(nullptr) : json(s); },
            [](const std::vector<int>& s) { return s.empty(); }),
        boolean("sequence_parallel", "parallel.sequence_parallel",
                "shard LayerNorm/dropout regions along the sequence", sequence_parallel),
        boolean("distributed_optimizer", "parallel.distributed_optimizer", "ZeRO-1",
                distributed_optimizer),
        positive("micro_batch_size", "train.micro_batch_size", "sequences per micro-batch",
                 micro_batch_size),
        named("recompute", "train.recompute", "activation recomputation", recompute,
              std::vector<Recompute>{Recompute::kNone, Recompute::kSelective, Recompute::kFull}),
    };
  }();
  return fields;
}

// "a=1,b=[2,3],c=x" at its commas outside brackets.
std::vector<std::string> split_items(const std::string& text) {
  std::vector<std::string> items(1);
  int depth = 0;
  for (char ch : text) {
    if (ch == '[' || ch == '{') ++depth;
    if ((ch == ']' || ch == '}') && depth > 0) --depth;
    if (ch == ',' && depth == 0) {
      items.emplace_back();
    } else {
      items.back() += ch;
    }
  }
  return items;
}

}  // namespace

const std::vector<LayoutField>& layout_fields() {
  return table();
}

const LayoutField* find_layout_field(const std::string& name) {
  for (const LayoutField& f : table())
    if (f.name == name) return &f;
  return nullptr;
}

PinnedLayout parse_layout_fixes(const std::string& text) {
  PinnedLayout pins;
  for (const std::string& item : split_items(text)) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw InputError(kCommandLine, "--fix", "key=value pairs, got '" + item + "'");
    const std::string key = item.substr(0, eq), text_value = item.substr(eq + 1);
    const std::string where = "--fix " + key;
    const LayoutField* f = find_layout_field(key);
    if (f == nullptr) {
      std::vector<std::string> names;
      for (const LayoutField& g : table()) names.push_back(g.name);
      throw InputError(kCommandLine, where, "a plan field: " + join_list(names, ", "));
    }
    json value;
    try {
      value = parse_json_if_json(text_value, kCommandLine).value_or(json(text_value));
    } catch (const InputError& e) {
      throw InputError(kCommandLine, where, e.expected());
    }
    ParallelLayout read;
    try {
      f->read(value, read);
    } catch (const ValueError& e) {
      throw InputError(kCommandLine, where, e.what());
    }
    f->pin(read, pins);
  }
  return pins;
}

}  // namespace strata
