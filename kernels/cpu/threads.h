// threads.h — the threads the CPU kernels run on: OpenMP's team for their loops and OpenBLAS's
// for their GEMMs.
//
// Thread-safety: set_num_threads changes process-wide settings; call it before kernels run, not
// while they run on other threads.
#pragma once

namespace strata::kernels::cpu {

// Threads for OpenMP loops and OpenBLAS (process-wide).
void set_num_threads(int n);
int num_threads();
// "openmp", "pthread" or "serial": how the OpenBLAS in use was built.
const char* blas_parallel_mode();

}  // namespace strata::kernels::cpu
