#include "runtime/memory/allocator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/base/check.h"

namespace strata {

const char* to_string(MemCategory c) {
  switch (c) {
    case MemCategory::kParameters:
      return "parameters";
    case MemCategory::kGradients:
      return "gradients";
    case MemCategory::kOptimizer:
      return "optimizer";
    case MemCategory::kActivations:
      return "activations";
    case MemCategory::kBuffers:
      return "buffers";
    case MemCategory::kCount:
      break;
  }
  return "?";
}

const char* to_string(Device d) {
  return d == Device::kCPU ? "cpu" : "cuda";
}

void* Allocator::allocate(size_t bytes, MemCategory category) {
  if (bytes == 0) return nullptr;
  void* p = raw_allocate(bytes);
  STRATA_CHECK(p != nullptr, "out of " << to_string(device()) << " memory allocating "
                                       << format_bytes(static_cast<int64_t>(bytes)) << " for "
                                       << to_string(category));
  std::lock_guard<std::mutex> lock(mu_);
  const int c = static_cast<int>(category);
  stats_.current[c] += static_cast<int64_t>(bytes);
  if (stats_.current[c] > stats_.peak[c]) stats_.peak[c] = stats_.current[c];
  stats_.total_current += static_cast<int64_t>(bytes);
  if (stats_.total_current > stats_.total_peak) stats_.total_peak = stats_.total_current;
  return p;
}

void Allocator::free(void* ptr, size_t bytes, MemCategory category) {
  if (ptr == nullptr) return;
  raw_free(ptr, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.current[static_cast<int>(category)] -= static_cast<int64_t>(bytes);
  stats_.total_current -= static_cast<int64_t>(bytes);
}

MemStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak = stats_.current;
  stats_.total_peak = stats_.total_current;
}

void* CpuAllocator::raw_allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded);
}

void CpuAllocator::raw_free(void* ptr, size_t) {
  std::free(ptr);
}

CpuAllocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace strata
