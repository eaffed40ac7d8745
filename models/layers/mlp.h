// mlp.h — the tensor-parallel GELU MLP: a column-parallel expansion to F (each rank F/t of the
// hidden units) with GELU (tanh form) in its epilogue, then a row-parallel projection back to C
// that joins the residual stream.
//
// Thread-safety: as the model.
#pragma once

#include <string>

#include "models/layers/linear.h"
#include "models/layers/parallel.h"

namespace strata {

class GeluMLP {
 public:
  struct Saved {
    Tensor pre;  // (B, S, F/t) the expansion's output, before GELU
    Tensor act;  // (B, S, F/t) gelu(pre), the projection's input
  };

  GeluMLP() = default;
  GeluMLP(ParamLayout& layout, const std::string& fc_name, const std::string& proj_name, int64_t C,
          int64_t F, LinearInit fc_init, LinearInit proj_init, bool bias);

  // residual + mlp(x), reduced over the group; x (B, S_local, C) the normalised input.
  Tensor forward(const LayerEnv& env, const Tensor& x, const Tensor& residual, Saved& s) const;
  // dresid: the gradient of the output (B, S_local, C). Returns the gradient of x, reduced over
  // the group (B, S_local, C).
  Tensor backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid, const Tensor& x,
                  const Saved& s) const;

  ColumnParallelLinear fc;
  RowParallelLinear proj;
};

}  // namespace strata
