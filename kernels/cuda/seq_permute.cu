// seq_permute.cu — the kernel of seq_permute.h: one thread per element, a grid-stride loop.
#include <cuda_runtime.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/seq_permute.h"

namespace strata::kernels::cuda {
namespace {

// bsc (B, S, C) <-> chunks (t, B, S/t, C), one thread per element, moved as raw bits of E.
template <class E>
__global__ void seq_permute_kernel(E* bsc, E* chunks, int64_t B, int64_t S, int64_t C, int t,
                                   bool to_chunks) {
  STRATA_FOR_EACH(i, B * S * C) {
    const int64_t c = i % C, s = (i / C) % S, b = i / (C * S);
    const int64_t Sl = S / t, r = s / Sl, sl = s % Sl;
    const int64_t j = ((r * B + b) * Sl + sl) * C + c;
    if (to_chunks)
      chunks[j] = bsc[i];
    else
      bsc[i] = chunks[j];
  }
}

}  // namespace

cudaError_t seq_permute(void* bsc, void* chunks, size_t elem_bytes, int64_t B, int64_t S, int64_t C,
                        int t, bool to_chunks, cudaStream_t stream) {
  const int64_t n = B * S * C;
  if (n == 0) return cudaSuccess;
  if (elem_bytes == 2)
    launch(seq_permute_kernel<uint16_t>, elementwise_grid(n), kThreads, 0, stream,
           static_cast<uint16_t*>(bsc), static_cast<uint16_t*>(chunks), B, S, C, t, to_chunks);
  else
    launch(seq_permute_kernel<uint32_t>, elementwise_grid(n), kThreads, 0, stream,
           static_cast<uint32_t*>(bsc), static_cast<uint32_t*>(chunks), B, S, C, t, to_chunks);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
