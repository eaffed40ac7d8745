#include "runtime/base/recompute.h"

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

}  // namespace strata
