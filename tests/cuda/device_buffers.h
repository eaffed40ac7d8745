// device_buffers.h — raw device memory for the kernel-level GPU tests (tests/cuda/), which call
// kernels/cuda functions on plain pointers: an owning buffer, and host values moved to and from
// it as f32 or bf16 (rounded to nearest even, widened back to float).
//
// Failures are gtest expectations, not exceptions: a test with a broken device reports them and
// goes on to its comparisons, which then fail with the values.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/precision.h"
#include "kernels/cuda/elem_type.h"
#include "tests/backend_test_util.h"

namespace strata::device_test {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// The values as the device holds them in bf16 (bf16 true) or f32.
inline std::vector<float> rounded(std::vector<float> v, bool bf16) {
  if (bf16)
    for (float& x : v) x = kernels::cpu::bf16_to_f32(kernels::cpu::f32_to_bf16(x));
  return v;
}

// dst = values in `type`; dst holds exactly values.size() elements of it.
inline void upload(const DeviceBuffer& dst, const std::vector<float>& values,
                   kernels::cuda::ElemType type) {
  ASSERT_EQ(values.size() * kernels::cuda::elem_size(type), dst.bytes());
  if (type == kernels::cuda::ElemType::kBF16) {
    const std::vector<uint16_t> bits = backend_test::to_bf16_bits(values);
    EXPECT_EQ(cudaMemcpy(dst.get(), bits.data(), dst.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  } else {
    EXPECT_EQ(cudaMemcpy(dst.get(), values.data(), dst.bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
}

// The buffer's elements of `type`, widened to float, after every queued kernel has finished.
inline std::vector<float> download(const DeviceBuffer& src, kernels::cuda::ElemType type) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> v(src.bytes() / kernels::cuda::elem_size(type));
  if (type == kernels::cuda::ElemType::kBF16) {
    std::vector<uint16_t> bits(v.size());
    EXPECT_EQ(cudaMemcpy(bits.data(), src.get(), src.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < v.size(); ++i) v[i] = kernels::cpu::bf16_to_f32(bits[i]);
  } else {
    EXPECT_EQ(cudaMemcpy(v.data(), src.get(), src.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

// A device array of f32 or bf16 values; host() is what the device holds, widened to float.
class DeviceArray {
 public:
  DeviceArray(const std::vector<float>& values, kernels::cuda::ElemType type)
      : type_(type), buf_(values.size() * kernels::cuda::elem_size(type)) {
    set(values);
  }
  void set(const std::vector<float>& values) { upload(buf_, values, type_); }
  std::vector<float> host() const { return download(buf_, type_); }
  void* get() const { return buf_.get(); }
  float* f32() const { return buf_.f32(); }
  kernels::cuda::ElemType type() const { return type_; }

 private:
  kernels::cuda::ElemType type_;
  DeviceBuffer buf_;
};

}  // namespace strata::device_test
