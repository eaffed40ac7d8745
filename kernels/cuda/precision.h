// precision.h — the CUDA cast between f32 and bf16 buffers, launched on the caller's stream.
// It rounds by the very function of kernels/cpu/precision.h (the reference beside it): to nearest
// even, NaN kept a quiet NaN.
//
// Where the types agree, cast copies and returns cudaMemcpyAsync's error.
//
// Each function returns the launch's cudaError_t (cudaGetLastError after the launch) for the
// caller to check; zero-sized calls launch nothing and return cudaSuccess.
//
// Thread-safety: functions touch only their arguments; the usual stream-ordering rules apply.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

// dst (n) = src converted (f32 <-> bf16, round to nearest even), or copied when the types agree.
cudaError_t cast(void* dst, ElemType dst_type, const void* src, ElemType src_type, int64_t n,
                 cudaStream_t stream);

}  // namespace strata::kernels::cuda
