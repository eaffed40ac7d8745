// layout_fields.h — the one table of the parallel layout's fields (runtime/base/parallel_layout.h)
// and the one parser behind every place a layout is written down:
//   - the config's keys parallel.*, train.micro_batch_size and train.recompute (the config's key
//     tables take these rows from here, config_schema.cc);
//   - a plan entry of `strata train --plan` (launch/plan/plan_file.h);
//   - `strata plan --fix k=v,...` (parse_layout_fixes below).
// A value is checked by its field's row wherever it comes from; only the place an error names
// differs: the config key in the file that set it, "plans[0].tensor" in a plan file, "--fix
// tensor" on the command line (InputError: exit status 2). The planner never parses.
//
// Thread-safety: the table is built once, on first use; then read-only.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/base/parallel_layout.h"

namespace strata {

struct LayoutField {
  std::string name;        // as plans and --fix spell it ("tensor", "layers_per_stage")
  std::string config_key;  // the config's key: "parallel.tensor", "train.recompute"
  std::string meaning;     // one line; docs/config.md says it at more length
  // Reads `v` (as a config spells the key) into this field of `out`. Throws ValueError
  // (launch/config/json_values.h) for a value the field does not take.
  std::function<void(const nlohmann::json& v, ParallelLayout& out)> read;
  // This field of `l` as the config spells it (null where the config's key is null: data and
  // layers_per_stage left to the world size).
  std::function<nlohmann::json(const ParallelLayout& l)> write;
  // Pins this field of `to` to its value in `from`, unless `from` leaves it open (0, empty).
  std::function<void(const ParallelLayout& from, PinnedLayout& to)> pin;
};

// Every field, in the order the config documents its keys.
const std::vector<LayoutField>& layout_fields();
// The row of `name` (a LayoutField::name), or null.
const LayoutField* find_layout_field(const std::string& name);

// `strata plan --fix`'s "k=v,..." as pinned fields: each value read as --set reads one (JSON,
// else a string: tensor=8, schedule=interleaved, sequence_parallel=true,
// layers_per_stage=[3,3,2]) and checked by its field's row. InputError("<command line>",
// "--fix <k>", ...) on an unknown field or a bad value.
PinnedLayout parse_layout_fixes(const std::string& text);

}  // namespace strata
