#include "models/layers/linear.h"

namespace strata {

void linear_backward(const LayerEnv& env, BackwardPass& pass, Tensor* dinp, ParamRef weight,
                     ParamRef bias, const Tensor& dout, const Tensor& inp,
                     bool dout_changes_later) {
  if (pass.defer_weight_grads) {
    if (dinp) env.be.matmul_backward_input(*dinp, dout, env.w(weight));
    Tensor kept = dout;
    if (dout_changes_later) {
      kept = env.act(dout.shape());
      env.be.copy(kept, dout);
    }
    pass.deferred->push_back({weight, bias, kept, inp});
    return;
  }
  Tensor dw = env.g(weight);
  Tensor db = bias.valid() ? env.g(bias) : Tensor();
  env.be.matmul_backward(dinp, dw, bias.valid() ? &db : nullptr, dout, inp, env.w(weight));
}

ColumnParallelLinear::ColumnParallelLinear(ParamLayout& layout, const std::string& name, int64_t in,
                                           int64_t out, LinearInit init, bool with_bias,
                                           std::vector<int64_t> row_blocks) {
  const ParamSplit split = row_blocks.empty() ? ParamSplit::kRows : ParamSplit::kBlockRows;
  weight = layout.add(
      {name + ".weight", {out, in}, split, ParamInit::kNormal, init.std, -1, true, row_blocks});
  if (with_bias)
    bias = layout.add({name + ".bias", {out}, split, ParamInit::kZeros, 0, -1, false, row_blocks});
  out_local = out / layout.tp();
}

ColumnParallelLinear ColumnParallelLinear::tied_to(ParamRef weight, int64_t out_local) {
  ColumnParallelLinear l;
  l.weight = weight;
  l.out_local = out_local;
  return l;
}

Tensor ColumnParallelLinear::forward(const LayerEnv& env, const Tensor& x) const {
  const Tensor x_full = env.tp.full_sequence(x);
  Tensor y = env.act({x_full.size(0), x_full.size(1), out_local});
  const Tensor b = bias.valid() ? env.w(bias) : Tensor();
  env.be.matmul_forward(y, x_full, env.w(weight), bias.valid() ? &b : nullptr);
  return y;
}

void ColumnParallelLinear::forward_gelu(const LayerEnv& env, const Tensor& x, Tensor* pre,
                                        Tensor* out, GeluKind kind) const {
  const Tensor x_full = env.tp.full_sequence(x);
  *pre = env.act({x_full.size(0), x_full.size(1), out_local});
  *out = env.act({x_full.size(0), x_full.size(1), out_local});
  env.be.matmul_gelu_forward(*pre, *out, x_full, env.w(weight), env.w(bias), kind);
}

Tensor ColumnParallelLinear::backward(const LayerEnv& env, BackwardPass& pass, Tensor dout,
                                      const Tensor& x) const {
  const int64_t B = x.size(0),
                S = env.tp.sequence_parallel() ? x.size(1) * env.tp.size() : x.size(1);
  Tensor dx_full = env.act({B, S, x.size(2)});  // partial over the group
  linear_backward(env, pass, &dx_full, weight, bias, dout, env.tp.full_sequence(x));
  dout = Tensor();
  return env.tp.reduce(dx_full);
}

PartWork ColumnParallelLinear::work(int64_t in, int64_t out, const WorkShape& s) {
  PartWork w;
  w.gemms.push_back({s.tokens(), static_cast<double>(out) / s.t, static_cast<double>(in)});
  const double x = s.tokens() * static_cast<double>(in);  // the full-sequence input
  if (s.sp) {
    w.collectives_fwd.push_back({CommGroup::kTensor, CollectiveKind::kAllGather, x});
    w.collectives_bwd.push_back({CommGroup::kTensor, CollectiveKind::kAllGather, x});
    w.collectives_bwd.push_back({CommGroup::kTensor, CollectiveKind::kReduceScatter, x});
  } else if (s.t > 1) {
    w.collectives_bwd.push_back({CommGroup::kTensor, CollectiveKind::kAllReduce, x});
  }
  return w;
}

RowParallelLinear::RowParallelLinear(ParamLayout& layout, const std::string& name, int64_t in,
                                     int64_t out, LinearInit init, bool with_bias) {
  weight = layout.add(
      {name + ".weight", {out, in}, ParamSplit::kCols, ParamInit::kNormal, init.std, -1, true, {}});
  if (with_bias) {
    bias = layout.add(
        {name + ".bias", {out}, ParamSplit::kReplicated, ParamInit::kZeros, 0, -1, false, {}});
  }
}

// With t = 1 the residual rides in the GEMM (matmul_residual_forward). With t > 1 it joins after
// the all-reduce (or reduce-scatter, with sp): added to rank 0's partial instead, a bf16
// all-reduce would round a residual-sized sum at each of its t − 1 steps.
Tensor RowParallelLinear::forward_residual(const LayerEnv& env, const Tensor& x,
                                           const Tensor& residual) const {
  const int64_t B = x.size(0), S = x.size(1), C = residual.size(2);
  Tensor out = env.act({B, S, C});  // partial sum over the group
  const Tensor w = env.w(weight);
  const Tensor b = bias.valid() ? env.w(bias) : Tensor();
  const Tensor* bp = bias.valid() ? &b : nullptr;
  if (env.tp.size() == 1) {
    env.be.matmul_residual_forward(out, x, w, bp, residual);
    return out;
  }
  env.be.matmul_forward(out, x, w, env.tp.rank() == 0 ? bp : nullptr);  // the bias added once
  Tensor sum = env.tp.reduce(out);
  env.be.add_inplace(sum, residual);
  return sum;
}

PartWork RowParallelLinear::work(int64_t in, int64_t out, const WorkShape& s) {
  PartWork w;
  w.gemms.push_back({s.tokens(), static_cast<double>(out), static_cast<double>(in) / s.t});
  w.elementwise(3.5 * s.tokens_local() * static_cast<double>(out));
  const double y = s.tokens() * static_cast<double>(out);  // the full-sequence output
  if (s.sp) {
    w.collectives_fwd.push_back({CommGroup::kTensor, CollectiveKind::kReduceScatter, y});
    w.collectives_bwd.push_back({CommGroup::kTensor, CollectiveKind::kAllGather, y});
  } else if (s.t > 1) {
    w.collectives_fwd.push_back({CommGroup::kTensor, CollectiveKind::kAllReduce, y});
  }
  return w;
}

Tensor RowParallelLinear::gather_output_grad(const LayerEnv& env, const Tensor& dresid) const {
  return env.tp.full_sequence(dresid);
}

// Without sequence parallelism dout_full is the residual stream's gradient itself, which keeps
// accumulating after this layer (a deferred weight gradient needs its value now); with it,
// dout_full is a gathered copy of its own.
void RowParallelLinear::backward(const LayerEnv& env, BackwardPass& pass, Tensor* dinp,
                                 const Tensor& dout_full, const Tensor& x) const {
  linear_backward(env, pass, dinp, weight, bias, dout_full, x,
                  /*dout_changes_later=*/!env.tp.sequence_parallel());
}

void RowParallelLinear::backward_through_gelu(const LayerEnv& env, BackwardPass& pass, Tensor& dpre,
                                              const Tensor& dout_full, const Tensor& pre,
                                              const Tensor& x, GeluKind kind) const {
  env.be.matmul_backward_input_gelu(dpre, dout_full, env.w(weight), pre, kind);
  backward(env, pass, nullptr, dout_full, x);
}

ReplicatedLinear::ReplicatedLinear(ParamLayout& layout, const std::string& name, int64_t in,
                                   int64_t out, LinearInit init, bool sequence_sharded_)
    : sequence_sharded(sequence_sharded_) {
  weight = layout.add({name + ".weight",
                       {out, in},
                       ParamSplit::kReplicated,
                       ParamInit::kNormal,
                       init.std,
                       -1,
                       true,
                       {}});
  bias = layout.add(
      {name + ".bias", {out}, ParamSplit::kReplicated, ParamInit::kZeros, 0, -1, false, {}});
}

namespace {

// (…, out) for an input (…, in) of a layer with `out` outputs.
Shape with_last(const Tensor& x, int64_t last) {
  Shape s = x.shape();
  s.back() = last;
  return s;
}

}  // namespace

Tensor ReplicatedLinear::forward(const LayerEnv& env, const Tensor& x) const {
  const Tensor w = env.w(weight), b = env.w(bias);
  Tensor y = env.act(with_last(x, w.size(0)));
  env.be.matmul_forward(y, x, w, &b);
  return y;
}

void ReplicatedLinear::forward_gelu(const LayerEnv& env, const Tensor& x, Tensor* pre, Tensor* out,
                                    GeluKind kind) const {
  const Tensor w = env.w(weight);
  *pre = env.act(with_last(x, w.size(0)));
  *out = env.act(with_last(x, w.size(0)));
  env.be.matmul_gelu_forward(*pre, *out, x, w, env.w(bias), kind);
}

PartWork ReplicatedLinear::work(int64_t in, int64_t out, double rows) {
  PartWork w;
  w.gemms.push_back({rows, static_cast<double>(out), static_cast<double>(in)});
  return w;
}

void ReplicatedLinear::backward(const LayerEnv& env, const BackwardPass& pass, Tensor* dinp,
                                const Tensor& dout, const Tensor& x) const {
  Tensor dw = env.g(weight), db = env.g(bias);
  env.be.matmul_backward(dinp, dw, &db, dout, x, env.w(weight));
  if (sequence_sharded && env.tp.sequence_parallel() && pass.last_microbatch) {
    env.tp.sum(dw);
    env.tp.sum(db);
  }
}

}  // namespace strata
