// backend_cuda.cu — the CUDA backend: every Backend op on one GPU, fp32, on one compute stream.
//
// First version, written and compile-tested without a GPU (issue 7): GEMMs through cuBLAS (fp32,
// row-major via the transposed column-major identities), the attention core as batched GEMMs
// over the saved S×S probabilities (the same algorithm as the CPU backend; the fused flash-style
// kernel and bf16 are still to come), and one straightforward kernel per elementwise or row op.
// Weight-gradient accumulations across rows use atomicAdd, so results match the CPU backend to
// float rounding, not bit for bit. tests/test_cuda_backend.cc compares every op with the CPU
// backend on random inputs and skips where no device exists.
//
// Memory comes from a caching allocator: freed blocks are kept per rounded size and reused, so the
// per-op temporaries of the model never reach cudaMalloc after the first iteration; the base
// Allocator keeps the same per-category accounting as on the CPU (cached-but-free bytes are not
// counted: they belong to no category).
//
// Thread-safety: as Backend (one training thread); the allocator is mutex-guarded.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/check.h"
#include "runtime/cuda/nccl_check.h"

#define CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                     \
    const cublasStatus_t strata_cublas_rc_ = (expr);                                       \
    if (strata_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::strata::fatal(std::string("cuBLAS call failed: " #expr ": status ") +              \
                          std::to_string(static_cast<int>(strata_cublas_rc_)),             \
                      __FILE__, __LINE__);                                                 \
  } while (0)

namespace strata {
namespace {

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

// ---- kernels ----------------------------------------------------------------------------

__global__ void add_bias_kernel(float* out, const float* bias, int64_t N, int OC) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < N * OC) out[i] += bias[i % OC];
}

// dbias (OC) += Σ_n dout (N, OC): one thread per output column, rows walked in order.
__global__ void bias_grad_kernel(float* dbias, const float* dout, int64_t N, int OC) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float s = 0.f;
  for (int64_t n = 0; n < N; ++n) s += dout[n * OC + o];
  dbias[o] += s;
}

// One block per row: mean and reciprocal standard deviation, then the normalised output.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int C) {
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  __shared__ float red[kThreads];
  float s = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  const float m = red[0] / C;
  __syncthreads();
  float v = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) v += (x[c] - m) * (x[c] - m);
  red[threadIdx.x] = v;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  const float r = rsqrtf(red[0] / C + 1e-5f);
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[row * C + c] = (x[c] - m) * r * w[c] + b[c];
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

__global__ void layernorm_backward_kernel(float* dinp, float* dw, float* db, const float* dout,
                                          const float* inp, const float* w, const float* mean,
                                          const float* rstd, int C) {
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const float* g = dout + row * C;
  const float m = mean[row], r = rstd[row];
  __shared__ float red_a[kThreads], red_b[kThreads];
  float a = 0.f, bsum = 0.f;  // Σ dnorm, Σ dnorm·norm
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float n = (x[c] - m) * r;
    const float dn = g[c] * w[c];
    a += dn;
    bsum += dn * n;
    atomicAdd(&dw[c], g[c] * n);
    atomicAdd(&db[c], g[c]);
  }
  red_a[threadIdx.x] = a;
  red_b[threadIdx.x] = bsum;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) {
      red_a[threadIdx.x] += red_a[threadIdx.x + k];
      red_b[threadIdx.x] += red_b[threadIdx.x + k];
    }
    __syncthreads();
  }
  const float mean_dn = red_a[0] / C, mean_dn_n = red_b[0] / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float n = (x[c] - m) * r;
    dinp[row * C + c] += (g[c] * w[c] - mean_dn - n * mean_dn_n) * r;
  }
}

__device__ inline float gelu_tanh_arg(float x) {
  return 0.7978845608028654f * (x + 0.044715f * x * x * x);
}

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = 0.5f * inp[i] * (1.f + tanhf(gelu_tanh_arg(inp[i])));
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = inp[i], t = tanhf(gelu_tanh_arg(x));
  const float sech2 = 1.f - t * t;
  const float d = 0.5f * (1.f + t) +
                  0.5f * x * sech2 * 0.7978845608028654f * (1.f + 3.f * 0.044715f * x * x);
  dinp[i] += d * dout[i];
}

// Causal softmax of one row of scores in place (entries above the diagonal become 0).
__global__ void causal_softmax_kernel(float* att, int S, float scale) {
  const int64_t row = blockIdx.x;  // (b, h, i)
  const int i = static_cast<int>(row % S);
  float* a = att + row * S;
  __shared__ float red[kThreads];
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, a[j] * scale);
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + k]);
    __syncthreads();
  }
  mx = red[0];
  __syncthreads();
  float s = 0.f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const float e = expf(a[j] * scale - mx);
    a[j] = e;
    s += e;
  }
  red[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  const float inv = 1.f / red[0];
  for (int j = threadIdx.x; j < S; j += blockDim.x) a[j] = j <= i ? a[j] * inv : 0.f;
}

// dpre = att ⊙ (datt − Σ_j att·datt) · scale, in place over datt; 0 above the diagonal.
__global__ void softmax_backward_kernel(float* datt, const float* att, int S, float scale) {
  const int64_t row = blockIdx.x;
  const int i = static_cast<int>(row % S);
  const float* a = att + row * S;
  float* d = datt + row * S;
  __shared__ float red[kThreads];
  float s = 0.f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) s += a[j] * d[j];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  const float dot = red[0];
  for (int j = threadIdx.x; j < S; j += blockDim.x) d[j] = j <= i ? a[j] * (d[j] - dot) * scale : 0.f;
}

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte,
                                         const float* wpe, int64_t BS, int S, int C,
                                         int vocab_start, int V_local) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= BS * C) return;
  const int64_t bs = i / C;
  const int c = static_cast<int>(i % C);
  const int t = tokens[bs] - vocab_start;
  float v = (t >= 0 && t < V_local) ? wte[static_cast<int64_t>(t) * C + c] : 0.f;
  if (wpe) v += wpe[static_cast<int64_t>(bs % S) * C + c];
  out[i] = v;
}

__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const float* dout,
                                          const int32_t* tokens, int64_t BS, int S, int C,
                                          int vocab_start, int V_local) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= BS * C) return;
  const int64_t bs = i / C;
  const int c = static_cast<int>(i % C);
  const int t = tokens[bs] - vocab_start;
  if (t >= 0 && t < V_local) atomicAdd(&dwte[static_cast<int64_t>(t) * C + c], dout[i]);
  if (dwpe) atomicAdd(&dwpe[static_cast<int64_t>(bs % S) * C + c], dout[i]);
}

__global__ void ce_row_max_kernel(float* row_max, const float* logits, int64_t N, int ld,
                                  int valid) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  float m = -INFINITY;
  for (int j = 0; j < valid; ++j) m = fmaxf(m, logits[n * ld + j]);
  row_max[n] = m;
}

__global__ void ce_row_sumexp_kernel(float* out, const float* logits, const float* row_max,
                                     int64_t N, int ld, int valid) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  float s = 0.f;
  for (int j = 0; j < valid; ++j) s += expf(logits[n * ld + j] - row_max[n]);
  out[n] = s;
}

__global__ void ce_target_logit_kernel(float* out, const float* logits, const int32_t* targets,
                                       int64_t N, int ld, int vocab_start, int valid) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  const int t = targets[n] - vocab_start;
  out[n] = (t >= 0 && t < valid) ? logits[n * ld + t] : 0.f;
}

__global__ void ce_losses_kernel(float* losses, const float* row_max, const float* row_sumexp,
                                 const float* target_logit, int64_t N) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n < N) losses[n] = logf(row_sumexp[n]) + row_max[n] - target_logit[n];
}

__global__ void ce_backward_kernel(float* dlogits, const float* logits, const float* row_max,
                                   const float* row_sumexp, const int32_t* targets, float scale,
                                   int64_t N, int ld, int vocab_start, int valid) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N * ld) return;
  const int64_t n = i / ld;
  const int j = static_cast<int>(i % ld);
  if (j >= valid) {
    dlogits[i] = 0.f;
    return;
  }
  const float p = expf(logits[i] - row_max[n]) / row_sumexp[n];
  dlogits[i] = scale * (p - (targets[n] - vocab_start == j ? 1.f : 0.f));
}

__global__ void add_inplace_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}
__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
__global__ void scale_kernel(float* y, float s, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] *= s;
}
// Σ x (squared when `square`) into *out in double: per-block partial sums, one atomic per block.
__global__ void sum_kernel(double* out, const float* x, int64_t n, bool square) {
  __shared__ double red[kThreads];
  double s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    s += square ? static_cast<double>(x[i]) * x[i] : x[i];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, red[0]);
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, float lr,
                             float b1, float b2, float eps, float wd, float c1, float c2) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  m[i] = b1 * m[i] + (1.f - b1) * g[i];
  v[i] = b2 * v[i] + (1.f - b2) * g[i] * g[i];
  const float mhat = m[i] / c1, vhat = v[i] / c2;
  p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
}

// bsc (B, S, C) <-> chunks (t, B, S/t, C), one thread per element.
__global__ void seq_permute_kernel(float* bsc, float* chunks, int64_t B, int64_t S, int64_t C,
                                   int t, bool to_chunks) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= B * S * C) return;
  const int64_t c = i % C, s = (i / C) % S, b = i / (C * S);
  const int64_t Sl = S / t, r = s / Sl, sl = s % Sl;
  const int64_t j = ((r * B + b) * Sl + sl) * C + c;
  if (to_chunks) chunks[j] = bsc[i];
  else bsc[i] = chunks[j];
}

// ---- allocator ----------------------------------------------------------------------------

class CudaAllocator final : public Allocator {
 public:
  ~CudaAllocator() override {
    for (auto& [size, list] : cache_)
      for (void* p : list) cudaFree(p);
  }
  Device device() const override { return Device::kCUDA; }

 protected:
  void* raw_allocate(size_t bytes) override {
    const size_t size = round(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(size);
      if (it != cache_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        return p;
      }
    }
    void* p = nullptr;
    if (cudaMalloc(&p, size) != cudaSuccess) {
      release_cache();  // fragmentation: give cached blocks back and try once more
      if (cudaMalloc(&p, size) != cudaSuccess) return nullptr;
    }
    return p;
  }
  void raw_free(void* ptr, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_[round(bytes)].push_back(ptr);
  }

 private:
  // 512-byte granularity below 1 MiB, 2 MiB above: same-shape temporaries reuse exactly.
  static size_t round(size_t b) {
    const size_t g = b < (1u << 20) ? 512 : (2u << 20);
    return (b + g - 1) / g * g;
  }
  void release_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [size, list] : cache_)
      for (void* p : list) CUDA_CHECK(cudaFree(p));
    cache_.clear();
  }
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> cache_;
};

int as_int(int64_t v) {
  STRATA_CHECK(v >= 0 && v <= INT32_MAX, "dimension " << v << " exceeds the int32 range");
  return static_cast<int>(v);
}
int64_t rows(const Tensor& t) { return t.numel() / t.size(-1); }

// ---- the backend --------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    CUDA_CHECK(cudaMalloc(&dsum_, sizeof(double)));
  }
  ~CudaBackend() override {
    cudaFree(dsum_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::kCUDA; }
  std::string name() const override {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device_);
    return std::string("cuda:") + std::to_string(device_) + " (" + prop.name + ", fp32)";
  }
  Allocator& allocator() override { return alloc_; }

  void zero(Tensor& x) override {
    if (x.bytes()) CUDA_CHECK(cudaMemsetAsync(x.data(), 0, x.bytes(), stream_));
  }
  void copy(Tensor& dst, const Tensor& src) override {
    STRATA_CHECK(dst.numel() == src.numel() && dst.dtype() == src.dtype(), "copy size mismatch");
    if (dst.bytes())
      CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.bytes(), cudaMemcpyDeviceToDevice,
                                 stream_));
  }
  void upload(Tensor& dst, const void* host) override {
    if (dst.bytes()) {
      CUDA_CHECK(cudaMemcpyAsync(dst.data(), host, dst.bytes(), cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host buffer may go away at return
    }
  }
  void download(void* host, const Tensor& src) override {
    if (src.bytes()) {
      CUDA_CHECK(cudaMemcpyAsync(host, src.data(), src.bytes(), cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                      const Tensor* bias) override {
    const int N = as_int(rows(inp)), C = as_int(inp.size(-1)), OC = as_int(w.size(0));
    const float one = 1.f, zero_f = 0.f;
    // Row-major out = inp·wᵀ is column-major outᵀ = w·inpᵀ.
    CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, w.f32(), C,
                             inp.f32(), C, &zero_f, out.f32(), OC));
    if (bias)
      add_bias_kernel<<<blocks_for(static_cast<int64_t>(N) * OC), kThreads, 0, stream_>>>(
          out.f32(), bias->f32(), N, OC);
  }
  void matmul_backward_input(Tensor& dinp, const Tensor& dout, const Tensor& w) override {
    const int N = as_int(rows(dinp)), C = as_int(dinp.size(-1)), OC = as_int(w.size(0));
    const float one = 1.f;
    CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, w.f32(), C,
                             dout.f32(), OC, &one, dinp.f32(), C));
  }
  void matmul_backward_weight(Tensor& dw, Tensor* dbias, const Tensor& dout,
                              const Tensor& inp) override {
    const int N = as_int(rows(inp)), C = as_int(inp.size(-1)), OC = as_int(dw.size(0));
    const float one = 1.f;
    CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp.f32(), C,
                             dout.f32(), OC, &one, dw.f32(), C));
    if (dbias)
      bias_grad_kernel<<<blocks_for(OC), kThreads, 0, stream_>>>(dbias->f32(), dout.f32(), N,
                                                                 OC);
  }
  void matmul_backward(Tensor* dinp, Tensor& dw, Tensor* dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& w) override {
    if (dinp) matmul_backward_input(*dinp, dout, w);
    matmul_backward_weight(dw, dbias, dout, inp);
  }

  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                         const Tensor& w, const Tensor& b) override {
    const int64_t N = rows(inp);
    if (N == 0) return;
    layernorm_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_>>>(
        out.f32(), mean.f32(), rstd.f32(), inp.f32(), w.f32(), b.f32(), as_int(inp.size(-1)));
  }
  void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout,
                          const Tensor& inp, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd) override {
    const int64_t N = rows(inp);
    if (N == 0) return;
    layernorm_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_>>>(
        dinp.f32(), dw.f32(), db.f32(), dout.f32(), inp.f32(), w.f32(), mean.f32(), rstd.f32(),
        as_int(inp.size(-1)));
  }
  void gelu_forward(Tensor& out, const Tensor& inp) override {
    if (inp.numel())
      gelu_forward_kernel<<<blocks_for(inp.numel()), kThreads, 0, stream_>>>(out.f32(), inp.f32(),
                                                                             inp.numel());
  }
  void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) override {
    if (inp.numel())
      gelu_backward_kernel<<<blocks_for(inp.numel()), kThreads, 0, stream_>>>(
          dinp.f32(), inp.f32(), dout.f32(), inp.numel());
  }

  // scores (B, NH, S, S) = q·kᵀ per (b, h), as NH strided batched GEMMs per batch element.
  void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int NH) override {
    const int B = as_int(qkv.size(0)), S = as_int(qkv.size(1)), C3 = as_int(qkv.size(-1));
    const int C = C3 / 3, HS = C / NH;
    const float one = 1.f, zero_f = 0.f;
    for (int b = 0; b < B; ++b) {
      const float* q = qkv.f32() + static_cast<int64_t>(b) * S * C3;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att.f32() + static_cast<int64_t>(b) * NH * S * S;
      // Row-major scores (S×S) = q (S×HS, ld 3C) · kᵀ → column-major scoresᵀ = k·qᵀ.
      CUBLAS_CHECK(cublasSgemmStridedBatched(blas_, CUBLAS_OP_T, CUBLAS_OP_N, S, S, HS, &one, k,
                                             C3, HS, q, C3, HS, &zero_f, a, S,
                                             static_cast<int64_t>(S) * S, NH));
      causal_softmax_kernel<<<static_cast<unsigned>(NH * S), kThreads, 0, stream_>>>(
          a, S, 1.f / std::sqrt(static_cast<float>(HS)));
      // Row-major out (S×HS, ld C) = att (S×S) · v (S×HS, ld 3C) → column-major outᵀ = vᵀ·attᵀ.
      float* o = out.f32() + static_cast<int64_t>(b) * S * C;
      CUBLAS_CHECK(cublasSgemmStridedBatched(blas_, CUBLAS_OP_N, CUBLAS_OP_N, HS, S, S, &one, v,
                                             C3, HS, a, S, static_cast<int64_t>(S) * S, &zero_f,
                                             o, C, HS, NH));
    }
  }
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                          int NH) override {
    const int B = as_int(qkv.size(0)), S = as_int(qkv.size(1)), C3 = as_int(qkv.size(-1));
    const int C = C3 / 3, HS = C / NH;
    const float one = 1.f, zero_f = 0.f, scale = 1.f / std::sqrt(static_cast<float>(HS));
    const int64_t need = static_cast<int64_t>(NH) * S * S;
    if (scratch_.numel() < need) {
      scratch_ = Tensor();
      scratch_ = empty({need}, MemCategory::kBuffers);
    }
    for (int b = 0; b < B; ++b) {
      const float* q = qkv.f32() + static_cast<int64_t>(b) * S * C3;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv.f32() + static_cast<int64_t>(b) * S * C3;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att.f32() + static_cast<int64_t>(b) * NH * S * S;
      const float* g = dout.f32() + static_cast<int64_t>(b) * S * C;
      float* da = scratch_.f32();
      // datt (S×S) = dout (S×HS) · vᵀ → column-major dattᵀ = v·doutᵀ.
      CUBLAS_CHECK(cublasSgemmStridedBatched(blas_, CUBLAS_OP_T, CUBLAS_OP_N, S, S, HS, &one, v,
                                             C3, HS, g, C, HS, &zero_f, da, S,
                                             static_cast<int64_t>(S) * S, NH));
      // dv (S×HS) += attᵀ · dout → column-major dvᵀ += doutᵀ·att.
      CUBLAS_CHECK(cublasSgemmStridedBatched(blas_, CUBLAS_OP_N, CUBLAS_OP_T, HS, S, S, &one, g,
                                             C, HS, a, S, static_cast<int64_t>(S) * S, &one, dv,
                                             C3, HS, NH));
      softmax_backward_kernel<<<static_cast<unsigned>(NH * S), kThreads, 0, stream_>>>(da, a, S,
                                                                                     scale);
      // dq (S×HS) += dpre · k → column-major dqᵀ += kᵀ·dpreᵀ.
      CUBLAS_CHECK(cublasSgemmStridedBatched(blas_, CUBLAS_OP_N, CUBLAS_OP_N, HS, S, S, &one, k,
                                             C3, HS, da, S, static_cast<int64_t>(S) * S, &one,
                                             dq, C3, HS, NH));
      // dk (S×HS) += dpreᵀ · q → column-major dkᵀ += qᵀ·dpre.
      CUBLAS_CHECK(cublasSgemmStridedBatched(blas_, CUBLAS_OP_N, CUBLAS_OP_T, HS, S, S, &one, q,
                                             C3, HS, da, S, static_cast<int64_t>(S) * S, &one,
                                             dk, C3, HS, NH));
    }
  }

  void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                         int vocab_start) override {
    const int64_t BS = tokens.numel();
    const int S = as_int(tokens.size(1)), C = as_int(wte.size(1));
    if (BS)
      embedding_forward_kernel<<<blocks_for(BS * C), kThreads, 0, stream_>>>(
          out.f32(), tokens.i32(), wte.f32(), wpe ? wpe->f32() : nullptr, BS, S, C, vocab_start,
          as_int(wte.size(0)));
  }
  void embedding_backward(Tensor& dwte, Tensor* dwpe, const Tensor& dout, const Tensor& tokens,
                          int vocab_start) override {
    const int64_t BS = tokens.numel();
    const int S = as_int(tokens.size(1)), C = as_int(dwte.size(1));
    if (BS)
      embedding_backward_kernel<<<blocks_for(BS * C), kThreads, 0, stream_>>>(
          dwte.f32(), dwpe ? dwpe->f32() : nullptr, dout.f32(), tokens.i32(), BS, S, C,
          vocab_start, as_int(dwte.size(0)));
  }

  void ce_row_max(Tensor& row_max, const Tensor& logits, int valid) override {
    const int64_t N = rows(logits);
    if (N)
      ce_row_max_kernel<<<blocks_for(N), kThreads, 0, stream_>>>(row_max.f32(), logits.f32(), N,
                                                                 as_int(logits.size(-1)), valid);
  }
  void ce_row_sumexp(Tensor& row_sumexp, const Tensor& logits, const Tensor& row_max,
                     int valid) override {
    const int64_t N = rows(logits);
    if (N)
      ce_row_sumexp_kernel<<<blocks_for(N), kThreads, 0, stream_>>>(
          row_sumexp.f32(), logits.f32(), row_max.f32(), N, as_int(logits.size(-1)), valid);
  }
  void ce_target_logit(Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                       int vocab_start, int valid) override {
    const int64_t N = rows(logits);
    if (N)
      ce_target_logit_kernel<<<blocks_for(N), kThreads, 0, stream_>>>(
          target_logit.f32(), logits.f32(), targets.i32(), N, as_int(logits.size(-1)),
          vocab_start, valid);
  }
  void ce_losses(Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                 const Tensor& target_logit) override {
    if (losses.numel())
      ce_losses_kernel<<<blocks_for(losses.numel()), kThreads, 0, stream_>>>(
          losses.f32(), row_max.f32(), row_sumexp.f32(), target_logit.f32(), losses.numel());
  }
  void ce_backward(Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                   const Tensor& row_sumexp, const Tensor& targets, float scale, int vocab_start,
                   int valid) override {
    const int64_t N = rows(logits), ld = logits.size(-1);
    if (N)
      ce_backward_kernel<<<blocks_for(N * ld), kThreads, 0, stream_>>>(
          dlogits.f32(), logits.f32(), row_max.f32(), row_sumexp.f32(), targets.i32(), scale, N,
          as_int(ld), vocab_start, valid);
  }

  void seq_interleave(Tensor& out, const Tensor& chunks, int t) override {
    if (out.numel())
      seq_permute_kernel<<<blocks_for(out.numel()), kThreads, 0, stream_>>>(
          out.f32(), chunks.f32(), out.size(0), out.size(1), out.size(2), t, false);
  }
  void seq_deinterleave(Tensor& chunks, const Tensor& in, int t) override {
    if (in.numel())
      seq_permute_kernel<<<blocks_for(in.numel()), kThreads, 0, stream_>>>(
          in.f32(), chunks.f32(), in.size(0), in.size(1), in.size(2), t, true);
  }

  void add_inplace(Tensor& y, const Tensor& x) override {
    if (y.numel())
      add_inplace_kernel<<<blocks_for(y.numel()), kThreads, 0, stream_>>>(y.f32(), x.f32(),
                                                                          y.numel());
  }
  void add(Tensor& out, const Tensor& a, const Tensor& b) override {
    if (out.numel())
      add_kernel<<<blocks_for(out.numel()), kThreads, 0, stream_>>>(out.f32(), a.f32(), b.f32(),
                                                                   out.numel());
  }
  void scale_inplace(Tensor& y, float s) override {
    if (y.numel())
      scale_kernel<<<blocks_for(y.numel()), kThreads, 0, stream_>>>(y.f32(), s, y.numel());
  }
  double sum_squares(const Tensor& x) override { return reduce(x, true); }
  double sum(const Tensor& x) override { return reduce(x, false); }

  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int step) override {
    if (!param.numel()) return;
    const float c1 = 1.f - std::pow(beta1, static_cast<float>(step));
    const float c2 = 1.f - std::pow(beta2, static_cast<float>(step));
    adamw_kernel<<<blocks_for(param.numel()), kThreads, 0, stream_>>>(
        param.f32(), grad.f32(), m.f32(), v.f32(), param.numel(), lr, beta1, beta2, eps,
        weight_decay, c1, c2);
  }

 private:
  double reduce(const Tensor& x, bool square) {
    CUDA_CHECK(cudaMemsetAsync(dsum_, 0, sizeof(double), stream_));
    if (x.numel()) {
      const unsigned grid = std::min<unsigned>(1024, blocks_for(x.numel()));
      sum_kernel<<<grid, kThreads, 0, stream_>>>(dsum_, x.f32(), x.numel(), square);
    }
    double h = 0;
    CUDA_CHECK(cudaMemcpyAsync(&h, dsum_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return h;
  }

  int device_;
  CudaAllocator alloc_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  double* dsum_ = nullptr;
  Tensor scratch_;  // attention backward: (NH, S, S) score gradients of one batch element
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

}  // namespace strata
