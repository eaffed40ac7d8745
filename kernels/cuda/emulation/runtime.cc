// runtime.cc — the CUDA runtime calls the CUDA backend makes, emulated on the CPU for the
// emulation build (device.h): devices whose memory is host memory, streams and events on which
// everything has completed when the call returns unless a PendingWork (async.h: the emulated
// NCCL's) is in flight on them, and cudaGetLastError's sticky-free error.
//
// Devices: one, or STRATA_EMULATED_DEVICES (1 to 64) to stand for a host with that many GPUs, so
// that several ranks on one machine each find a device of their own and take the NCCL path. Each
// process has its own memory, so the devices differ only in their index.
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
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cuda/emulation/async.h"
#include "kernels/cuda/emulation/device.h"

namespace {

constexpr size_t kDeviceBytes = size_t{80} << 30;  // reported total memory: an H100's
constexpr int kDefaultSharedBytes = 48 << 10;      // dynamic shared memory without an opt-in
constexpr int kOptinSharedBytes = 227 << 10;       // the most an H100 block can opt into

int device_count() {
  static const int n = [] {
    const char* env = std::getenv("STRATA_EMULATED_DEVICES");
    if (env == nullptr || *env == 0) return 1;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != 0 || v < 1 || v > 64) {
      std::fprintf(stderr, "cuda emulation: STRATA_EMULATED_DEVICES=%s: expected 1 to 64\n", env);
      std::exit(2);
    }
    return static_cast<int>(v);
  }();
  return n;
}
thread_local int g_device = 0;

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
  bool named = false;
  if (g_mutex.try_lock()) {
    for (const auto& [p, a] : g_allocations) {
      const char* guard = a.mapping + a.mapped - g_page;
      if (at >= guard && at < guard + g_page) {
        std::fprintf(stderr,
                     "cuda emulation: access %zu bytes past the end of a %zu-byte cudaMalloc "
                     "allocation (a kernel reading or writing out of bounds)\n",
                     static_cast<size_t>(at - p) - a.bytes, a.bytes);
        named = true;
        break;
      }
    }
  }
  if (!named)
    std::fprintf(stderr,
                 "cuda emulation: segmentation fault at %p, in no allocation's guard page "
                 "(memory already freed, or a host-side bug)\n",
                 info->si_addr);
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

// The errors this runtime returns, named and described as the CUDA runtime does.
struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
const ErrorText& error_text(cudaError_t e) {
  static const ErrorText known[] = {
      {cudaSuccess, "cudaSuccess", "no error"},
      {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
      {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
      {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
      {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
  };
  static const ErrorText unknown{cudaErrorUnknown, "cudaErrorUnknown", "unknown error (emulation)"};
  for (const ErrorText& k : known)
    if (k.code == e) return k;
  return unknown;
}

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

// A stream is the work in flight on it (nothing, unless a PendingWork was enqueued); an event is
// the work in flight on its stream when it was last recorded. Guarded by g_async_mutex, which is
// never held while a PendingWork is tested or waited for.
using Work = std::shared_ptr<strata::cuda_emulation::PendingWork>;
struct Stream {
  std::vector<Work> pending;
};
struct Event {
  std::vector<Work> pending;
};
std::mutex g_async_mutex;
Stream g_default_stream;
std::vector<Stream*> g_streams{&g_default_stream};  // every live stream, for device syncs
void (*g_progress_hook)() = nullptr;

Stream& stream_of(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return g_default_stream;
  return *reinterpret_cast<Stream*>(s);
}
Event& event_of(cudaEvent_t e) {
  return *reinterpret_cast<Event*>(e);
}

// The works of `list` that have not completed; those that have leave the list.
std::vector<Work> unfinished(std::vector<Work>& list) {
  std::vector<Work> copy;
  {
    std::lock_guard<std::mutex> lock(g_async_mutex);
    copy = list;
  }
  std::vector<Work> left, done;
  for (const Work& w : copy) (w->test() ? done : left).push_back(w);
  std::lock_guard<std::mutex> lock(g_async_mutex);
  for (const Work& w : done) list.erase(std::remove(list.begin(), list.end(), w), list.end());
  return left;
}

// Returns once every work of `list` has completed.
void finish(std::vector<Work>& list) {
  for (const Work& w : unfinished(list)) w->wait();
  unfinished(list);
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
  *count = device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice, "cudaSetDevice: no such device");
  g_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = g_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: no such device");
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
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: no such device");
  if (attr == cudaDevAttrComputeCapabilityMajor) *value = 9;
  if (attr == cudaDevAttrMultiProcessorCount) *value = 1;
  if (attr == cudaDevAttrMaxSharedMemoryPerBlockOptin) *value = kOptinSharedBytes;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;  // an H100's: 0 (lowest) to -5 (highest)
  *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> lock(g_async_mutex);
    streams = g_streams;
  }
  for (Stream* s : streams) finish(s->pending);
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
  return error_text(error).text;
}
const char* cudaGetErrorName(cudaError_t error) {
  return error_text(error).name;
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
// As on a GPU, freeing waits for the device's work in flight, which may still use the memory.
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  cudaDeviceSynchronize();
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
  finish(g_default_stream.pending);
  return copy(dst, src, bytes, kind);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  finish(stream_of(s).pending);
  return copy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  finish(g_default_stream.pending);
  return set(p, value, bytes);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  finish(stream_of(s).pending);
  return set(p, value, bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  auto* stream = new Stream;
  std::lock_guard<std::mutex> lock(g_async_mutex);
  g_streams.push_back(stream);
  *s = reinterpret_cast<cudaStream_t>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  return cudaStreamCreate(s);
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned, int) {
  return cudaStreamCreate(s);
}
// A GPU finishes a destroyed stream's work before releasing it; here the host waits for it.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (&stream_of(s) == &g_default_stream)
    return fail(cudaErrorInvalidValue, "cudaStreamDestroy: the default stream");
  Stream* stream = &stream_of(s);
  finish(stream->pending);
  {
    std::lock_guard<std::mutex> lock(g_async_mutex);
    g_streams.erase(std::remove(g_streams.begin(), g_streams.end(), stream), g_streams.end());
  }
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  finish(stream_of(s).pending);
  return cudaSuccess;
}
// Work issued on `s` from now on runs at once, so what it must follow completes here.
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
  finish(event_of(e).pending);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  return cudaEventCreate(e);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete &event_of(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::vector<Work> pending = unfinished(stream_of(s).pending);
  std::lock_guard<std::mutex> lock(g_async_mutex);
  event_of(e).pending = std::move(pending);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  finish(event_of(e).pending);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  return unfinished(event_of(e).pending).empty() ? cudaSuccess : cudaErrorNotReady;
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

void strata::cuda_emulation::enqueue(cudaStream_t s, std::shared_ptr<PendingWork> w) {
  std::lock_guard<std::mutex> lock(g_async_mutex);
  stream_of(s).pending.push_back(std::move(w));
}

void strata::cuda_emulation::set_progress_hook(void (*hook)()) {
  std::lock_guard<std::mutex> lock(g_async_mutex);
  g_progress_hook = hook;
}

bool strata::cuda_emulation::is_device_memory(const void* p, size_t bytes) {
  return is_device(p, bytes);
}

void strata::cuda_emulation::before_launch(cudaStream_t s) {
  void (*hook)() = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_async_mutex);
    hook = g_progress_hook;
  }
  if (hook != nullptr) hook();
  finish(stream_of(s).pending);
}
