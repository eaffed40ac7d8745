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
#include "models/layers/moe.h"
#include "models/layers/parallel.h"
#include "models/layers/work.h"

namespace strata {

enum class MlpActivation { kGelu, kGeluErf, kSwiGlu };

// The MLP of a block: its activation and width, or a mixture of SwiGLU experts (moe.experts >
// 0: models/layers/moe.h, which then replaces the dense MLP).
struct MlpSpec {
  MlpActivation activation = MlpActivation::kGelu;
  int64_t hidden = 0;  // F
  bool bias = true;    // biases on both projections
  MoeSpec moe;

  bool is_moe() const { return moe.experts > 0; }

  // Rows of the expansion: F, or [gate; up] with SwiGLU.
  int64_t fc_rows() const { return activation == MlpActivation::kSwiGlu ? 2 * hidden : hidden; }
};

class MLP {
 public:
  struct Saved {
    Tensor pre;  // (B, S, F/t) before GELU, or (B, S, 2F/t) [gate | up]
    Tensor act;  // (B, S, F/t) the activation, the projection's input
  };

  MLP() = default;
  // fc_name, proj_name: the two projections' parameter prefixes, for a hidden size C.
  MLP(ParamLayout& layout, const MlpSpec& spec, const std::string& fc_name,
      const std::string& proj_name, int64_t C, LinearInit fc_init, LinearInit proj_init);

  // residual + mlp(x), reduced over the group; x (B, S_local, C) the normalised input.
  Tensor forward(const LayerEnv& env, const Tensor& x, const Tensor& residual, Saved& s) const;
  // dresid: the gradient of the output (B, S_local, C). Returns the gradient of x, reduced over
  // the group (B, S_local, C).
  Tensor backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid, const Tensor& x,
                  const Saved& s) const;

  // ---- self-description (models/layers/work.h), for a hidden size C ----
  // The two projections and the activation (GELU: a read and a write; SwiGLU: two reads, one
  // write).
  static PartWork work(int64_t C, const MlpSpec& m, const WorkShape& s);
  // Keeps the expansion before and after the activation; its backward holds d(pre) and
  // d(activation) (a fused GPU GELU never holds the latter: margin for when cuBLASLt declines)
  // and with sp the gathered input.
  static LayerActivations activations(int64_t C, const MlpSpec& m, const WorkShape& s);
  static double flops_per_token(int64_t C, const MlpSpec& m);  // forward, 2 per multiply-add
  static std::string split_reason(const MlpSpec& m, int t);    // "" when t divides F

  MlpActivation activation = MlpActivation::kGelu;
  ColumnParallelLinear fc;
  RowParallelLinear proj;
  int64_t hidden_local = 0;  // F / t
};

}  // namespace strata
