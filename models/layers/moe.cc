#include "models/layers/moe.h"

#include <cmath>

#include "runtime/base/check.h"

namespace strata {

int64_t MoeSpec::capacity(int64_t tokens) const {
  if (!capacity_factor) return -1;
  return static_cast<int64_t>(
      std::ceil(*capacity_factor * static_cast<double>(tokens) * top_k / experts));
}

MixtureOfExperts::MixtureOfExperts(ParamLayout& layout, const MoeSpec& m, const MoeNames& names,
                                   int64_t C_, double init_std, double proj_init_std)
    : spec(m),
      C(C_),
      hidden_local(m.hidden / layout.tp()),
      ep(layout.ep()),
      experts_local(m.experts / layout.ep()) {
  const int64_t E = m.experts, F = m.hidden;
  STRATA_CHECK(E % ep == 0, "expert " << ep << " does not divide num_experts " << E);
  router = layout.add({names.router + ".weight",
                       {E, C},
                       ParamSplit::kReplicated,
                       ParamInit::kNormal,
                       init_std,
                       -1,
                       true});
  // Expert e's [gate_e; up_e] are blocks 2e and 2e + 1 of F rows, each split over the group; a
  // rank of the expert group holds the blocks of its experts.
  gate_up = layout.add({names.experts_gate_up + ".weight",
                        {E * 2 * F, C},
                        ParamSplit::kBlockRows,
                        ParamInit::kNormal,
                        init_std,
                        -1,
                        true,
                        std::vector<int64_t>(static_cast<size_t>(2 * E), F),
                        /*expert=*/true});
  down = layout.add({names.experts_down + ".weight",
                     {E * C, F},
                     ParamSplit::kCols,
                     ParamInit::kNormal,
                     proj_init_std,
                     -1,
                     true,
                     {},
                     /*expert=*/true});
}

namespace {
size_t total(const std::vector<size_t>& v) {
  size_t n = 0;
  for (size_t x : v) n += x;
  return n;
}
// Counts of rows into element counts of rows C wide.
std::vector<size_t> elements(const std::vector<size_t>& rows, int64_t C) {
  std::vector<size_t> out(rows);
  for (size_t& x : out) x *= static_cast<size_t>(C);
  return out;
}
}  // namespace

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
  // counts, routed and (expert parallelism) the counts the other ranks send, side by side, so
  // that one download (one device sync) brings them all.
  const bool parallel = ep > 1;
  s.dest = be.empty({N, k}, MemCategory::kActivations, DType::kI32);
  const Tensor all = be.empty({(parallel ? 3 : 2) * E}, MemCategory::kActivations, DType::kI32);
  Tensor counts = all.view(0, {E}), routed = all.view(E, {E});
  be.moe_dispatch_plan(s.dest, counts, routed, s.topk_idx, s.topk_w, static_cast<int>(E),
                       spec.capacity(N));
  if (parallel) {
    // Each rank of the expert group tells every other how many rows it sends to each of its
    // experts: E/e counts a peer.
    Tensor received = all.view(2 * E, {E});
    const std::vector<size_t> per_peer(static_cast<size_t>(ep), static_cast<size_t>(experts_local));
    env.ep->all_to_allv(counts.data(), per_peer, received.data(), per_peer, DType::kI32);
  }
  std::vector<int32_t> host(static_cast<size_t>(all.numel()));
  be.download(host.data(), all);
  int64_t Rd = 0;  // the rows this rank routes (after drops)
  for (int64_t e = 0; e < E; ++e) Rd += host[static_cast<size_t>(e)];

  if (stats) {
    Tensor psum = env.stat({E});
    be.moe_prob_sums(psum, s.probs);
    std::vector<float> ps(static_cast<size_t>(E));
    be.download(ps.data(), psum);
    stats->prob_sum.assign(ps.begin(), ps.end());
    stats->routed.assign(host.begin() + E, host.begin() + 2 * E);
    stats->tokens = N;
    stats->dropped = N * k - Rd;
  }

  // The routed rows in the dispatch order; with expert parallelism, to the experts' ranks.
  Tensor xd = env.act({Rd, C});
  if (Rd > 0) be.moe_permute(xd, s.x, s.dest);
  if (parallel) {
    const std::vector<int32_t> sent(host.begin(), host.begin() + E);
    const std::vector<int32_t> received(host.begin() + 2 * E, host.end());
    s.xp = dispatch(env, xd, sent, received, s);
  } else {
    s.rows.assign(host.begin(), host.begin() + E);
    s.xp = xd;
  }
  xd = Tensor();

  // The experts: gate/up, SwiGLU, down, over each expert's rows.
  const int64_t Fl = hidden_local, El = experts_local, R = s.xp.size(0);
  s.h = env.act({R, 2 * Fl});
  s.act = env.act({R, Fl});
  Tensor y = env.act({R, C});
  if (R > 0) {
    be.grouped_matmul_forward(s.h, s.xp, env.w(gate_up).reshape({El, 2 * Fl, C}), s.rows);
    be.swiglu_forward(s.act, s.h);
    be.grouped_matmul_forward(y, s.act, env.w(down).reshape({El, C, Fl}), s.rows);
  }
  s.y = parallel ? combine_rows(env, y, s) : y;

  // Combine: Σ_j w_nj · y_(n,j), a partial sum over the group, reduced before the residual.
  Tensor out = env.act({B, S, C});
  Tensor out_rows = out.reshape({N, C});
  be.moe_unpermute(out_rows, s.y, s.dest, s.topk_w);
  Tensor reduced = env.tp.reduce(out);
  Tensor result = env.act(residual.shape());
  be.add(result, reduced, residual);
  return result;
}

Tensor MixtureOfExperts::dispatch(const LayerEnv& env, const Tensor& xd,
                                  const std::vector<int32_t>& sent_counts,
                                  const std::vector<int32_t>& received_counts, Saved& s) const {
  const int64_t El = experts_local;
  // sent_counts [E]: this rank's rows per expert, peer j's experts [j·E_l, (j+1)·E_l);
  // received_counts [E]: from source i, rows for this rank's expert l at i·E_l + l.
  s.sent.assign(static_cast<size_t>(ep), 0);
  s.received.assign(static_cast<size_t>(ep), 0);
  s.rows.assign(static_cast<size_t>(El), 0);
  for (int i = 0; i < ep; ++i)
    for (int64_t l = 0; l < El; ++l) {
      const size_t at = static_cast<size_t>(i * El + l);
      s.sent[static_cast<size_t>(i)] += static_cast<size_t>(sent_counts[at]);
      s.received[static_cast<size_t>(i)] += static_cast<size_t>(received_counts[at]);
      s.rows[static_cast<size_t>(l)] += received_counts[at];
    }
  // The received rows arrive source after source, expert after expert within a source; their
  // place in the expert order (expert after expert, source after source within an expert).
  std::vector<int64_t> next(static_cast<size_t>(El), 0);
  for (int64_t l = 1; l < El; ++l)
    next[static_cast<size_t>(l)] =
        next[static_cast<size_t>(l - 1)] + s.rows[static_cast<size_t>(l - 1)];
  const int64_t R = static_cast<int64_t>(total(s.received));
  std::vector<int32_t> sort(static_cast<size_t>(R));
  size_t at = 0;
  for (int i = 0; i < ep; ++i)
    for (int64_t l = 0; l < El; ++l)
      for (int32_t r = 0; r < received_counts[static_cast<size_t>(i * El + l)]; ++r)
        sort[at++] = static_cast<int32_t>(next[static_cast<size_t>(l)]++);
  s.sort = env.be.empty({R, 1}, MemCategory::kActivations, DType::kI32);
  if (R > 0) env.be.upload(s.sort, sort.data());
  return send_rows(env, xd, s);
}

Tensor MixtureOfExperts::send_rows(const LayerEnv& env, const Tensor& rows, const Saved& s) const {
  const int64_t R = static_cast<int64_t>(total(s.received));
  Tensor arrived = env.act({R, C});
  env.ep->all_to_allv(rows.data(), elements(s.sent, C), arrived.data(), elements(s.received, C),
                      rows.dtype());
  Tensor sorted = env.act({R, C});
  if (R > 0) env.be.moe_permute(sorted, arrived, s.sort);
  return sorted;
}

Tensor MixtureOfExperts::combine_rows(const LayerEnv& env, const Tensor& rows,
                                      const Saved& s) const {
  const int64_t R = rows.size(0), Rd = static_cast<int64_t>(total(s.sent));
  Tensor unsorted = env.act({R, C});
  if (R > 0) env.be.moe_permute_backward(unsorted, rows, s.sort);
  Tensor back = env.act({Rd, C});
  env.ep->all_to_allv(unsorted.data(), elements(s.received, C), back.data(), elements(s.sent, C),
                      unsorted.dtype());
  return back;
}

Tensor MixtureOfExperts::backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid,
                                  Saved& s) const {
  (void)pass;  // weight gradients are never deferred (moe.h)
  Backend& be = env.be;
  const int64_t k = spec.top_k, N = s.x.size(0), Fl = hidden_local, El = experts_local;
  const bool parallel = ep > 1;
  const int64_t R = s.xp.size(0), Rd = s.y.size(0);
  const Tensor dout = env.tp.full_sequence(dresid);
  const Shape full_shape = dout.shape();

  // Through the combine: each routed row's output gradient and each weight's (a partial sum: y
  // is); with expert parallelism the row gradients travel to the experts' ranks.
  Tensor dyd = env.act({Rd, C});
  Tensor dw = env.stat({N, k});
  const Tensor dout_rows = dout.reshape({N, C});
  be.moe_unpermute_backward(dyd, dw, dout_rows, s.y, s.dest, s.topk_w);
  env.tp.sum(dw);
  s.y = Tensor();
  Tensor dy = parallel ? send_rows(env, dyd, s) : dyd;
  dyd = Tensor();

  // Through the experts.
  Tensor dxp = env.act({R, C});
  if (R > 0) {
    Tensor dact = env.act({R, Fl});
    const Tensor w_down = env.w(down).reshape({El, C, Fl});
    be.grouped_matmul_backward_input(dact, dy, w_down, s.rows);
    Tensor g_down = env.g(down).reshape({El, C, Fl});
    be.grouped_matmul_backward_weight(g_down, dy, s.act, s.rows);
    dy = Tensor();
    Tensor dh = env.act({R, 2 * Fl});
    be.swiglu_backward(dh, dact, s.h);
    dact = Tensor();
    be.grouped_matmul_backward_input(dxp, dh, env.w(gate_up).reshape({El, 2 * Fl, C}), s.rows);
    Tensor g_gate_up = env.g(gate_up).reshape({El, 2 * Fl, C});
    be.grouped_matmul_backward_weight(g_gate_up, dh, s.xp, s.rows);
  }
  if (parallel) dxp = combine_rows(env, dxp, s);
  Tensor dx = env.act(full_shape);
  Tensor dx_rows = dx.reshape({N, C});
  be.moe_permute_backward(dx_rows, dxp, s.dest);
  dxp = Tensor();

  // Through the router, the same on every rank of the group: its input gradient joins the
  // experts' partial sums once (tensor rank 0) before their reduction.
  Tensor dlogits = env.act({N, spec.experts});
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
