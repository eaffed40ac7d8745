// mlp.h — the tensor-parallel MLP: a column-parallel expansion to F hidden units (each rank F/t
// of them), an activation, then a row-parallel projection back to C that joins the residual
// stream.
//
// Activations:
//   kGelu   (GPT-2): fc (F, C) with bias; act = gelu(pre), GELU (tanh form) in the GEMM's
//           epilogue where the backend has one.
//   kGeluErf (BERT): the same with the exact GELU 0.5x(1 + erf(x/√2)).
//   kSwiGlu (Llama): fc is the fused [gate (F); up (F)] weight (2F, C), each block split over the
//           group, so a rank's pre is [gate_r | up_r] (B, S, 2F/t) and act = silu(gate_r) · up_r.
//
// Thread-safety: as the model.
#pragma once

#include <string>

#include "models/layers/linear.h"
#include "models/layers/parallel.h"

namespace strata {

enum class MlpActivation { kGelu, kGeluErf, kSwiGlu };

class MLP {
 public:
  struct Saved {
    Tensor pre;  // (B, S, F/t) before GELU, or (B, S, 2F/t) [gate | up]
    Tensor act;  // (B, S, F/t) the activation, the projection's input
  };

  MLP() = default;
  // fc_name, proj_name: the two projections' parameter prefixes.
  MLP(ParamLayout& layout, MlpActivation activation, const std::string& fc_name,
      const std::string& proj_name, int64_t C, int64_t F, LinearInit fc_init, LinearInit proj_init,
      bool bias);

  // residual + mlp(x), reduced over the group; x (B, S_local, C) the normalised input.
  Tensor forward(const LayerEnv& env, const Tensor& x, const Tensor& residual, Saved& s) const;
  // dresid: the gradient of the output (B, S_local, C). Returns the gradient of x, reduced over
  // the group (B, S_local, C).
  Tensor backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid, const Tensor& x,
                  const Saved& s) const;

  MlpActivation activation = MlpActivation::kGelu;
  ColumnParallelLinear fc;
  RowParallelLinear proj;
  int64_t hidden_local = 0;  // F / t
};

}  // namespace strata
