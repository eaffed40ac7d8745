// runtime.cc — the CUDA runtime calls the CUDA backend makes, emulated on the CPU for the
// emulation build (device.h): one device whose memory is host memory, streams and events on which
// everything has completed when the call returns, and cudaGetLastError's sticky-free error.
//
// Device memory is mapped so that each allocation ends right before an inaccessible page: a
// kernel that reads or writes past the end of its buffer stops at once with a message naming the
// allocation and the overrun, instead of reading a neighbour. Allocations are 16-byte aligned
// (cudaMalloc gives 256, which nothing here relies on) so the end is at most 15 bytes from the
// guard. Memory starts filled with 0xff bytes — a NaN in f32 and bf16 — so a kernel that reads
// what nobody wrote shows it. Copies check that their "device" side lies inside one live
// allocation: a host pointer passed where a device one belongs (or an overrun) is an error, as on
// a GPU.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "kernels/cuda/emulation/device.h"

namespace {

constexpr size_t kDeviceBytes = size_t{80} << 30;  // reported total memory: an H100's
constexpr int kDefaultSharedBytes = 48 << 10;      // dynamic shared memory without an opt-in
constexpr int kOptinSharedBytes = 227 << 10;       // the most an H100 block can opt into

std::mutex g_mutex;
struct Allocation {
  size_t bytes;   // asked for
  char* mapping;  // the mmap'd region: data pages, then the guard page
  size_t mapped;
};
std::map<const char*, Allocation> g_allocations;  // pointer returned → allocation
size_t g_allocated = 0;
size_t g_page = 0;

// A fault in a guard page: name the allocation it ends, then abort (the default action would
// say only "Segmentation fault").
void on_segv(int, siginfo_t* info, void*) {
  const char* at = static_cast<const char*>(info->si_addr);
  if (g_mutex.try_lock()) {
    for (const auto& [p, a] : g_allocations) {
      const char* guard = a.mapping + a.mapped - g_page;
      if (at >= guard && at < guard + g_page) {
        std::fprintf(stderr,
                     "cuda emulation: access %zu bytes past the end of a %zu-byte cudaMalloc "
                     "allocation (a kernel reading or writing out of bounds)\n",
                     static_cast<size_t>(at - p) - a.bytes, a.bytes);
        break;
      }
    }
  }
  std::signal(SIGSEGV, SIG_DFL);
  std::abort();
}

void install_segv_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, nullptr);
  });
}
std::map<const void*, int> g_dynamic_smem_optin;  // kernel → cudaFuncSetAttribute's bytes
thread_local cudaError_t g_last_error = cudaSuccess;

cudaError_t fail(cudaError_t e, const char* what) {
  std::fprintf(stderr, "cuda emulation: %s\n", what);
  g_last_error = e;
  return e;
}

// Whether [p, p + bytes) lies inside one live allocation.
bool is_device(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.upper_bound(c);
  if (it == g_allocations.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second.bytes;
}

cudaError_t copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind != cudaMemcpyDefault && kind != cudaMemcpyHostToHost &&
      ((dst_device && !is_device(dst, bytes)) || (src_device && !is_device(src, bytes))))
    return fail(cudaErrorInvalidValue, "cudaMemcpy: a device side outside every allocation");
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

// Streams and events are handles with nothing behind them, since every call completes at once.
template <class Handle>
cudaError_t new_handle(Handle* h) {
  *h = reinterpret_cast<Handle>(new char);
  return cudaSuccess;
}
template <class Handle>
cudaError_t delete_handle(Handle h) {
  delete reinterpret_cast<char*>(h);
  return cudaSuccess;
}

cudaError_t set(void* p, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!is_device(p, bytes))
    return fail(cudaErrorInvalidValue, "cudaMemset: memory outside every allocation");
  std::memset(p, value, bytes);
  return cudaSuccess;
}

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice, "cudaSetDevice: no such device");
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: no such device");
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "CUDA emulation on the CPU");
  prop->totalGlobalMem = kDeviceBytes;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->sharedMemPerBlock = kDefaultSharedBytes;
  prop->sharedMemPerBlockOptin = kOptinSharedBytes;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  *value = 0;
  if (attr == cudaDevAttrComputeCapabilityMajor) *value = 9;
  if (attr == cudaDevAttrMultiProcessorCount) *value = 1;
  if (attr == cudaDevAttrMaxSharedMemoryPerBlockOptin) *value = kOptinSharedBytes;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  return g_last_error;
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    default:
      return "unknown error (emulation)";
  }
}
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    default:
      return "cudaErrorUnknown";
  }
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  install_segv_handler();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_page == 0) g_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (g_allocated + bytes > kDeviceBytes) {
    g_last_error = cudaErrorMemoryAllocation;
    return cudaErrorMemoryAllocation;
  }
  const size_t usable = (std::max<size_t>(bytes, 1) + 15) / 16 * 16;
  const size_t data = (usable + g_page - 1) / g_page * g_page;
  void* m =
      mmap(nullptr, data + g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    g_last_error = cudaErrorMemoryAllocation;
    return cudaErrorMemoryAllocation;
  }
  char* mapping = static_cast<char*>(m);
  mprotect(mapping + data, g_page, PROT_NONE);
  char* mem = mapping + data - usable;
  std::memset(mem, 0xff, usable);
  g_allocations[mem] = Allocation{bytes, mapping, data + g_page};
  g_allocated += bytes;
  *p = mem;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.find(static_cast<const char*>(p));
  if (it == g_allocations.end()) {
    std::fprintf(stderr, "cuda emulation: cudaFree of a pointer cudaMalloc did not return\n");
    g_last_error = cudaErrorInvalidValue;
    return cudaErrorInvalidValue;
  }
  g_allocated -= it->second.bytes;
  munmap(it->second.mapping, it->second.mapped);
  g_allocations.erase(it);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  *total_bytes = kDeviceBytes;
  *free_bytes = kDeviceBytes - g_allocated;
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return copy(dst, src, bytes, kind);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return copy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  return set(p, value, bytes);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  return set(p, value, bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return new_handle(s);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  return new_handle(s);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  return delete_handle(s);
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return new_handle(e);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  return new_handle(e);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  return delete_handle(e);
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) {
  return cudaSuccess;
}

// A kernel's dynamic shared memory above 48 KiB must be opted into, up to the device's 227 KiB.
cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > kOptinSharedBytes)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: more shared memory than an H100's");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_dynamic_smem_optin[kernel] = value;
  return cudaSuccess;
}

}  // extern "C"

size_t strata::cuda_emulation::max_dynamic_shared_bytes(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_dynamic_smem_optin.find(kernel);
  return static_cast<size_t>(it == g_dynamic_smem_optin.end() ? kDefaultSharedBytes : it->second);
}
