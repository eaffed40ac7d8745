// check.h — checks that abort with full context: the failing expression, file:line, the rank
// and host, and the library's own error string. For failures a user cannot fix by editing an
// input (device, communication, internal invariants). User-fixable errors throw InputError.
//
// STRATA_CHECK is always on (not compiled out in Release): a wrong shape is cheaper to report
// than to debug. MPI_CHECK lives in runtime/comm code, CUDA_CHECK / NCCL_CHECK / CUBLAS_CHECK in
// runtime/backend/cuda and runtime/comm/cuda code, so this header needs none of their headers.
#pragma once

#include <sstream>
#include <string>

namespace strata {

// Identity of this process for messages: set once at start-up by the launcher.
void set_process_identity(int world_rank, int world_size);
int process_rank();
const std::string& process_host();

// Prints "[rank R host H] fatal: <what> at file:line" and aborts the whole job (MPI_Abort when
// MPI is initialised, else std::abort). Never returns.
[[noreturn]] void fatal(const std::string& what, const char* file, int line);

}  // namespace strata

// STRATA_CHECK(cond, msg): msg is anything streamable, e.g. "rows " << n << " != " << m.
#define STRATA_CHECK(cond, msg)                                    \
  do {                                                             \
    if (!(cond)) {                                                 \
      std::ostringstream strata_check_os_;                         \
      strata_check_os_ << "check failed: " #cond ": " << msg;      \
      ::strata::fatal(strata_check_os_.str(), __FILE__, __LINE__); \
    }                                                              \
  } while (0)
