// norm.h — the normalisation over the hidden dimension that opens each sub-layer and ends the
// decoder (or closes each sub-layer of BERT's post-norm encoder): LayerNorm (weight and bias;
// GPT-2's eps 1e-5, BERT's model.layer_norm_eps) or RMSNorm (Llama: weight only,
// model.rms_norm_eps), its parameters replicated over the tensor group.
//
// With sequence parallelism each rank normalises its own sequence chunk, so its parameter
// gradients are partial sums over the group: they are summed once they are final (the last
// micro-batch's backward; norm gradients are never deferred to a zero-bubble W pass).
//
// Thread-safety: as the model.
#pragma once

#include <string>

#include "models/layers/parallel.h"
#include "models/layers/params.h"
#include "models/layers/work.h"

namespace strata {

enum class NormKind { kLayerNorm, kRMSNorm };

// Which normalisation, with which epsilon.
struct NormSpec {
  NormKind kind = NormKind::kLayerNorm;
  double eps = 1e-5;
};

class Norm {
 public:
  // What the forward keeps for the backward.
  struct Saved {
    Tensor out;   // (B, S_local, C)
    Tensor mean;  // (B, S_local) f32, LayerNorm only
    Tensor rstd;  // (B, S_local) f32
  };

  Norm() = default;
  // Declares `name`.weight (ones) and, for LayerNorm, `name`.bias (zeros), both of size C. eps:
  // added to the variance (LayerNorm) or the mean square (RMSNorm).
  Norm(ParamLayout& layout, NormKind kind, const std::string& name, int64_t C, double eps);
  Norm(ParamLayout& layout, const NormSpec& spec, const std::string& name, int64_t C)
      : Norm(layout, spec.kind, name, C, spec.eps) {}

  void forward(const LayerEnv& env, Saved& s, const Tensor& x) const;
  // dx += the gradient through the normalisation of x (the residual stream's gradient, which
  // sums over its branches); parameter gradients accumulate, summed over the tensor group with
  // sequence parallelism on the last micro-batch.
  void backward(const LayerEnv& env, const BackwardPass& pass, Tensor& dx, const Tensor& dout,
                const Tensor& x, const Saved& s) const;

  // The first and last of its parameters (weight; bias for LayerNorm), for gradient reports.
  ParamRef first() const { return weight; }
  ParamRef last() const { return bias.valid() ? bias : weight; }
  // f32 statistics the forward keeps per token (mean and rstd, or rstd).
  static int stats_per_token(NormKind kind) { return kind == NormKind::kLayerNorm ? 2 : 1; }
  // One micro-batch over the residual stream's rows: a read and a write of each element.
  static PartWork work(int64_t C, const WorkShape& s);
  // It keeps its output and its statistics.
  static LayerActivations activations(NormKind kind, int64_t C, const WorkShape& s);

  NormKind kind = NormKind::kLayerNorm;
  float eps = 1e-5f;
  ParamRef weight, bias;  // bias: LayerNorm only
};

}  // namespace strata
