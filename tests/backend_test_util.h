// backend_test_util.h — host data in and out of a Backend for the tests that compare backends
// (the CUDA backend and kernels against the CPU reference): random values, tensors of f32 or
// bf16 holding them, the values read back as floats, and the comparison against a reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/precision.h"
#include "runtime/backend/backend.h"
#include "runtime/base/rng.h"

namespace strata::backend_test {

inline std::vector<float> random(size_t n, uint64_t key, float scale = 1.f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(normal01(key, i));
  return v;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = kernels::cpu::f32_to_bf16(v[i]);
  return b;
}

// A tensor of `shape` and type t on `be` holding `host` (rounded to nearest-even for bf16).
inline Tensor put(Backend& be, const Shape& shape, const std::vector<float>& host,
                  DType t = DType::kF32) {
  Tensor x = be.empty(shape, MemCategory::kActivations, t);
  if (t == DType::kBF16) {
    const std::vector<uint16_t> bits = to_bf16_bits(host);
    be.upload(x, bits.data());
  } else {
    be.upload(x, host.data());
  }
  return x;
}
inline Tensor put_i32(Backend& be, const Shape& shape, const std::vector<int32_t>& host) {
  Tensor x = be.empty(shape, MemCategory::kActivations, DType::kI32);
  be.upload(x, host.data());
  return x;
}
// The values of a float tensor (f32 or bf16), widened to float.
inline std::vector<float> get(Backend& be, const Tensor& x) {
  std::vector<float> v(static_cast<size_t>(x.numel()));
  if (x.dtype() == DType::kBF16) {
    std::vector<uint16_t> bits(v.size());
    be.download(bits.data(), x);
    for (size_t i = 0; i < v.size(); ++i) v[i] = kernels::cpu::bf16_to_f32(bits[i]);
  } else {
    be.download(v.data(), x);
  }
  return v;
}

// Every element within rel × (the largest |want|); reports the first three that are not, naming
// the two sides got_name and want_name.
inline void expect_close(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& want, double rel, const char* got_name = "cuda",
                         const char* want_name = "cpu") {
  ASSERT_EQ(got.size(), want.size()) << what;
  double mx = 1e-30;
  for (float w : want) mx = std::max(mx, static_cast<double>(std::fabs(w)));
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= rel * mx) && bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: " << got_name << " " << got[i] << ", " << want_name
                    << " " << want[i] << " (tolerance " << rel * mx << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " outside " << rel
                    << " x max |" << want_name << "| = " << rel * mx;
}

}  // namespace strata::backend_test
