// threads.cc — CPU implementation of kernels/cpu/threads.h.
#include "kernels/cpu/threads.h"

#include <cblas.h>
#include <omp.h>

namespace strata::kernels::cpu {

void set_num_threads(int n) {
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() {
  return omp_get_max_threads();
}

const char* blas_parallel_mode() {
  switch (openblas_get_parallel()) {
    case 0:
      return "serial";
    case 1:
      return "pthread";
    default:
      return "openmp";
  }
}

}  // namespace strata::kernels::cpu
