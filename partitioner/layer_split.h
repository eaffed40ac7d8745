// layer_split.h — how the layers of a model are cut into pipeline pieces: the one place that
// decides, for training, the start-up memory check, `--dry-run` and the planner.
//
// A layout of p stages with v chunks each cuts the model into p·v pieces; piece k = chunk·p +
// stage (Megatron's interleaving). layer_split() gives the split a run uses: the config's
// parallel.layers_per_stage when set (validated by the config parser to cover the model
// exactly), else the even split. `strata plan` searches splits (split_layers_dp) and writes the
// one it chose into its plan, so `strata train --plan` runs exactly what was predicted.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace strata {

// [piece] layers of a model of `num_layers` layers over `pieces` pieces: `explicit_split` when
// given, else split_layers_even.
std::vector<int> layer_split(int num_layers, int pieces,
                             const std::optional<std::vector<int>>& explicit_split);

// Every piece as equal as the layer count allows; the first L % pieces pieces take one more (the
// last piece also carries the head, the heaviest single part, so extra layers go to the front).
std::vector<int> split_layers_even(int layers, int pieces);

// Min-max split of layers with costs `layer_cost` into `pieces` contiguous pieces of at least
// one layer, the first piece also paying `first_extra` and the last `last_extra` (dynamic
// programming, O(pieces · L²)). Returns [piece] layer counts.
std::vector<int> split_layers_dp(const std::vector<double>& layer_cost, int pieces,
                                 double first_extra, double last_extra);

// "3 4 4 1": a split as the training banner and --dry-run print it.
std::string split_text(const std::vector<int>& split);

}  // namespace strata
