// blas.cc — CPU implementation of kernels/cpu/blas.h.
#include "kernels/cpu/blas.h"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#ifndef STRATA_OPENBLAS_LIBRARY
#define STRATA_OPENBLAS_LIBRARY "libopenblas.so.0"
#endif

namespace strata::kernels::cpu {

namespace {

constexpr const char* kCoreVariable = "OPENBLAS_CORETYPE";

struct Library {
  BlasInfo info;
  std::string error;  // why it did not load; empty when it did
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_dgemm) dgemm = nullptr;
  decltype(&openblas_set_num_threads) set_num_threads = nullptr;
};

template <class F>
bool find(void* handle, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (fn == nullptr && error.empty()) error = std::string("it has no symbol ") + name;
  return fn != nullptr;
}

// Loads OpenBLAS with OPENBLAS_CORETYPE naming the core the CPU's features choose, unless the
// environment names one already; then puts the variable back as it was.
Library load() {
  Library lib;
  // An empty OPENBLAS_CORETYPE names no core (OpenBLAS says "Core not found" and detects).
  const char* variable = std::getenv(kCoreVariable);
  const bool preset = variable != nullptr && *variable != '\0';
  const std::string wanted = preset ? "" : blas_core_for(x86_features());
  if (!wanted.empty()) setenv(kCoreVariable, wanted.c_str(), 1);
  // The file the build linked against, then the name the dynamic loader resolves (the same
  // library after an upgrade or under Debian's alternatives).
  void* handle = nullptr;
  std::string tried;
  for (const char* name : {STRATA_OPENBLAS_LIBRARY, "libopenblas.so.0"}) {
    handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      lib.info.library = name;
      break;
    }
    const char* why = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + name + ": " + (why ? why : "not found");
  }
  if (!wanted.empty()) {
    if (variable != nullptr) {
      setenv(kCoreVariable, "", 1);
    } else {
      unsetenv(kCoreVariable);
    }
  }
  if (handle == nullptr) {
    lib.error = "cannot load OpenBLAS (" + tried + "): apt-get install libopenblas0-openmp";
    return lib;
  }
  decltype(&openblas_get_config) get_config = nullptr;
  decltype(&openblas_get_corename) get_corename = nullptr;
  decltype(&openblas_get_parallel) get_parallel = nullptr;
  std::string missing;
  const bool ok = find(handle, "cblas_sgemm", lib.sgemm, missing) &
                  find(handle, "cblas_dgemm", lib.dgemm, missing) &
                  find(handle, "openblas_set_num_threads", lib.set_num_threads, missing) &
                  find(handle, "openblas_get_config", get_config, missing) &
                  find(handle, "openblas_get_corename", get_corename, missing) &
                  find(handle, "openblas_get_parallel", get_parallel, missing);
  if (!ok) {
    lib.error = "cannot use " + lib.info.library + " as OpenBLAS: " + missing;
    return lib;
  }
  // openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64".
  const std::string config = get_config();
  const size_t start = config.find(' ');
  lib.info.version = start == std::string::npos
                         ? config
                         : config.substr(start + 1, config.find(' ', start + 1) - start - 1);
  lib.info.core = get_corename();
  switch (get_parallel()) {
    case 0:
      lib.info.parallel = "serial";
      break;
    case 1:
      lib.info.parallel = "pthread";
      break;
    default:
      lib.info.parallel = "openmp";
  }
  if (preset) {
    lib.info.chosen_by = kCoreVariable;
  } else if (!wanted.empty() && strcasecmp(wanted.c_str(), lib.info.core.c_str()) == 0) {
    lib.info.chosen_by = "the CPU's features";
  } else {
    lib.info.chosen_by = "OpenBLAS";  // no feature applies, or a build for one core only
  }
  return lib;
}

const Library& library() {
  static const Library lib = load();
  return lib;
}

// Loaded before main, while the process has one thread: setenv is not safe beside a getenv on
// another thread.
[[maybe_unused]] const bool kLoadedAtStartUp = (library(), true);

const Library& loaded() {
  const Library& lib = library();
  if (!lib.error.empty()) throw std::runtime_error(lib.error);
  return lib;
}

}  // namespace

X86Features x86_features() {
  X86Features f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, nullptr) < 7 || !__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28), fma = c & (1u << 12);
  if (!osxsave || !avx) return f;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  // XMM and YMM state (bits 1, 2); opmask, ZMM0-15 upper halves and ZMM16-31 (bits 5, 6, 7).
  const bool ymm = (xcr0_lo & 0x6u) == 0x6u, zmm = (xcr0_lo & 0xe6u) == 0xe6u;
  f.avx = ymm;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & (1u << 5);
  f.avx2_fma = ymm && avx2 && fma;
  const unsigned avx512_bits = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
  f.avx512 = f.avx2_fma && zmm && (b & avx512_bits) == avx512_bits;
  const unsigned max_subleaf = a;
  if (f.avx512 && max_subleaf >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = a & (1u << 5);
  }
#endif
  return f;
}

std::string blas_core_for(const X86Features& f) {
  // Each name is the OpenBLAS core whose kernels need exactly these instructions: Cooperlake is
  // SkylakeX plus the bf16 instructions, SkylakeX AVX-512 F/CD/BW/DQ/VL, Haswell AVX2 and FMA
  // (OpenBLAS's Zen kernels are its Haswell ones), Sandybridge AVX.
  if (f.avx512 && f.avx512_bf16) return "Cooperlake";
  if (f.avx512) return "SkylakeX";
  if (f.avx2_fma) return "Haswell";
  if (f.avx) return "Sandybridge";
  return "";
}

const BlasInfo& blas_info() {
  return loaded().info;
}

std::string blas_summary() {
  const BlasInfo& info = blas_info();
  return "OpenBLAS " + info.version + " " + info.core;
}

void blas_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  loaded().sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                 trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void blas_dgemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  loaded().dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                 trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void blas_set_num_threads(int n) {
  loaded().set_num_threads(n);
}

}  // namespace strata::kernels::cpu
