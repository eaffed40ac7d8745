#include "models/description.h"

namespace strata {

int64_t piece_parameters(const ModelDescription& d, int tensor, int piece, int pieces, int layers) {
  int64_t n = int64_t{layers} * d.layer_parameters(tensor);
  if (piece == 0) n += d.embedding_parameters(tensor);
  if (piece == pieces - 1) {
    n += d.head_parameters(tensor);
    if (pieces > 1) n += d.tied_copy_parameters(tensor);
  }
  return n;
}

}  // namespace strata
