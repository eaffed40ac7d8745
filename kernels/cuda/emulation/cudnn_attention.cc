// cudnn_attention.cc (emulation build) — cuDNN is not emulated: CudnnAttention refuses every
// shape with that reason, as it refuses a shape cuDNN has no engine for, so a run that asks for
// train.attention_backend "cudnn" stops with it and the cuDNN tests skip saying so. Also the
// cuDNN and cuBLASLt status names the backend's error messages use.
#include "kernels/cuda/cudnn_attention.h"

#include <cublasLt.h>

namespace strata::kernels::cuda {

namespace {
constexpr const char* kNotEmulated =
    "cuDNN's fused attention is not emulated (CUDA emulation build)";
}  // namespace

struct CudnnAttention::Plan {};

CudnnAttention::CudnnAttention() : status_(CUDNN_STATUS_SUCCESS) {}
CudnnAttention::~CudnnAttention() = default;

cudnnStatus_t CudnnAttention::supports(ElemType, int, int, int, int, int, std::string* why,
                                       FlashMask) {
  if (why != nullptr) *why = kNotEmulated;
  return CUDNN_STATUS_NOT_SUPPORTED;
}
size_t CudnnAttention::forward_workspace_bytes(ElemType, int, int, int, int, int, FlashMask) {
  return 0;
}
size_t CudnnAttention::backward_workspace_bytes(ElemType, int, int, int, int, int, FlashMask) {
  return 0;
}
cudnnStatus_t CudnnAttention::forward(void*, float*, const void*, ElemType, int, int, int, int, int,
                                      void*, cudaStream_t, FlashMask) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t CudnnAttention::backward(void*, const void*, const void*, const void*, const float*,
                                       ElemType, int, int, int, int, int, void*, cudaStream_t,
                                       FlashMask) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

}  // namespace strata::kernels::cuda

extern "C" {
const char* cudnnGetErrorString(cudnnStatus_t status) {
  return status == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS"
         : status == CUDNN_STATUS_NOT_SUPPORTED
             ? "CUDNN_STATUS_NOT_SUPPORTED (cuDNN is not emulated)"
             : "CUDNN_STATUS_* (cuDNN is not emulated)";
}
size_t cudnnGetVersion(void) {
  return 0;  // no cuDNN
}
const char* cublasLtGetStatusName(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS         ? "CUBLAS_STATUS_SUCCESS"
         : status == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED"
         : status == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
                                                 : "CUBLAS_STATUS_*";
}
const char* cublasLtGetStatusString(cublasStatus_t status) {
  return cublasLtGetStatusName(status);
}
}  // extern "C"
