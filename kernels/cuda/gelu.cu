// gelu.cu — the kernels of gelu.h: the elementwise maps of map.cuh with the activations and
// their gradients as their ops.
#include <cuda_runtime.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/map.cuh"

namespace strata::kernels::cuda {
namespace {

// Through 0.5·(1 + tanh(u)) = σ(2u) = 1 / (1 + e^(−2u)), as the CPU reference: one exp and no
// overflow in either tail.

constexpr float kGeluK = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  return x / (1.f + expf(-2.f * kGeluK * (x + kGeluC * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float s = 1.f / (1.f + expf(-2.f * kGeluK * (x + kGeluC * x * x * x)));  // σ(2u)
  // d/dx [x·σ(2u)] = σ + x·σ(1 − σ)·2k(1 + 3c·x²); w·x multiplied in one factor at a time
  // keeps every product finite in the tails (x³ alone overflows for |x| > 1e12).
  const float w = 2.f * kGeluK * s * (1.f - s);
  return s + w * x + 3.f * kGeluC * (((w * x) * x) * x);
}

struct Gelu {
  __device__ float operator()(float x) const { return gelu(x); }
};
struct GeluBackward {  // (inp, dout) -> dinp
  __device__ float operator()(float x, float g) const { return g * gelu_grad(x); }
};

constexpr float kInvSqrt2 = 0.7071067811865476f;    // 1/√2
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1/√(2π)

struct GeluErf {
  __device__ float operator()(float x) const { return 0.5f * x * (1.f + erff(x * kInvSqrt2)); }
};
struct GeluErfBackward {  // (inp, dout) -> dinp; exp(−x²/2) underflows to 0 in the tails
  __device__ float operator()(float x, float g) const {
    return g * (0.5f * (1.f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x));
  }
};
struct Tanh {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct TanhBackward {  // (out, dout) -> dinp
  __device__ float operator()(float y, float g) const { return (1.f - y * y) * g; }
};

template <class Op>
cudaError_t unary(void* out, const void* inp, ElemType t, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(map_kernel<T, T, Op>, group_grid(n), kThreads, 0, stream, static_cast<T*>(out),
           static_cast<const T*>(inp), n, vec_aligned(out) && vec_aligned(inp), Op{});
    return cudaGetLastError();
  });
}

template <class Op>
cudaError_t binary(void* out, const void* a, const void* b, ElemType t, int64_t n,
                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(map2_kernel<T, T, T, Op>, group_grid(n), kThreads, 0, stream, static_cast<T*>(out),
           static_cast<const T*>(a), static_cast<const T*>(b), n,
           vec_aligned(out) && vec_aligned(a) && vec_aligned(b), Op{});
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t gelu_forward(void* out, const void* inp, ElemType t, int64_t n, cudaStream_t stream) {
  return unary<Gelu>(out, inp, t, n, stream);
}

cudaError_t gelu_backward(void* dinp, const void* inp, const void* dout, ElemType t, int64_t n,
                          cudaStream_t stream) {
  return binary<GeluBackward>(dinp, inp, dout, t, n, stream);
}

cudaError_t gelu_erf_forward(void* out, const void* inp, ElemType t, int64_t n,
                             cudaStream_t stream) {
  return unary<GeluErf>(out, inp, t, n, stream);
}

cudaError_t gelu_erf_backward(void* dinp, const void* inp, const void* dout, ElemType t, int64_t n,
                              cudaStream_t stream) {
  return binary<GeluErfBackward>(dinp, inp, dout, t, n, stream);
}

cudaError_t tanh_forward(void* out, const void* inp, ElemType t, int64_t n, cudaStream_t stream) {
  return unary<Tanh>(out, inp, t, n, stream);
}

cudaError_t tanh_backward(void* dinp, const void* out, const void* dout, ElemType t, int64_t n,
                          cudaStream_t stream) {
  return binary<TanhBackward>(dinp, out, dout, t, n, stream);
}

}  // namespace strata::kernels::cuda
