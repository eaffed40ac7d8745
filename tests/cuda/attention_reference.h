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

struct AttentionCase {
  int B, S, NH, HS;
  size_t tokens() const { return static_cast<size_t>(B) * S; }
  size_t C() const { return static_cast<size_t>(NH) * HS; }
  size_t rows() const { return static_cast<size_t>(B) * NH * S; }  // (B, NH, S) statistics
  std::string str() const {
    return "B " + std::to_string(B) + " S " + std::to_string(S) + " NH " + std::to_string(NH) +
           " HS " + std::to_string(HS);
  }
};

// gtest's name for a parameter (else it prints the struct's bytes).
inline void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << c.str();
}

// lse (B, NH, S) = log Σ_{j ≤ i} exp(q_i·k_j / √HS), in double straight from qkv
// (B, S, 3, NH, HS).
inline std::vector<float> reference_lse(const std::vector<float>& qkv, const AttentionCase& c) {
  const size_t C = c.C();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.HS));
  std::vector<float> lse(c.rows());
  std::vector<double> s(c.S);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.NH; ++h)
      for (int i = 0; i < c.S; ++i) {
        const float* q = &qkv[(static_cast<size_t>(b) * c.S + i) * 3 * C + h * c.HS];
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* k = &qkv[((static_cast<size_t>(b) * c.S + j) * 3 + 1) * C + h * c.HS];
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
