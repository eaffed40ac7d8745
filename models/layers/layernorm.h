// layernorm.h — LayerNorm over the hidden dimension (eps 1e-5, GPT-2's), weight and bias
// replicated over the tensor group.
//
// With sequence parallelism each rank normalises its own sequence chunk, so its weight and bias
// gradients are partial sums over the group: they are summed once they are final (the last
// micro-batch's backward; LayerNorm gradients are never deferred to a zero-bubble W pass).
//
// Thread-safety: as the model.
#pragma once

#include <string>

#include "models/layers/parallel.h"
#include "models/layers/params.h"

namespace strata {

class LayerNorm {
 public:
  // What the forward keeps for the backward.
  struct Saved {
    Tensor out;   // (B, S_local, C)
    Tensor mean;  // (B, S_local) f32
    Tensor rstd;  // (B, S_local) f32
  };

  LayerNorm() = default;
  // Declares `name`.weight (ones) and `name`.bias (zeros) of size C.
  LayerNorm(ParamLayout& layout, const std::string& name, int64_t C);

  void forward(const LayerEnv& env, Saved& s, const Tensor& x) const;
  // dx += the gradient through the normalisation of x (the residual stream's gradient, which
  // sums over its branches); weight and bias gradients accumulate, summed over the tensor group
  // with sequence parallelism on the last micro-batch.
  void backward(const LayerEnv& env, const BackwardPass& pass, Tensor& dx, const Tensor& dout,
                const Tensor& x, const Saved& s) const;

  ParamRef weight, bias;
};

}  // namespace strata
