// elementwise.cu — the kernels of elementwise.h.
//
// Adds and scaling are the elementwise maps of map.cuh (in place where out is a: each group is
// read, then written, by one thread). sum: per-thread partial sums in double over a grid-stride
// loop, a block reduction, one atomicAdd per block; its order differs from the CPU's, so it
// matches it to rounding, not bit for bit.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/map.cuh"

namespace strata::kernels::cuda {
namespace {

struct Scale {
  float s;
  __device__ float operator()(float x) const { return x * s; }
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Per-thread partial sums in double, a block reduction, one atomicAdd per block.
template <class T>
__global__ void __launch_bounds__(kThreads)
    sum_kernel(double* out, const T* x, int64_t n, bool square) {
  __shared__ double part[kThreads / 32];
  double s = 0;
  STRATA_FOR_EACH(i, n) {
    const double v = to_float(x[i]);
    s += square ? v * v : v;
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFullMask, s, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) s += part[w];
    atomicAdd(out, s);
  }
}

}  // namespace

cudaError_t add_inplace(void* y, ElemType y_type, const void* x, ElemType x_type, int64_t n,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(y_type, [&](auto ty) {
    return dispatch(x_type, [&](auto tx) {
      using TY = typename decltype(ty)::type;
      using TX = typename decltype(tx)::type;
      launch(map2_kernel<TY, TY, TX, Sum>, group_grid(n), kThreads, 0, stream, static_cast<TY*>(y),
             static_cast<const TY*>(y), static_cast<const TX*>(x), n,
             vec_aligned(y) && vec_aligned(x), Sum{});
      return cudaGetLastError();
    });
  });
}

cudaError_t add(void* out, ElemType out_type, const void* a, ElemType a_type, const void* b,
                ElemType b_type, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(out_type, [&](auto to) {
    return dispatch(a_type, [&](auto ta) {
      return dispatch(b_type, [&](auto tb) {
        using TO = typename decltype(to)::type;
        using TA = typename decltype(ta)::type;
        using TB = typename decltype(tb)::type;
        launch(map2_kernel<TO, TA, TB, Sum>, group_grid(n), kThreads, 0, stream,
               static_cast<TO*>(out), static_cast<const TA*>(a), static_cast<const TB*>(b), n,
               vec_aligned(out) && vec_aligned(a) && vec_aligned(b), Sum{});
        return cudaGetLastError();
      });
    });
  });
}

cudaError_t scale_inplace(void* y, ElemType t, float s, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(map_kernel<T, T, Scale>, group_grid(n), kThreads, 0, stream, static_cast<T*>(y),
           static_cast<const T*>(y), n, vec_aligned(y), Scale{s});
    return cudaGetLastError();
  });
}

cudaError_t sum(double* out, const void* x, ElemType t, int64_t n, bool square,
                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // Enough blocks to fill the GPU; each thread then loops, so the atomics stay few.
  const unsigned grid = std::min(1024u, elementwise_grid(n));
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(sum_kernel<T>, grid, kThreads, 0, stream, out, static_cast<const T*>(x), n, square);
    return cudaGetLastError();
  });
}

}  // namespace strata::kernels::cuda
