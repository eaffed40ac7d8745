// cupti_trace: a GPU timeline of any CUDA program, for Perfetto (ui.perfetto.dev) or
// chrome://tracing, without Nsight Systems. Built as a preload library by scripts/gpu_check
// (step `timeline`) or by hand:
//
//   g++ -O2 -shared -fPIC bench/gpu/cupti_trace.cc -I$CUDA/include -L$CUPTI_LIB -lcupti
//       -o cupti_trace.so   (one line)
//   STRATA_CUPTI_TRACE=trace.json LD_PRELOAD=$PWD/cupti_trace.so build-gpu/strata train ...
//
// It records, through CUPTI's activity API, every kernel, memcpy and memset on the GPU (pid 1,
// one track per stream) and every CUDA runtime call on the host (pid 0, one track per thread),
// with their start and end on the GPU's clock, and writes them as Chrome trace events when the
// program exits. Host gaps between runtime calls are the program's own CPU time; GPU gaps that
// line up with a host synchronisation, or with a run of short launches, show what the GPU
// waits for.
#include <cupti.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Event {
  std::string name;
  uint64_t start, end;
  int pid;       // 0 host, 1 GPU
  uint64_t tid;  // host thread or GPU stream
  const char* cat;
};

std::mutex g_mu;
std::vector<Event> g_events;
const char* g_path = nullptr;

constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

std::string json_escape(const char* s) {
  std::string out;
  for (; s && *s; ++s) {
    if (*s == '"' || *s == '\\') out += '\\';
    if (static_cast<unsigned char>(*s) >= 0x20) out += *s;
  }
  return out;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        g_events.push_back(
            {k->name ? k->name : "kernel", k->start, k->end, 1, k->streamId, "kernel"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        g_events.push_back(
            {"memcpy kind " + std::to_string(m->copyKind) + " " + std::to_string(m->bytes) + " B",
             m->start, m->end, 1, m->streamId, "memcpy"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        g_events.push_back({"memset " + std::to_string(m->bytes) + " B", m->start, m->end, 1,
                            m->streamId, "memset"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const auto* r = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        const char* name = nullptr;
        cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, r->cbid, &name);
        g_events.push_back({name ? name : "runtime", r->start, r->end, 0, r->threadId, "api"});
        break;
      }
      default:
        break;
    }
  }
  free(buffer);
}

void write_trace() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  FILE* f = std::fopen(g_path, "w");
  if (!f) {
    std::fprintf(stderr, "cupti_trace: cannot write %s\n", g_path);
    return;
  }
  uint64_t t0 = UINT64_MAX;
  for (const Event& e : g_events) t0 = e.start < t0 ? e.start : t0;
  std::fprintf(f, "{\"traceEvents\":[\n");
  for (size_t i = 0; i < g_events.size(); ++i) {
    const Event& e = g_events[i];
    std::fprintf(f,
                 "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
                 "\"pid\":%d,\"tid\":%" PRIu64 "}%s\n",
                 json_escape(e.name.c_str()).c_str(), e.cat, (e.start - t0) / 1e3,
                 (e.end - e.start) / 1e3, e.pid, e.tid, i + 1 < g_events.size() ? "," : "");
  }
  std::fprintf(f,
               "],\"displayTimeUnit\":\"ms\",\"otherData\":{\"pids\":\"0 host runtime calls, 1 "
               "GPU\"}}\n");
  std::fclose(f);
  std::fprintf(stderr, "cupti_trace: %zu events in %s\n", g_events.size(), g_path);
}

__attribute__((constructor)) void start() {
  g_path = std::getenv("STRATA_CUPTI_TRACE");
  if (!g_path || !*g_path) return;
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "cupti_trace: cuptiActivityRegisterCallbacks failed\n");
    g_path = nullptr;
    return;
  }
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
}

__attribute__((destructor)) void finish() {
  if (g_path) write_trace();
}

}  // namespace
