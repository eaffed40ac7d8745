// mpi_watchdog_probe — a deliberate hang for the watchdog test (run by mpi_watchdog_check.sh).
//
// Two ranks, comm timeout from argv[1] (seconds). Rank 1 waits for a 4096-byte message that rank 0
// never sends; rank 0 waits in a barrier with ten times the deadline, so rank 1's watchdog fires
// first, prints its line and aborts the job, which must also end rank 0. Reaching the end of
// main is the failure: it returns 0, which the check treats as "the watchdog did not fire".
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/comm.h"
#include "runtime/watchdog.h"

int main(int argc, char** argv) {
  const strata::World w = strata::init_world(&argc, &argv);
  const double timeout_s = argc > 1 ? std::atof(argv[1]) : 3.0;
  if (w.size != 2) {
    std::fprintf(stderr, "mpi_watchdog_probe: needs 2 ranks, got %d\n", w.size);
    return 2;
  }
  {
    auto comm = strata::make_world_communicator(strata::CommBackend::kMPI, timeout_s);
    auto patient = strata::make_world_communicator(strata::CommBackend::kMPI, 10 * timeout_s);
    if (w.rank == 1) {
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
