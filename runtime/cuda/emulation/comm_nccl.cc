// comm_nccl.cc (emulation build) — NCCL is not emulated: the emulated device counts as one CUDA
// device, and a world communicator on NCCL is refused (communication goes through MPI, staged
// through host memory, which is where emulated device memory lives anyway).
#include <memory>

#include "runtime/check.h"
#include "runtime/comm.h"

namespace strata::detail {

int cuda_device_count_impl() {
  return 1;
}

std::unique_ptr<Communicator> make_nccl_world_communicator(double) {
  STRATA_CHECK(false, "the NCCL backend is not emulated (CUDA emulation build): use MPI");
  return nullptr;
}

}  // namespace strata::detail
