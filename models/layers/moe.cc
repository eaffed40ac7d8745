#include "models/layers/moe.h"

#include <cmath>

namespace strata {

int64_t MoeSpec::capacity(int64_t tokens) const {
  if (!capacity_factor) return -1;
  return static_cast<int64_t>(
      std::ceil(*capacity_factor * static_cast<double>(tokens) * top_k / experts));
}

MixtureOfExperts::MixtureOfExperts(ParamLayout& layout, const MoeSpec& m, const MoeNames& names,
                                   int64_t C_, double init_std, double proj_init_std)
    : spec(m), C(C_), hidden_local(m.hidden / layout.tp()) {
  const int64_t E = m.experts, F = m.hidden;
  router = layout.add({names.router + ".weight",
                       {E, C},
                       ParamSplit::kReplicated,
                       ParamInit::kNormal,
                       init_std,
                       -1,
                       true});
  // Expert e's [gate_e; up_e] are blocks 2e and 2e + 1 of F rows, each split over the group.
  gate_up = layout.add({names.experts_gate_up + ".weight",
                        {E * 2 * F, C},
                        ParamSplit::kBlockRows,
                        ParamInit::kNormal,
                        init_std,
                        -1,
                        true,
                        std::vector<int64_t>(static_cast<size_t>(2 * E), F),
                        true});
  down = layout.add({names.experts_down + ".weight",
                     {E * C, F},
                     ParamSplit::kCols,
                     ParamInit::kNormal,
                     proj_init_std,
                     -1,
                     true,
                     {},
                     true});
}

Tensor MixtureOfExperts::forward(const LayerEnv& env, const Tensor& x, const Tensor& residual,
                                 Saved& s, Stats* stats) const {
  Backend& be = env.be;
  const int64_t E = spec.experts, k = spec.top_k;
  const Tensor x_full = env.tp.full_sequence(x);
  const int64_t B = x_full.size(0), S = x_full.size(1), N = B * S;
  s.x = x_full.reshape({N, C});

  // Route every token: the router's logits, their softmax and the top k.
  Tensor logits = env.act({N, E});
  be.matmul_forward(logits, s.x, env.w(router), nullptr);
  s.probs = env.stat({N, E});
  s.topk_idx = be.empty({N, k}, MemCategory::kActivations, DType::kI32);
  s.topk_w = env.stat({N, k});
  be.moe_route(s.probs, s.topk_idx, s.topk_w, logits, static_cast<int>(k), spec.renormalize);
  logits = Tensor();

  // Lay the assignments out expert by expert; the grouped GEMMs need the rows per expert here.
  // counts and routed side by side, so that one download (one device sync) brings both.
  s.dest = be.empty({N, k}, MemCategory::kActivations, DType::kI32);
  const Tensor both = be.empty({2 * E}, MemCategory::kActivations, DType::kI32);
  Tensor counts = both.view(0, {E}), routed = both.view(E, {E});
  be.moe_dispatch_plan(s.dest, counts, routed, s.topk_idx, s.topk_w, static_cast<int>(E),
                       spec.capacity(N));
  std::vector<int32_t> host(static_cast<size_t>(2 * E));
  be.download(host.data(), both);
  s.rows.assign(host.begin(), host.begin() + E);
  int64_t R = 0;
  for (int64_t r : s.rows) R += r;

  if (stats) {
    Tensor psum = env.stat({E});
    be.moe_prob_sums(psum, s.probs);
    std::vector<float> ps(static_cast<size_t>(E));
    be.download(ps.data(), psum);
    stats->prob_sum.assign(ps.begin(), ps.end());
    stats->routed.assign(host.begin() + E, host.end());
    stats->tokens = N;
    stats->dropped = N * k - R;
  }

  // The experts: gate/up, SwiGLU, down, over each expert's rows.
  const int64_t Fl = hidden_local;
  s.xp = env.act({R, C});
  be.moe_permute(s.xp, s.x, s.dest);
  s.h = env.act({R, 2 * Fl});
  be.grouped_matmul_forward(s.h, s.xp, env.w(gate_up).reshape({E, 2 * Fl, C}), s.rows);
  s.act = env.act({R, Fl});
  be.swiglu_forward(s.act, s.h);
  s.y = env.act({R, C});
  be.grouped_matmul_forward(s.y, s.act, env.w(down).reshape({E, C, Fl}), s.rows);

  // Combine: Σ_j w_nj · y_(n,j), a partial sum over the group, reduced before the residual.
  Tensor out = env.act({B, S, C});
  Tensor out_rows = out.reshape({N, C});
  be.moe_unpermute(out_rows, s.y, s.dest, s.topk_w);
  Tensor reduced = env.tp.reduce(out);
  Tensor result = env.act(residual.shape());
  be.add(result, reduced, residual);
  return result;
}

Tensor MixtureOfExperts::backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid,
                                  Saved& s) const {
  (void)pass;  // weight gradients are never deferred (moe.h)
  Backend& be = env.be;
  const int64_t E = spec.experts, k = spec.top_k, N = s.x.size(0), Fl = hidden_local;
  const int64_t R = s.xp.size(0);
  const Tensor dout = env.tp.full_sequence(dresid);
  const Shape full_shape = dout.shape();

  // Through the combine: each row's output gradient and each weight's (a partial sum: y is).
  Tensor dy = env.act({R, C});
  Tensor dw = env.stat({N, k});
  const Tensor dout_rows = dout.reshape({N, C});
  be.moe_unpermute_backward(dy, dw, dout_rows, s.y, s.dest, s.topk_w);
  env.tp.sum(dw);
  s.y = Tensor();

  // Through the experts.
  Tensor dact = env.act({R, Fl});
  const Tensor w_down = env.w(down).reshape({E, C, Fl});
  be.grouped_matmul_backward_input(dact, dy, w_down, s.rows);
  Tensor g_down = env.g(down).reshape({E, C, Fl});
  be.grouped_matmul_backward_weight(g_down, dy, s.act, s.rows);
  dy = Tensor();
  Tensor dh = env.act({R, 2 * Fl});
  be.swiglu_backward(dh, dact, s.h);
  dact = Tensor();
  Tensor dxp = env.act({R, C});
  be.grouped_matmul_backward_input(dxp, dh, env.w(gate_up).reshape({E, 2 * Fl, C}), s.rows);
  Tensor g_gate_up = env.g(gate_up).reshape({E, 2 * Fl, C});
  be.grouped_matmul_backward_weight(g_gate_up, dh, s.xp, s.rows);
  dh = Tensor();
  Tensor dx = env.act(full_shape);
  Tensor dx_rows = dx.reshape({N, C});
  be.moe_permute_backward(dx_rows, dxp, s.dest);
  dxp = Tensor();

  // Through the router, the same on every rank of the group: its input gradient joins the
  // experts' partial sums once (tensor rank 0) before their reduction.
  Tensor dlogits = env.act({N, E});
  be.moe_route_backward(dlogits, dw, s.aux_grad, s.probs, s.topk_idx, spec.renormalize);
  Tensor g_router = env.g(router);
  be.matmul_backward_weight(g_router, nullptr, dlogits, s.x);
  if (env.tp.rank() == 0) {
    Tensor dx_router = env.act({N, C});
    be.matmul_backward_input(dx_router, dlogits, env.w(router));
    be.add_inplace(dx_rows, dx_router);
  }
  s = Saved();
  return env.tp.reduce(dx);
}

}  // namespace strata
