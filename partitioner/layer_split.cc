#include "partitioner/layer_split.h"

#include <algorithm>
#include <limits>
#include <string>

namespace strata {

std::vector<int> layer_split(int num_layers, int pieces,
                             const std::optional<std::vector<int>>& explicit_split) {
  if (explicit_split) return *explicit_split;
  return split_layers_even(num_layers, pieces);
}

std::vector<int> split_layers_even(int layers, int pieces) {
  std::vector<int> v(static_cast<size_t>(pieces), layers / pieces);
  for (int k = 0; k < layers % pieces; ++k) ++v[static_cast<size_t>(k)];
  return v;
}

std::vector<int> split_layers_dp(const std::vector<double>& cost, int pieces, double first_extra,
                                 double last_extra) {
  const int L = static_cast<int>(cost.size());
  std::vector<double> pre(static_cast<size_t>(L) + 1, 0.0);
  for (int i = 0; i < L; ++i)
    pre[static_cast<size_t>(i) + 1] = pre[static_cast<size_t>(i)] + cost[static_cast<size_t>(i)];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][n]: the smallest max piece cost covering the first n layers with k pieces.
  std::vector<std::vector<double>> best(static_cast<size_t>(pieces) + 1,
                                        std::vector<double>(static_cast<size_t>(L) + 1, inf));
  std::vector<std::vector<int>> from(best.size(), std::vector<int>(static_cast<size_t>(L) + 1, -1));
  best[0][0] = 0;
  for (int k = 1; k <= pieces; ++k) {
    const double extra = (k == 1 ? first_extra : 0) + (k == pieces ? last_extra : 0);
    for (int n = k; n <= L - (pieces - k); ++n) {
      for (int j = k - 1; j < n; ++j) {
        const double prev = best[static_cast<size_t>(k) - 1][static_cast<size_t>(j)];
        if (prev == inf) continue;
        const double c =
            std::max(prev, pre[static_cast<size_t>(n)] - pre[static_cast<size_t>(j)] + extra);
        if (c < best[static_cast<size_t>(k)][static_cast<size_t>(n)]) {
          best[static_cast<size_t>(k)][static_cast<size_t>(n)] = c;
          from[static_cast<size_t>(k)][static_cast<size_t>(n)] = j;
        }
      }
    }
  }
  std::vector<int> out(static_cast<size_t>(pieces));
  int n = L;
  for (int k = pieces; k >= 1; --k) {
    const int j = from[static_cast<size_t>(k)][static_cast<size_t>(n)];
    out[static_cast<size_t>(k) - 1] = n - j;
    n = j;
  }
  return out;
}

std::string split_text(const std::vector<int>& split) {
  std::string s;
  for (size_t k = 0; k < split.size(); ++k) s += (k ? " " : "") + std::to_string(split[k]);
  return s;
}

}  // namespace strata
