// backend_cuda.cu — the CUDA backend: every Backend op on one GPU, fp32 or bf16 mixed precision,
// on one compute stream.
//
// Written and compile-tested without a GPU (issue 7); tests/test_cuda_backend.cc and
// tests/cuda/test_cuda_kernels.cc compare every op with the CPU and skip where no device exists.
//
// What runs where:
// - GEMMs: cuBLASLt through kernels/cuda/gemm_lt.h, compute type f32 (true fp32 for f32
//   operands, f32 accumulation for bf16 ones), the bias fused in the epilogue and dbias taken by
//   the BGRADB epilogue where cuBLASLt offers them, else a separate bias / column-sum kernel.
// - Attention: the fused flash-style kernels of kernels/cuda/flash_attention.h; `saved` holds
//   the (B, NH, S) log-sum-exp rows instead of the CPU's (B, NH, S, S) probabilities. With
//   train.attention_backend "cudnn", bf16 attention runs on cuDNN's fused flash attention
//   (kernels/cuda/cudnn_attention.h; same layouts and the same log-sum-exp, so `saved` is the
//   same); a shape cuDNN refuses is an error naming why, never a silent switch of kernels.
//   Grouped-query attention (KVH < NH key/value heads) runs on both, in the qkv layout of
//   runtime/backend/backend.h.
// - Everything else: the kernels of kernels/cuda, one header per op family (layernorm.h,
//   rmsnorm.h, rope.h, gelu.h, swiglu.h, elementwise.h, gemm_bias.h, embedding.h,
//   cross_entropy.h, precision.h, seq_permute.h, attention_decode.h for generation with a
//   key/value cache) and optim.h.
// Native bf16: every kernel reads and writes f32 or bf16 itself (computing in f32) for the type
// layout the models use — activations and their gradients of one type, weights of one type,
// statistics and parameter gradients f32. Any other mix (say an f32 output of a bf16 input, or
// a bf16 statistic) goes through MixedPrecisionScope, which widens to f32 temporaries and
// rounds back: correct, one extra cast per operand. Two GEMM cases go that way too: A and B of
// different types (cuBLASLt needs one type) and f32 A/B into a bf16 C (no such cuBLASLt kernel).
//
// Sums differ in order from the CPU (block reductions, cuBLASLt tiling, atomicAdd for weight
// gradients and the attention dq), so results match the CPU backend to float rounding, not bit
// for bit.
//
// Memory comes from a caching allocator: freed blocks are kept per rounded size and reused, so the
// per-op temporaries of the model never reach cudaMalloc after the first iteration; the base
// Allocator keeps the same per-category accounting as on the CPU (cached-but-free bytes are not
// counted: they belong to no category). A temporary freed at the end of an op may be handed to
// the next op before the GPU has finished with it: safe because every op runs on the one stream.
//
#include <cuda_runtime.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernels/cuda/precision.h"
#include "runtime/backend/cuda/backend_cuda.h"
#include "runtime/comm/comm.h"

namespace strata {
namespace cuda_backend {

// ---- staging for host transports ------------------------------------------------------------

// Device <-> host copies on the compute stream, for ranks that share a GPU and so talk over MPI
// (comm.h, make_staged_communicator). Each copy is followed by a stream synchronisation: to_host
// must see every kernel enqueued so far, and the host buffer of to_device may be freed at return.
class StreamStaging final : public DeviceStaging {
 public:
  explicit StreamStaging(cudaStream_t stream) : stream_(stream) {}
  Device device() const override { return Device::kCUDA; }
  void to_host(void* host, const void* device, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void to_device(void* device, const void* host, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_;
};

CudaBackend::CudaBackend(int device, CudnnAttentionUse cudnn_use)
    : device_(device), cudnn_use_(cudnn_use) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMalloc(&dsum_, sizeof(double)));
  workspace_ = empty({static_cast<int64_t>(kc::GemmLt::kDefaultWorkspaceBytes / sizeof(float))},
                     MemCategory::kBuffers);
  gemm_ = std::make_unique<kc::GemmLt>(workspace_.data(), workspace_.bytes());
  CUBLAS_CHECK(gemm_->status());
  if (cudnn_use_ != CudnnAttentionUse::kNever) {
    cudnn_ = std::make_unique<kc::CudnnAttention>();
    if (cudnn_->status() != CUDNN_STATUS_SUCCESS) {
      if (cudnn_use_ == CudnnAttentionUse::kAlways) {
        throw std::runtime_error(std::string("train.attention_backend \"cudnn\": cudnnCreate "
                                             "failed: ") +
                                 cudnnGetErrorString(cudnn_->status()));
      }
      cudnn_.reset();  // "auto": Strata's kernels
    }
  }
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);  // nothing in flight may outlive its buffers
  cudnn_.reset();
  grouped_.reset();
  gemm_.reset();
  workspace_ = Tensor();
  cudaFree(dsum_);
  cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device_);
  std::string attention;
  if (cudnn_) attention = ", bf16 attention on cuDNN";
  if (cudnn_ && cudnn_use_ == CudnnAttentionUse::kWhereItRuns) attention += " where it runs";
  return std::string("cuda:") + std::to_string(device_) + " (" + prop.name + ", fp32/bf16" +
         attention + ")";
}

// Published dense peaks of the data-centre GPUs we plan for (the same figures as
// configs/clusters); unknown devices leave MFU null rather than guess.
std::optional<double> CudaBackend::peak_flops(const std::string& precision) const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) return std::nullopt;
  const std::string n = prop.name;
  const bool bf16 = precision == "bf16";
  if (n.find("H100") != std::string::npos || n.find("H200") != std::string::npos)
    return bf16 ? 989e12 : 67e12;
  if (n.find("A100") != std::string::npos) return bf16 ? 312e12 : 19.5e12;
  return std::nullopt;
}

// ---- memory ----

void CudaBackend::zero(Tensor& x) {
  if (x.bytes()) CUDA_CHECK(cudaMemsetAsync(x.data(), 0, x.bytes(), stream_));
}

void CudaBackend::copy(Tensor& dst, const Tensor& src) {
  STRATA_CHECK(dst.numel() == src.numel() && dst.dtype() == src.dtype(),
               "copy " << shape_string(src.shape()) << " " << to_string(src.dtype()) << " into "
                       << shape_string(dst.shape()) << " " << to_string(dst.dtype()));
  if (dst.bytes())
    CUDA_CHECK(
        cudaMemcpyAsync(dst.data(), src.data(), dst.bytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::cast(Tensor& dst, const Tensor& src) {
  expect_numel(dst, src.numel(), "cast destination");
  if (same_dtype(dst, src)) return copy(dst, src);
  CUDA_CHECK(kc::cast(dst.data(), et(dst), src.data(), et(src), src.numel(), stream_));
}

void CudaBackend::upload(Tensor& dst, const void* host) {
  if (dst.bytes()) {
    CUDA_CHECK(cudaMemcpyAsync(dst.data(), host, dst.bytes(), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host buffer may go away at return
  }
}

void CudaBackend::download(void* host, const Tensor& src) {
  if (src.bytes()) {
    CUDA_CHECK(cudaMemcpyAsync(host, src.data(), src.bytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

int64_t CudaBackend::device_memory_bytes() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(total_b);
}

// ---- for the communicators ----

std::shared_ptr<DeviceStaging> CudaBackend::comm_staging() {
  if (!staging_) staging_ = std::make_shared<StreamStaging>(stream_);
  return staging_;
}

}  // namespace cuda_backend

std::unique_ptr<Backend> make_cuda_backend(int device, CudnnAttentionUse cudnn) {
  return std::make_unique<cuda_backend::CudaBackend>(device, cudnn);
}

}  // namespace strata
