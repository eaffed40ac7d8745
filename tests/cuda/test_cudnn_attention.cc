// CudnnAttention (kernels/cuda/cudnn_attention.h) against two references computed outside it:
// the CPU attention of kernels/cpu/attention.h (f32, on the very bf16 values the GPU holds) and the
// own flash kernels of kernels/cuda/flash_attention.h. Also the interchangeability the header
// promises (a forward of one and a backward of the other give the same gradient), that dqkv is
// overwritten rather than accumulated (as the flash backward's is), and the refusals with their
// reasons.
//
// Shapes: B = 2, NH = 3 and S = 1, 37, 128, 200 (one row, not a multiple of any tile, one
// tile, a partial last tile) by HS = 32, 64, 128, each its own test; and grouped-query attention
// (NH = 4 with KVH = 2, NH = 8 with KVH = 1), whose dK and dV cuDNN sums over each group. Without a
// CUDA device the device tests skip with "no CUDA device"; a shape cuDNN refuses (old cuDNN, old
// GPU, no engine) skips with cuDNN's reason, printed.
//
// Tolerances, each relative to the largest magnitude of the expected result (expect_close):
// - out and dqkv (bf16): 2e-2. Both are rounded once to bf16 at the store (≤ 2^-9 ≈ 0.2% of
//   their own magnitude), and cuDNN also rounds the probabilities P (and, backward, dS) to
//   bf16 before they enter a tensor-core matmul, an error of the same relative size in every
//   term of those sums; the backward's row sums dout·out use the bf16-rounded out where the
//   CPU uses its f32 one. 2e-2 is several times those, while a wrong mask, a missing scale or
//   a wrong stride is off by far more.
// - lse (f32 from bf16 inputs): 1e-3. f32 accumulation on both sides; the slack is for the
//   tensor cores' accumulation order, as in test_cuda_kernels.cc.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/flash_attention.h"
#include "runtime/comm/comm.h"
#include "tests/backend_test_util.h"
#include "tests/cuda/attention_reference.h"
#include "tests/cuda/device_buffers.h"

namespace strata {
namespace {

namespace kcpu = kernels::cpu;
namespace kc = kernels::cuda;
using namespace backend_test;
using namespace device_test;

constexpr double kTolBf16 = 2e-2;
constexpr double kTolLse = 1e-3;

// bf16 values as the device holds them; the f32 log-sum-exp and the bf16 buffers read back.
std::vector<float> rounded(std::vector<float> v) {
  return device_test::rounded(std::move(v), true);
}
void upload_bf16(const DeviceBuffer& dst, const std::vector<float>& v) {
  upload(dst, v, kc::ElemType::kBF16);
}
std::vector<float> download_bf16(const DeviceBuffer& src) {
  return download(src, kc::ElemType::kBF16);
}
std::vector<float> download_f32(const DeviceBuffer& src) {
  return download(src, kc::ElemType::kF32);
}

// ---- shapes and references ---------------------------------------------------------------

using Case = AttentionCase;

std::vector<Case> cases() {
  std::vector<Case> c;
  for (int S : {1, 37, 128, 200, 256})
    for (int HS : {32, 64, 128}) c.push_back({2, S, 3, 3, HS});
  for (int S : {128, 256})
    for (int HS : {64, 128}) c.push_back({2, S, 4, 2, HS});
  c.push_back({1, 256, 8, 1, 128});
  return c;
}

// The CPU forward and backward (dqkv from zero) in f32.
struct CpuAttention {
  std::vector<float> out, dqkv;
  CpuAttention(const std::vector<float>& qkv, const std::vector<float>& dout, const Case& c)
      : out(c.tokens() * c.C()), dqkv(qkv.size(), 0.f) {
    std::vector<float> att(c.rows() * c.S), scratch(kcpu::attention_scratch_elems(c.S));
    kcpu::attention_forward<float>(out.data(), att.data(), qkv.data(), c.B, c.S, c.NH, c.KVH, c.HS);
    kcpu::attention_backward<float>(dqkv.data(), dout.data(), qkv.data(), att.data(),
                                    scratch.data(), c.B, c.S, c.NH, c.KVH, c.HS);
  }
};

// One shape's inputs on the device: qkv and dout random bf16, and buffers for both kernels'
// outputs.
struct Problem {
  Case c;
  std::vector<float> qkv, dout;  // the bf16 values, widened
  DeviceBuffer d_qkv, d_dout;
  DeviceBuffer out, lse, dqkv;                    // cuDNN's
  DeviceBuffer flash_out, flash_lse, flash_dqkv;  // the flash kernels'
  DeviceBuffer flash_scratch;

  Problem(const Case& shape, uint64_t key)
      : c(shape),
        qkv(rounded(random(shape.tokens() * shape.width(), key))),
        dout(rounded(random(shape.tokens() * shape.C(), key + 1))),
        d_qkv(qkv.size() * 2),
        d_dout(dout.size() * 2),
        out(dout.size() * 2),
        lse(shape.rows() * 4),
        dqkv(qkv.size() * 2),
        flash_out(dout.size() * 2),
        flash_lse(shape.rows() * 4),
        flash_dqkv(qkv.size() * 2),
        flash_scratch(kc::flash_attention_backward_scratch_bytes(shape.B, shape.S, shape.NH,
                                                                 shape.KVH, shape.HS)) {
    upload_bf16(d_qkv, qkv);
    upload_bf16(d_dout, dout);
  }

  void flash_forward() {
    ASSERT_EQ(
        kc::flash_attention_forward(flash_out.get(), flash_lse.f32(), d_qkv.get(),
                                    kc::ElemType::kBF16, c.B, c.S, c.NH, c.KVH, c.HS, nullptr),
        cudaSuccess);
  }
  // The flash backward assigns dqkv: it starts as NaN bytes, which any read would show.
  // out/lse: either kernel's forward.
  void flash_backward(const DeviceBuffer& fwd_out, const DeviceBuffer& fwd_lse) {
    ASSERT_EQ(cudaMemset(flash_dqkv.get(), 0xff, flash_dqkv.bytes()), cudaSuccess);
    ASSERT_EQ(kc::flash_attention_backward(flash_dqkv.get(), d_dout.get(), d_qkv.get(),
                                           fwd_out.get(), fwd_lse.f32(), kc::ElemType::kBF16, c.B,
                                           c.S, c.NH, c.KVH, c.HS, flash_scratch.get(), nullptr),
              cudaSuccess);
  }
};

// A CudnnAttention with this shape's workspace, or the reason it cannot run the shape.
class CudnnRunner {
 public:
  // Empty when the shape runs; else why not (for GTEST_SKIP).
  std::string prepare(const Case& c) {
    if (att_.status() != CUDNN_STATUS_SUCCESS)
      return std::string("cudnnCreate failed: ") + cudnnGetErrorString(att_.status());
    std::string why;
    const cudnnStatus_t st = att_.supports(kc::ElemType::kBF16, c.B, c.S, c.NH, c.KVH, c.HS, &why);
    if (st != CUDNN_STATUS_SUCCESS) return "cuDNN refuses " + c.str() + ": " + why;
    const size_t bytes =
        std::max(att_.forward_workspace_bytes(kc::ElemType::kBF16, c.B, c.S, c.NH, c.KVH, c.HS),
                 att_.backward_workspace_bytes(kc::ElemType::kBF16, c.B, c.S, c.NH, c.KVH, c.HS));
    workspace_ = std::make_unique<DeviceBuffer>(bytes);
    return "";
  }
  kc::CudnnAttention& att() { return att_; }
  void* workspace() const { return workspace_->get(); }
  void forward(Problem& p) {
    const Case& c = p.c;
    ASSERT_EQ(att_.forward(p.out.get(), p.lse.f32(), p.d_qkv.get(), kc::ElemType::kBF16, c.B, c.S,
                           c.NH, c.KVH, c.HS, workspace_->get(), nullptr),
              CUDNN_STATUS_SUCCESS)
        << "cuDNN forward " << c.str();
  }
  // dqkv is first filled with garbage: cuDNN must overwrite it, not add to it.
  void backward(Problem& p, const DeviceBuffer& fwd_out, const DeviceBuffer& fwd_lse) {
    const Case& c = p.c;
    upload_bf16(p.dqkv, random(p.qkv.size(), 999, 10.f));
    ASSERT_EQ(
        att_.backward(p.dqkv.get(), p.d_dout.get(), p.d_qkv.get(), fwd_out.get(), fwd_lse.f32(),
                      kc::ElemType::kBF16, c.B, c.S, c.NH, c.KVH, c.HS, workspace_->get(), nullptr),
        CUDNN_STATUS_SUCCESS)
        << "cuDNN backward " << c.str();
  }

 private:
  kc::CudnnAttention att_;
  std::unique_ptr<DeviceBuffer> workspace_;
};

// Each shape's test skips without a device, and with cuDNN's reason where it refuses the shape.
class CudnnAttentionShape : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string why = cudnn.prepare(GetParam());
    if (!why.empty()) GTEST_SKIP() << why;
  }
  CudnnRunner cudnn;
};

TEST_P(CudnnAttentionShape, ForwardMatchesCpuAndFlash) {
  const Case c = GetParam();
  Problem p(c, 100 + static_cast<uint64_t>(c.S) * 1000 + c.HS);
  cudnn.forward(p);
  p.flash_forward();
  const CpuAttention cpu(p.qkv, p.dout, c);
  const std::vector<float> out = download_bf16(p.out), lse = download_f32(p.lse);
  expect_close("cudnn out vs cpu, " + c.str(), out, cpu.out, kTolBf16);
  expect_close("cudnn lse vs reference, " + c.str(), lse, reference_lse(p.qkv, c), kTolLse);
  expect_close("cudnn out vs flash, " + c.str(), out, download_bf16(p.flash_out), kTolBf16);
  expect_close("cudnn lse vs flash, " + c.str(), lse, download_f32(p.flash_lse), kTolLse);
  // A second call runs the cached plan on the same inputs: the same result.
  cudnn.forward(p);
  expect_close("cudnn out, second call, " + c.str(), download_bf16(p.out), out, 0.0);
}

TEST_P(CudnnAttentionShape, BackwardMatchesCpuAndFlash) {
  const Case c = GetParam();
  Problem p(c, 200 + static_cast<uint64_t>(c.S) * 1000 + c.HS);
  cudnn.forward(p);
  cudnn.backward(p, p.out, p.lse);
  p.flash_forward();
  p.flash_backward(p.flash_out, p.flash_lse);
  const CpuAttention cpu(p.qkv, p.dout, c);
  const std::vector<float> dqkv = download_bf16(p.dqkv);
  expect_close("cudnn dqkv vs cpu, " + c.str(), dqkv, cpu.dqkv, kTolBf16);
  expect_close("cudnn dqkv vs flash, " + c.str(), dqkv, download_bf16(p.flash_dqkv), kTolBf16);
}

// The header's promise: cuDNN's lse is the flash kernels' lse, so the two mix op by op.
TEST_P(CudnnAttentionShape, ForwardAndBackwardMixWithFlash) {
  const Case c = GetParam();
  Problem p(c, 300 + static_cast<uint64_t>(c.S) * 1000 + c.HS);
  const CpuAttention cpu(p.qkv, p.dout, c);
  // cuDNN forward, flash backward.
  cudnn.forward(p);
  p.flash_backward(p.out, p.lse);
  expect_close("cudnn forward + flash backward vs cpu, " + c.str(), download_bf16(p.flash_dqkv),
               cpu.dqkv, kTolBf16);
  // Flash forward, cuDNN backward.
  p.flash_forward();
  cudnn.backward(p, p.flash_out, p.flash_lse);
  expect_close("flash forward + cudnn backward vs cpu, " + c.str(), download_bf16(p.dqkv), cpu.dqkv,
               kTolBf16);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionShape, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           const Case& c = param_info.param;
                           return "B" + std::to_string(c.B) + "_S" + std::to_string(c.S) + "_NH" +
                                  std::to_string(c.NH) + "_KVH" + std::to_string(c.KVH) + "_HS" +
                                  std::to_string(c.HS);
                         });

// Refused before any graph is built, so no device is needed (construction without one leaves
// the handle's failure in status(), which these refusals do not reach).
TEST(CudnnAttention, RefusesF32AndOddHeadSizesWithReasons) {
  kc::CudnnAttention att;
  std::string why;
  EXPECT_EQ(att.supports(kc::ElemType::kF32, 2, 64, 3, 3, 64, &why), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_NE(why.find("f32"), std::string::npos) << why;
  std::cout << "[   NOTE   ] f32: " << why << "\n";
  // 36 is not a multiple of 8 (72 is, and within 128, so cuDNN may run it), 136 is above 128.
  EXPECT_EQ(att.supports(kc::ElemType::kBF16, 2, 64, 3, 3, 36, &why), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_NE(why.find("36 is not a multiple of 8"), std::string::npos) << why;
  std::cout << "[   NOTE   ] HS 36: " << why << "\n";
  EXPECT_EQ(att.supports(kc::ElemType::kBF16, 2, 64, 3, 3, 136, &why), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_NE(why.find("136 is above 128"), std::string::npos) << why;
  std::cout << "[   NOTE   ] HS 136: " << why << "\n";
  EXPECT_EQ(att.supports(kc::ElemType::kBF16, 0, 64, 3, 3, 64, &why), CUDNN_STATUS_BAD_PARAM);
  // Key/value heads that do not divide the query heads are refused by argument, naming both.
  EXPECT_EQ(att.supports(kc::ElemType::kBF16, 2, 64, 4, 3, 64, &why), CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(why.find("KVH 3"), std::string::npos) << why;
  // A refused shape needs no workspace and runs nothing.
  EXPECT_EQ(att.forward_workspace_bytes(kc::ElemType::kF32, 2, 64, 3, 3, 64), 0u);
  EXPECT_EQ(att.backward_workspace_bytes(kc::ElemType::kBF16, 2, 64, 3, 3, 36), 0u);
  EXPECT_EQ(
      att.forward(nullptr, nullptr, nullptr, kc::ElemType::kF32, 2, 64, 3, 3, 64, nullptr, nullptr),
      CUDNN_STATUS_NOT_SUPPORTED);
}

TEST(CudnnAttention, ReportsVersionAndRejectsMisalignedPointers) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Case c{2, 128, 3, 3, 64};
  CudnnRunner cudnn;
  const std::string why = cudnn.prepare(c);
  std::cout << "[   NOTE   ] cuDNN " << cudnnGetVersion() << ": " << c.str() << " "
            << (why.empty() ? "runs on cuDNN" : why) << "\n";
  if (!why.empty()) GTEST_SKIP() << why;
  Problem p(c, 400);
  char* out = static_cast<char*>(p.out.get());
  EXPECT_EQ(cudnn.att().forward(out + 2, p.lse.f32(), p.d_qkv.get(), kc::ElemType::kBF16, c.B, c.S,
                                c.NH, c.KVH, c.HS, cudnn.workspace(), nullptr),
            CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER);
}

}  // namespace
}  // namespace strata
