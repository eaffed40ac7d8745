// threads.cc — CPU implementation of kernels/cpu/threads.h.
#include "kernels/cpu/threads.h"

#include <omp.h>

#include "kernels/cpu/blas.h"

namespace strata::kernels::cpu {

void set_num_threads(int n) {
  omp_set_num_threads(n);
  blas_set_num_threads(n);
}

int num_threads() {
  return omp_get_max_threads();
}

const char* blas_parallel_mode() {
  return blas_info().parallel.c_str();
}

}  // namespace strata::kernels::cpu
