// attention_reference.h — the shape of one causal-attention test case and the log-sum-exp
// reference, for the GPU attention tests (the flash kernels in test_cuda_kernels.cc, cuDNN's in
// test_cudnn_attention.cc). Layouts as kernels/cuda/flash_attention.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

namespace strata::device_test {

// NH query heads, KVH key/value heads (KVH = NH: multi-head attention).
struct AttentionCase {
  int B, S, NH, KVH, HS;
  size_t tokens() const { return static_cast<size_t>(B) * S; }
  size_t C() const { return static_cast<size_t>(NH) * HS; }  // out (B, S, NH, HS): per token
  // qkv (B, S, NH + 2·KVH, HS): elements per token.
  size_t width() const { return static_cast<size_t>(NH + 2 * KVH) * HS; }
  size_t rows() const { return static_cast<size_t>(B) * NH * S; }  // (B, NH, S) statistics
  std::string str() const {
    return "B " + std::to_string(B) + " S " + std::to_string(S) + " NH " + std::to_string(NH) +
           (KVH != NH ? " KVH " + std::to_string(KVH) : std::string()) + " HS " +
           std::to_string(HS);
  }
};

// gtest's name for a parameter (else it prints the struct's bytes).
inline void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << c.str();
}

// lse (B, NH, S) = log Σ_{j ≤ i} exp(q_i·k_j / √HS), in double straight from qkv
// (B, S, NH + 2·KVH, HS), query head h with key head h / (NH / KVH).
inline std::vector<float> reference_lse(const std::vector<float>& qkv, const AttentionCase& c) {
  const size_t W = c.width();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.HS));
  std::vector<float> lse(c.rows());
  std::vector<double> s(c.S);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.NH; ++h)
      for (int i = 0; i < c.S; ++i) {
        const float* q = &qkv[(static_cast<size_t>(b) * c.S + i) * W + h * c.HS];
        const size_t hk = static_cast<size_t>(c.NH + h / (c.NH / c.KVH));
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* k = &qkv[(static_cast<size_t>(b) * c.S + j) * W + hk * c.HS];
          double dot = 0;
          for (int d = 0; d < c.HS; ++d) dot += static_cast<double>(q[d]) * k[d];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        lse[(static_cast<size_t>(b) * c.NH + h) * c.S + i] = static_cast<float>(mx + std::log(sum));
      }
  return lse;
}

}  // namespace strata::device_test
