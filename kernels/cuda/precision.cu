// precision.cu — the kernel of precision.h: the elementwise map of map.cuh with the identity as
// its op, converting as it loads and stores.
#include <cuda_runtime.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/precision.h"

namespace strata::kernels::cuda {
namespace {

struct Identity {
  __device__ float operator()(float x) const { return x; }
};

}  // namespace

cudaError_t cast(void* dst, ElemType dst_type, const void* src, ElemType src_type, int64_t n,
                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (dst_type == src_type)
    return cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * elem_size(dst_type),
                           cudaMemcpyDeviceToDevice, stream);
  return dispatch(dst_type, [&](auto td) {
    return dispatch(src_type, [&](auto ts) {
      using D = typename decltype(td)::type;
      using S = typename decltype(ts)::type;
      launch(map_kernel<D, S, Identity>, group_grid(n), kThreads, 0, stream, static_cast<D*>(dst),
             static_cast<const S*>(src), n, vec_aligned(dst) && vec_aligned(src), Identity{});
      return cudaGetLastError();
    });
  });
}

}  // namespace strata::kernels::cuda
