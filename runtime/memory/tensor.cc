#include "runtime/memory/tensor.h"

#include <cstring>
#include <sstream>

#include "runtime/base/check.h"

namespace strata {

struct Tensor::Storage {
  Storage(Allocator& a, size_t n, MemCategory c) : alloc(a), bytes(n), category(c) {
    ptr = alloc.allocate(bytes, category);
  }
  ~Storage() { alloc.free(ptr, bytes, category); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  Allocator& alloc;
  size_t bytes;
  MemCategory category;
  void* ptr = nullptr;
};

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
  }
  return 0;
}

const char* to_string(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    STRATA_CHECK(d >= 0, "negative dimension in shape " << shape_string(s));
    n *= d;
  }
  return n;
}

std::string shape_string(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory category, Allocator& alloc) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = alloc.device();
  t.category_ = category;
  t.storage_ = std::make_shared<Storage>(alloc, t.bytes(), category);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory category, Allocator& alloc) {
  STRATA_CHECK(alloc.device() == Device::kCPU, "Tensor::zeros is for host tensors");
  Tensor t = empty(shape, dtype, category, alloc);
  if (t.bytes()) std::memset(t.data(), 0, t.bytes());
  return t;
}

Tensor Tensor::view(int64_t offset, const Shape& shape) const {
  const int64_t n = shape_numel(shape);
  STRATA_CHECK(offset >= 0 && offset + n <= numel_,
               "view of " << n << " elements at " << offset << " exceeds " << numel_);
  Tensor t = *this;
  t.offset_ = offset_ + offset;
  t.shape_ = shape;
  t.numel_ = n;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  STRATA_CHECK(shape_numel(shape) == numel_,
               "reshape " << shape_string(shape_) << " to " << shape_string(shape));
  return view(0, shape);
}

void* Tensor::data() const {
  if (!storage_ || !storage_->ptr) return nullptr;
  return static_cast<char*>(storage_->ptr) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

float* Tensor::f32() const {
  STRATA_CHECK(dtype_ == DType::kF32, "tensor is " << to_string(dtype_) << ", not f32");
  return static_cast<float*>(data());
}
int32_t* Tensor::i32() const {
  STRATA_CHECK(dtype_ == DType::kI32, "tensor is " << to_string(dtype_) << ", not i32");
  return static_cast<int32_t*>(data());
}
uint16_t* Tensor::bf16() const {
  STRATA_CHECK(dtype_ == DType::kBF16, "tensor is " << to_string(dtype_) << ", not bf16");
  return static_cast<uint16_t*>(data());
}

}  // namespace strata
