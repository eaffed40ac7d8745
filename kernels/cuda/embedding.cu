// embedding.cu — the kernels of embedding.h.
//
// One thread per element, a grid-stride loop. The backward scatters with atomicAdd (a token may
// repeat), so its sums match the CPU's to float rounding, not bit for bit.
#include <cuda_runtime.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/map.cuh"

namespace strata::kernels::cuda {
namespace {

template <class TO, class TW>
__global__ void embedding_forward_kernel(TO* out, const int32_t* tokens, const TW* wte,
                                         const TW* wpe, int64_t BS, int S, int C, int vocab_start,
                                         int V_local) {
  STRATA_FOR_EACH(i, BS * C) {
    const int64_t bs = i / C;
    const int c = static_cast<int>(i % C);
    const int t = tokens[bs] - vocab_start;
    float v = (t >= 0 && t < V_local) ? to_float(wte[static_cast<int64_t>(t) * C + c]) : 0.f;
    if (wpe) v += to_float(wpe[(bs % S) * C + c]);
    out[i] = from_float<TO>(v);
  }
}

// A token may repeat within the batch, so its row of dwte is a sum over positions: atomics.
template <class T>
__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const T* dout,
                                          const int32_t* tokens, int64_t BS, int S, int C,
                                          int vocab_start, int V_local) {
  STRATA_FOR_EACH(i, BS * C) {
    const int64_t bs = i / C;
    const int c = static_cast<int>(i % C);
    const float g = to_float(dout[i]);
    const int t = tokens[bs] - vocab_start;
    if (t >= 0 && t < V_local) atomicAdd(&dwte[static_cast<int64_t>(t) * C + c], g);
    if (dwpe) atomicAdd(&dwpe[(bs % S) * C + c], g);
  }
}

}  // namespace

cudaError_t embedding_forward(void* out, ElemType out_type, const int32_t* tokens, const void* wte,
                              const void* wpe, ElemType w_type, int B, int S, int C,
                              int vocab_start, int V_local, cudaStream_t stream) {
  const int64_t BS = static_cast<int64_t>(B) * S;
  if (BS * C == 0) return cudaSuccess;
  return dispatch(out_type, [&](auto to) {
    return dispatch(w_type, [&](auto tw) {
      using TO = typename decltype(to)::type;
      using TW = typename decltype(tw)::type;
      launch(embedding_forward_kernel<TO, TW>, elementwise_grid(BS * C), kThreads, 0, stream,
             static_cast<TO*>(out), tokens, static_cast<const TW*>(wte),
             static_cast<const TW*>(wpe), BS, S, C, vocab_start, V_local);
      return cudaGetLastError();
    });
  });
}

cudaError_t embedding_backward(float* dwte, float* dwpe, const void* dout, ElemType dout_type,
                               const int32_t* tokens, int B, int S, int C, int vocab_start,
                               int V_local, cudaStream_t stream) {
  const int64_t BS = static_cast<int64_t>(B) * S;
  if (BS * C == 0) return cudaSuccess;
  return dispatch(dout_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(embedding_backward_kernel<T>, elementwise_grid(BS * C), kThreads, 0, stream, dwte, dwpe,
           static_cast<const T*>(dout), tokens, BS, S, C, vocab_start, V_local);
    return cudaGetLastError();
  });
}

}  // namespace strata::kernels::cuda
