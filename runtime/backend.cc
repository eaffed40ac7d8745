// The one backend factory: the only place that decides between CPU and CUDA.
#include "runtime/backend.h"

#include "runtime/error.h"

namespace strata {

std::unique_ptr<Backend> make_cpu_backend(int threads);  // backend_cpu.cc

std::string compiled_backends() {
#ifdef STRATA_HAVE_CUDA
  return "cpu, cuda, mpi, nccl";
#else
  return "cpu, mpi";
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& device, int threads) {
  if (device == "cpu" || device == "auto") return make_cpu_backend(threads);
  // The CUDA compute backend is issue 7; until it lands "cuda" is refused as bad input.
  throw InputError("<config>", "device",
                   "\"cpu\" or \"auto\": this build has no CUDA compute backend yet (got \"" +
                       device + "\")");
}

}  // namespace strata
