// mpi_watchdog_probe — a deliberate hang for the watchdog test (run by mpi_watchdog_check.sh).
//
// Two ranks, comm timeout from argv[1] (seconds). Rank 1 waits for a 4096-byte message that rank 0
// never sends; rank 0 waits in a barrier with ten times the deadline, so rank 1's watchdog fires
// first, prints its line and aborts the job, which must also end rank 0. Reaching the end of
// main is the failure: it returns 0, which the check treats as "the watchdog did not fire".
//
// With argv[2] == "nccl" (CUDA builds) the receive is an NCCL one into device memory on a compute
// stream, and rank 1 then synchronises the stream, as a training step would at its end: the NCCL
// watchdog thread must fire while the host is blocked there. Without a CUDA device per rank it
// prints "SKIPPED" and exits 77 on every rank.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/comm/watchdog.h"

#if defined(STRATA_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

// Rank 1's receive that never completes, on the NCCL backend.
void nccl_recv_that_hangs(strata::Communicator& comm) {
#if defined(STRATA_HAVE_CUDA)
  cudaSetDevice(strata::local_device_index());
  void* buf = nullptr;
  cudaStream_t compute = nullptr;
  cudaMalloc(&buf, 4096);
  cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
  comm.set_compute_stream(compute);
  strata::set_wait_context("probe: recv-forward mb 0");
  comm.recv(buf, 1024, strata::DType::kF32, /*peer=*/0);
  cudaStreamSynchronize(compute);
#else
  (void)comm;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const strata::World w = strata::init_world(&argc, &argv);
  const double timeout_s = argc > 1 ? std::atof(argv[1]) : 3.0;
  if (w.size != 2) {
    std::fprintf(stderr, "mpi_watchdog_probe: needs 2 ranks, got %d\n", w.size);
    return 2;
  }
  const bool nccl = argc > 2 && std::strcmp(argv[2], "nccl") == 0;
  if (nccl && strata::cuda_device_count() < w.local_size) {
    if (w.rank == 0) {
      std::printf("SKIPPED: the NCCL watchdog probe needs a CUDA device per rank, %d for %d\n",
                  strata::cuda_device_count(), w.local_size);
    }
    strata::finalize_world();
    return 77;
  }
  {
    auto comm = strata::make_world_communicator(
        nccl ? strata::CommBackend::kNCCL : strata::CommBackend::kMPI, timeout_s);
    auto patient = strata::make_world_communicator(strata::CommBackend::kMPI, 10 * timeout_s);
    if (w.rank == 1 && nccl) {
      nccl_recv_that_hangs(*comm);
    } else if (w.rank == 1) {
      std::vector<float> buf(1024);
      strata::set_wait_context("probe: recv-forward mb 0");
      comm->recv(buf.data(), buf.size(), strata::DType::kF32, /*peer=*/0);
    } else {
      patient->barrier();
    }
  }
  std::fprintf(stderr,
               "[rank %d] mpi_watchdog_probe: the wait returned; the watchdog did not fire\n",
               w.rank);
  strata::finalize_world();
  return 0;
}
