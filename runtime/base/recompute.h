// recompute.h — which activations a layer keeps for its backward pass (train.recompute), a value
// of the parallel layout (parallel_layout.h) that the models act on.
//
// Thread-safety: pure functions.
#pragma once

#include <string>

namespace strata {

// train.recompute: kNone keeps every activation for the backward pass; kSelective recomputes the
// attention core (scores, softmax, weighted sum) from the saved q, k, v; kFull keeps only each
// layer's input and re-runs the layer's forward in the backward pass.
enum class Recompute { kNone, kSelective, kFull };
const char* to_string(Recompute r);
// "none", "selective", "full"; false on an unknown name.
bool parse_recompute(const std::string& s, Recompute* out);

}  // namespace strata
