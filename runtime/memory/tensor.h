// tensor.h — a typed, shaped view of memory owned by an Allocator.
//
// A Tensor is a cheap handle: copies share the same storage (reference counted), and the
// storage is returned to its allocator, with its accounting category, when the last handle goes.
// view() makes a sub-tensor over a contiguous range of the same storage. Tensors are always
// contiguous and row-major; shapes are written outermost first, e.g. (B, T, C).
//
// Thread-safety: as std::shared_ptr: distinct handles may be used from distinct threads; the
// element data itself is not synchronised.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "runtime/memory/allocator.h"

namespace strata {

enum class DType { kF32, kBF16, kI32 };
size_t dtype_size(DType t);
const char* to_string(DType t);

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_string(const Shape& s);  // "(2, 3, 4)"

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised memory of `shape` from `alloc`, accounted under `category`.
  static Tensor empty(const Shape& shape, DType dtype, MemCategory category,
                      Allocator& alloc = cpu_allocator());
  // Zero-filled (host tensors only; device tensors are zeroed by their backend).
  static Tensor zeros(const Shape& shape, DType dtype, MemCategory category,
                      Allocator& alloc = cpu_allocator());

  // numel elements starting at element `offset`, reshaped to `shape`, sharing storage.
  Tensor view(int64_t offset, const Shape& shape) const;
  // Same elements, another shape with the same element count.
  Tensor reshape(const Shape& shape) const;

  bool defined() const { return !shape_.empty(); }
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const { return shape_.at(d < 0 ? d + dim() : d); }
  int64_t numel() const { return numel_; }
  size_t bytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  MemCategory category() const { return category_; }

  void* data() const;
  float* f32() const;
  int32_t* i32() const;
  uint16_t* bf16() const;

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // elements
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCPU;
  MemCategory category_ = MemCategory::kActivations;
};

}  // namespace strata
