// blas.h — the OpenBLAS the CPU kernels call, loaded at start-up with its kernels chosen from the
// CPU's features.
//
// Debian's OpenBLAS is built for every x86-64 core (DYNAMIC_ARCH) and picks one when it loads, from
// a table of CPU model numbers. A CPU the table does not know gets its slowest kernels: OpenBLAS
// 0.3.21 on an Ice Lake server whose model string is the generic "Intel(R) Xeon(R) Processor"
// picks Prescott (SSE3), 63 GFLOP/s where its SkylakeX kernels do 316 (docs/cpu.md). So
// Strata does not link OpenBLAS: it decides the core from what cpuid says the CPU and the operating
// system support (AVX-512, AVX2 and FMA, AVX), names it in OPENBLAS_CORETYPE, and only then loads
// the library (dlopen), whose constructor reads that variable. A core the environment already names
// in OPENBLAS_CORETYPE is kept: some machines set it because an OpenBLAS computes wrong results on
// their CPU. The variable is restored after loading, so programs Strata starts see the environment
// it was given. On other architectures (aarch64) the library's own detection is kept.
//
// Thread-safety: the library is loaded by a static initialiser of this file, before main and
// before any thread exists; the accessors below only read what it recorded.
#pragma once

#include <string>

namespace strata::kernels::cpu {

// What the x86-64 CPU and its operating system support, from cpuid and xgetbv.
struct X86Features {
  bool avx = false;       // AVX with the YMM state enabled by the OS
  bool avx2_fma = false;  // AVX2 and FMA3
  bool avx512 = false;    // AVX-512 F, CD, BW, DQ and VL with the ZMM state enabled
  bool avx512_bf16 = false;
};

// This CPU's features (all false off x86-64).
X86Features x86_features();

// OpenBLAS's name of the fastest core these features run — "Cooperlake", "SkylakeX", "Haswell",
// "Sandybridge" — or "" when none of them applies (OpenBLAS's own choice is kept).
std::string blas_core_for(const X86Features& f);

// How the loaded OpenBLAS runs.
struct BlasInfo {
  std::string library;    // the file loaded
  std::string version;    // "0.3.21"
  std::string core;       // openblas_get_corename(): "SkylakeX"
  std::string parallel;   // "openmp", "pthread" or "serial"
  std::string chosen_by;  // "the CPU's features", "OPENBLAS_CORETYPE" or "OpenBLAS"
};

// The loaded library's description. Throws std::runtime_error naming the file when OpenBLAS could
// not be loaded (the same error every GEMM throws then).
const BlasInfo& blas_info();

// "OpenBLAS 0.3.21 SkylakeX": the banner's and --version's words.
std::string blas_summary();

// The library's entry points (cblas.h's, row-major).
void blas_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc);
void blas_dgemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                int lda, const double* B, int ldb, double beta, double* C, int ldc);
void blas_set_num_threads(int n);

}  // namespace strata::kernels::cpu
