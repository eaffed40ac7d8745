// nccl_check.h — CUDA_CHECK and NCCL_CHECK: on failure print the failing call, file:line, the
// rank and host, and the library's own error string, then abort the whole job (check.h fatal()).
// For device and communication failures mid-step, which no user input can fix.
//
// Only runtime/ and launch/ may include this header (it includes nccl.h).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "runtime/base/check.h"

#ifndef CUDA_CHECK
#define CUDA_CHECK(expr)                                             \
  do {                                                               \
    const cudaError_t strata_cuda_rc_ = (expr);                      \
    if (strata_cuda_rc_ != cudaSuccess) {                            \
      ::strata::fatal(std::string("CUDA call failed: " #expr ": ") + \
                          cudaGetErrorName(strata_cuda_rc_) + ": " + \
                          cudaGetErrorString(strata_cuda_rc_),       \
                      __FILE__, __LINE__);                           \
    }                                                                \
  } while (0)
#endif

// ncclInProgress is not an error: it is what non-blocking communicators return while working.
#ifndef NCCL_CHECK
#define NCCL_CHECK(expr)                                                       \
  do {                                                                         \
    const ncclResult_t strata_nccl_rc_ = (expr);                               \
    if (strata_nccl_rc_ != ncclSuccess && strata_nccl_rc_ != ncclInProgress) { \
      const char* strata_nccl_last_ = ncclGetLastError(nullptr);               \
      ::strata::fatal(std::string("NCCL call failed: " #expr ": ") +           \
                          ncclGetErrorString(strata_nccl_rc_) +                \
                          (strata_nccl_last_ && *strata_nccl_last_             \
                               ? std::string(" (") + strata_nccl_last_ + ")"   \
                               : std::string()),                               \
                      __FILE__, __LINE__);                                     \
    }                                                                          \
  } while (0)
#endif
