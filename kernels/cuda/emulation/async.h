// async.h — work that completes after the call that issued it, in the emulation build's streams
// (runtime.cc): the emulated NCCL's (runtime/comm/cuda/emulation/nccl.cc) MPI requests.
//
// Everything else the emulated runtime does has completed when its call returns. A PendingWork
// enqueued on a stream is what makes the stream asynchronous: an event recorded on the stream
// afterwards is not complete (cudaEventQuery says cudaErrorNotReady) until the work is, and
// whatever must come after it in stream order — a stream that waits for the event, a kernel, copy
// or memset issued on the stream itself, a synchronisation of the stream, the event or the device
// — waits for it on the host, since the emulated work it precedes runs when it is issued.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

namespace strata::cuda_emulation {

class PendingWork {
 public:
  virtual ~PendingWork() = default;
  // Whether the work has completed. Any thread may ask; the answer may lag behind the truth (an
  // implementation that can only make progress on one thread reports what it last saw there).
  virtual bool test() = 0;
  // Returns once the work has completed, making progress meanwhile. Called on the issuing thread.
  virtual void wait() = 0;
};

// Puts `w` at the end of stream `s` (0, cudaStreamLegacy and cudaStreamPerThread are the one
// default stream).
void enqueue(cudaStream_t s, std::shared_ptr<PendingWork> w);
// Called at every kernel launch, so that communication progresses while kernels run (MPI moves
// data only inside its own calls); nullptr to clear.
void set_progress_hook(void (*hook)());
// Whether [p, p + bytes) lies inside one live cudaMalloc allocation.
bool is_device_memory(const void* p, size_t bytes);

}  // namespace strata::cuda_emulation
