#include "models/model.h"

#include <stdexcept>

namespace strata {

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "none";
}

bool parse_recompute(const std::string& s, Recompute* out) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (s == to_string(r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

std::vector<ModelPiece> whole_model(int num_layers) {
  return {ModelPiece{0, num_layers, true, true}};
}

std::unique_ptr<GenerationState> Model::start_generation(int, int64_t) {
  throw std::runtime_error("this model does not generate");
}

std::vector<float> Model::decode(GenerationState&, const std::vector<int32_t>&, int) {
  throw std::runtime_error("this model does not generate");
}

}  // namespace strata
