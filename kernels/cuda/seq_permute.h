// seq_permute.h — the sequence-parallel layout change on CUDA: a permutation of raw device
// buffers, launched on the caller's stream. The CPU backend does the same copy in
// runtime/backend/backend_cpu.cc.
//
// Each function returns the launch's cudaError_t (cudaGetLastError after the launch) for the
// caller to check; zero-sized calls launch nothing and return cudaSuccess.
//
// Thread-safety: functions touch only their arguments; the usual stream-ordering rules apply.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace strata::kernels::cuda {

// bsc (B, S, C) <-> chunks (t, B, S/t, C) of elem_bytes-sized elements (2 or 4): to_chunks
// copies bsc into chunks, else chunks into bsc. S % t == 0.
cudaError_t seq_permute(void* bsc, void* chunks, size_t elem_bytes, int64_t B, int64_t S, int64_t C,
                        int t, bool to_chunks, cudaStream_t stream);

}  // namespace strata::kernels::cuda
