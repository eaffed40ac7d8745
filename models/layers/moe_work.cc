// moe_work.cc — the mixture of experts' self-description (models/layers/work.h): its GEMMs,
// collectives, activations and FLOPs as the planner, the dry run and the metrics read them.
#include "models/layers/moe.h"

namespace strata {

PartWork MixtureOfExperts::work(int64_t C, const MoeSpec& m, const WorkShape& s) {
  PartWork w;
  const double N = s.tokens(), c = static_cast<double>(C), E = m.experts;
  const double rows = N * m.top_k;  // routed rows, spread evenly (dropless)
  const double Fl = static_cast<double>(m.hidden) / s.t;
  // The router (replicated: every rank routes the whole micro-batch).
  w.gemms.push_back({N, E, c});
  // The experts as one grouped GEMM each way: the rows are the assignments. With expert
  // parallelism a rank runs its E/e experts over the rows its expert group sends it, N·k on
  // average when the tokens spread evenly: the same shapes.
  w.gemms.push_back({rows, 2 * Fl, c});
  w.gemms.push_back({rows, c, Fl});
  // Softmax and top-k over (N, E); permute and combine (read + write each row); SwiGLU. With
  // expert parallelism the rows received are sorted into expert order and the outputs unsorted
  // before they travel back (read + write each row, twice).
  w.elementwise(3 * N * E + 4 * rows * c + 3 * rows * Fl + (s.e > 1 ? 4 * rows * c : 0));
  // Expert parallelism (e > 1): every rank (each tensor rank on its own expert group, with the
  // whole C-wide rows) sends its routed rows to the ranks holding their experts and takes the
  // outputs back. Forward: the rows per expert (E counts, int32: what matters of it is its
  // latency), the dispatch and the combine; backward: the combine's gradient out to the experts
  // and the dispatch's gradient back.
  const bool ep = s.e > 1;
  if (s.t > 1 && s.sp)
    w.collectives_fwd.push_back({CommGroup::kTensor, CollectiveKind::kAllGather, N * c});
  if (ep) {
    w.collectives_fwd.push_back({CommGroup::kExpert, CollectiveKind::kAllToAll, E});
    w.collectives_fwd.push_back({CommGroup::kExpert, CollectiveKind::kAllToAll, rows * c});
    w.collectives_fwd.push_back({CommGroup::kExpert, CollectiveKind::kAllToAll, rows * c});
  }
  if (s.t > 1) {
    if (s.sp) {
      w.collectives_fwd.push_back({CommGroup::kTensor, CollectiveKind::kReduceScatter, N * c});
      w.collectives_bwd.push_back({CommGroup::kTensor, CollectiveKind::kAllGather, N * c});
    } else {
      w.collectives_fwd.push_back({CommGroup::kTensor, CollectiveKind::kAllReduce, N * c});
    }
  }
  if (ep) {
    w.collectives_bwd.push_back({CommGroup::kExpert, CollectiveKind::kAllToAll, rows * c});
    w.collectives_bwd.push_back({CommGroup::kExpert, CollectiveKind::kAllToAll, rows * c});
  }
  if (s.t > 1) {
    w.collectives_bwd.push_back({CommGroup::kTensor, CollectiveKind::kAllReduce, rows});
    w.collectives_bwd.push_back({CommGroup::kTensor,
                                 s.sp ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce,
                                 N * c});
  }
  return w;
}

LayerActivations MixtureOfExperts::activations(int64_t C, const MoeSpec& m, const WorkShape& s) {
  const double N = s.tokens(), c = static_cast<double>(C), E = m.experts;
  const double rows = N * m.top_k, Fl = static_cast<double>(m.hidden) / s.t;
  LayerActivations a;
  // The input (its gather with sp), the probabilities (f32, counted as two elements), the
  // routing (index, weight, row: three per assignment), and per row its input, [gate | up],
  // activation and output. With expert parallelism the rows a rank keeps are those its experts
  // received (input, [gate | up], activation) and its own tokens' outputs sent back: as many on
  // average.
  a.saved = (s.sp ? N * c : 0) + 2 * N * E + 3 * rows + rows * (c + 2 * Fl + Fl + c);
  // The backward's working set: the rows' gradients (output, activation, [gate | up], input),
  // the full-sequence gradient and the router's logits' gradient; with expert parallelism the
  // receiving side of each all-to-all beside the rows sent (rows · C more).
  a.backward = rows * (c + Fl + 2 * Fl + c) + N * c + N * E + (s.e > 1 ? rows * c : 0);
  return a;
}

double MixtureOfExperts::flops_per_token(int64_t C, const MoeSpec& m) {
  const double c = static_cast<double>(C), F = static_cast<double>(m.hidden);
  return 2.0 * c * m.experts + m.top_k * 2.0 * c * 3 * F;
}

std::string MixtureOfExperts::split_reason(const MoeSpec& m, int t) {
  if (t >= 1 && m.hidden % t == 0) return "";
  return "tensor " + std::to_string(t) + " does not divide moe_intermediate_size " +
         std::to_string(m.hidden);
}

}  // namespace strata
