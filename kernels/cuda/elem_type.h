// elem_type.h — the element type of a raw device buffer passed to kernels/cuda.
//
// kernels/ depends on nothing of ours, so the runtime's DType does not reach here: the backend
// maps its f32/bf16 tensors to ElemType at the call. Integer buffers (token ids) are always
// int32_t and need no tag.
#pragma once

#include <cstddef>

namespace strata::kernels::cuda {

enum class ElemType { kF32, kBF16 };

inline size_t elem_size(ElemType t) {
  return t == ElemType::kBF16 ? 2 : 4;
}
inline const char* to_string(ElemType t) {
  return t == ElemType::kBF16 ? "bf16" : "f32";
}

}  // namespace strata::kernels::cuda
