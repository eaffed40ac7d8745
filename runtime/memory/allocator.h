// allocator.h — memory with accounting by category.
//
// Every byte Strata allocates for parameters, gradients, optimizer state, activations or
// communication buffers goes through an Allocator, which keeps current and peak bytes per
// category and in total. These figures are what `--dry-run` and the planner predict and what the
// metrics report (mem_peak_bytes), so tests compare prediction with measurement here.
//
// Thread-safety: allocate/free/stats may be called from several threads (the counters are
// guarded by a mutex); a block must be freed by the allocator that made it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace strata {

enum class MemCategory : int {
  kParameters = 0,
  kGradients,
  kOptimizer,
  kActivations,
  kBuffers,  // communication and scratch buffers
  kCount
};
constexpr int kNumMemCategories = static_cast<int>(MemCategory::kCount);
const char* to_string(MemCategory c);

struct MemStats {
  std::array<int64_t, kNumMemCategories> current{};  // [category] bytes live now
  std::array<int64_t, kNumMemCategories> peak{};     // [category] max of current over time
  int64_t total_current = 0;
  int64_t total_peak = 0;  // max over time of the sum (not the sum of per-category peaks)
  int64_t of(MemCategory c) const { return current[static_cast<int>(c)]; }
  int64_t peak_of(MemCategory c) const { return peak[static_cast<int>(c)]; }
};

enum class Device { kCPU, kCUDA };
const char* to_string(Device d);

class Allocator {
 public:
  virtual ~Allocator() = default;
  Allocator() = default;
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  virtual Device device() const = 0;
  // Returns a block of at least `bytes` bytes aligned to 64, or aborts when memory runs out
  // (a config that cannot fit is refused before training, at validation).
  void* allocate(size_t bytes, MemCategory category);
  void free(void* ptr, size_t bytes, MemCategory category);

  MemStats stats() const;
  // Starts a new peak window: peaks become the current figures.
  void reset_peak();

 protected:
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_free(void* ptr, size_t bytes) = 0;

 private:
  mutable std::mutex mu_;
  MemStats stats_;
};

// Host memory, 64-byte aligned (cache lines and AVX-512 loads).
class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kCPU; }

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_free(void* ptr, size_t bytes) override;
};

// The process-wide host allocator.
CpuAllocator& cpu_allocator();

// "1.23 GiB"-style figure for logs.
std::string format_bytes(int64_t bytes);

}  // namespace strata
