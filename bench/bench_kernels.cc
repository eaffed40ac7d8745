// bench_kernels.cc — throughput of the CPU kernels at the shapes of the small GPT the CPU backend
// trains (B = 8, S = 256, C = 384, NH = 6, vocab 256), and of the Llama-family ops at the same
// B, S and C with grouped-query attention (NH = 6 query heads sharing KVH = 2 key/value heads)
// and a SwiGLU hidden width F = 1024 (≈ 8C/3, Llama's ratio), printed next to this machine's own
// sgemm rate measured in the same run at the same thread count, so each figure reads as a
// fraction of what the cores can do.
//
// Usage: bench_kernels [threads]; threads default to OMP_NUM_THREADS, else all cores.
//
// Figures:
//   GEMM-bound ops report GFLOP/s with FLOPs = 2·M·N·K per GEMM (forward 1 GEMM, backward 2).
//   Attention reports GFLOP/s with the dense count of its GEMMs, 4·B·NH·S²·HS forward and twice
//     that backward, although the causal kernel skips about half of it: the figure is what a
//     dense kernel would need to match, the convention of FlashAttention's papers.
//   Memory-bound ops (LayerNorm, RMSNorm, GELU, SwiGLU, RoPE) report GB/s of the bytes they must
//     move at least, each array once (a += output counts read and write; RoPE reads and writes
//     the query and key heads in place), and that as a share of memcpy's rate on a buffer of the
//     MLP's hidden activation (N·4C floats, read and written: the bytes counted the same way),
//     measured in the same run on as many threads, one chunk each (an op whose arrays stay in
//     cache, RoPE's, can exceed it).
//   Attention's op names say "dense-eq" for that reason.
// Time per op is the median of repetitions after one warm-up; it never fails on time. The sgemm
// reference is measured first and again last: on a shared machine the two differ when other
// work competed for the cores, and the percentages use their mean.
//
// Beside it, numpy's sgemm at the same size and thread count, measured right after each of the
// two (a subprocess: $STRATA_BENCH_PYTHON, else python3; skipped with a line when numpy does not
// import): numpy's wheel ships a current OpenBLAS with its own CPU detection, so the ratio says
// whether the kernels Strata loads (kernels/cpu/blas.h) reach what the machine can do.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/threads.h"

namespace cpu = strata::kernels::cpu;

namespace {

// numpy's float32 matmul rate at G³ on `threads` threads (median of repetitions over ~0.3 s after
// a warm-up), and its OpenBLAS's description; rate 0 and the reason when numpy cannot run.
struct NumpySgemm {
  double gflops = 0;
  std::string about;
};

NumpySgemm numpy_sgemm(int G, int threads) {
  const char* python = std::getenv("STRATA_BENCH_PYTHON");
  const std::string t = std::to_string(threads);
  const std::string script =
      "import time, numpy as np\n"
      "g = " +
      std::to_string(G) +
      "\n"
      "r = np.random.default_rng(1)\n"
      "a = r.random((g, g), dtype=np.float32); b = r.random((g, g), dtype=np.float32)\n"
      "a @ b\n"
      "ts = []; s = time.perf_counter()\n"
      "while len(ts) < 3 or (len(ts) < 50 and time.perf_counter() - s < 0.3):\n"
      "    t0 = time.perf_counter(); a @ b; ts.append(time.perf_counter() - t0)\n"
      "ts.sort()\n"
      "cfg = np.show_config(mode='dicts')['Build Dependencies']['blas']\n"
      "print(2 * g ** 3 / ts[len(ts) // 2] / 1e9, 'numpy', np.__version__,\n"
      "      cfg.get('openblas configuration', cfg.get('name', '')))\n";
  // numpy's OpenBLAS picks its own core: an OPENBLAS_CORETYPE given to this run is not passed on.
  const std::string cmd = "env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=" + t +
                          " OMP_NUM_THREADS=" + t + " " + (python ? python : "python3") +
                          " - 2>&1 <<'EOF'\n" + script + "EOF\n";
  NumpySgemm r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {0, "numpy not measured: popen failed"};
  char buf[512];
  std::string out;
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  char* end = nullptr;
  r.gflops = std::strtod(out.c_str(), &end);
  if (status != 0 || end == out.c_str()) {
    const std::string last = out.substr(out.rfind('\n', out.size() - 2) + 1);
    return {0, "numpy not measured: " + (last.empty() ? std::string("python3 failed") : last)};
  }
  r.about = out.substr(end - out.c_str() + 1);
  while (!r.about.empty() && r.about.back() == '\n') r.about.pop_back();
  return r;
}

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Median seconds of fn over repetitions: at least 3, and enough to fill ~0.3 s.
double time_median(const std::function<void()>& fn) {
  using clock = std::chrono::steady_clock;
  fn();  // warm-up: first-touch page faults, OpenBLAS buffers, thread start-up
  std::vector<double> times;
  const auto start = clock::now();
  while (times.size() < 3 ||
         (times.size() < 50 && std::chrono::duration<double>(clock::now() - start).count() < 0.3)) {
    const auto t0 = clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int threads_from(int argc, char** argv) {
  if (argc > 1) return std::max(1, std::atoi(argv[1]));
  if (const char* env = std::getenv("OMP_NUM_THREADS")) return std::max(1, std::atoi(env));
  return omp_get_num_procs();
}

// One measured op; printed once the closing sgemm reference is known.
struct Row {
  std::string name;
  double seconds;
  double work;  // FLOPs or bytes
  bool flops;   // GFLOP/s (else GB/s)
};

void print_row(const Row& row, double sgemm_gflops, double memcpy_gbs) {
  const double rate = row.work / row.seconds / 1e9;
  if (row.flops) {
    std::printf("%-34s %9.3f ms %9.1f GFLOP/s  %5.0f%% of sgemm\n", row.name.c_str(),
                row.seconds * 1e3, rate, 100.0 * rate / sgemm_gflops);
  } else {
    std::printf("%-34s %9.3f ms %9.1f GB/s     %5.0f%% of memcpy\n", row.name.c_str(),
                row.seconds * 1e3, rate, 100.0 * rate / memcpy_gbs);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = threads_from(argc, argv);
  cpu::set_num_threads(threads);

  const int B = 8, S = 256, C = 384, NH = 6, V = 256;
  const int HS = C / NH;
  const int N = B * S;  // tokens per micro-batch
  std::printf("bench_kernels: B=%d S=%d C=%d NH=%d HS=%d V=%d, threads=%d, %s (%s, chosen by %s)\n",
              B, S, C, NH, HS, V, cpu::num_threads(), cpu::blas_summary().c_str(),
              cpu::blas_parallel_mode(), cpu::blas_info().chosen_by.c_str());

  // The machine's sgemm rate: one square GEMM large enough for OpenBLAS to reach its peak.
  const int G = 1536;
  const auto ga = random_floats(size_t(G) * G, 1), gb = random_floats(size_t(G) * G, 2);
  std::vector<float> gc(size_t(G) * G);  // (G, G)
  auto measure_sgemm = [&](const char* when) {
    const double t = time_median([&] {
      cpu::gemm<float>(false, false, G, G, G, 1.0f, ga.data(), G, gb.data(), G, 0.0f, gc.data(), G);
    });
    const double rate = 2.0 * G * G * G / t / 1e9;
    std::printf("%-34s %9.3f ms %9.1f GFLOP/s  (reference, %s)\n",
                ("sgemm " + std::to_string(G) + "^3").c_str(), t * 1e3, rate, when);
    return rate;
  };
  auto measure_numpy = [&](const char* when) {
    const NumpySgemm np = numpy_sgemm(G, threads);
    if (np.gflops > 0) {
      std::printf("%-34s %9.3f ms %9.1f GFLOP/s  (%s, %s)\n",
                  ("numpy sgemm " + std::to_string(G) + "^3").c_str(),
                  2.0 * G * G * G / np.gflops / 1e6, np.gflops, np.about.c_str(), when);
    } else {
      std::printf("%s\n", np.about.c_str());
    }
    return np.gflops;
  };
  const double sgemm_first = measure_sgemm("first");
  const double numpy_first = measure_numpy("first");
  std::vector<Row> rows;

  // Linear layers of one GPT block and the LM head: (name, C_in, C_out).
  struct Linear {
    const char* name;
    int in, out;
  };
  const Linear linears[] = {{"qkv", C, 3 * C},
                            {"attn proj", C, C},
                            {"fc", C, 4 * C},
                            {"fc proj", 4 * C, C},
                            {"lm head", C, V}};
  for (const auto& l : linears) {
    const auto inp = random_floats(size_t(N) * l.in, 10);    // (N, in)
    const auto w = random_floats(size_t(l.out) * l.in, 11);  // (out, in)
    const auto bias = random_floats(l.out, 12);              // (out)
    const auto dout = random_floats(size_t(N) * l.out, 13);  // (N, out)
    std::vector<float> out(size_t(N) * l.out);               // (N, out)
    std::vector<float> dinp(size_t(N) * l.in), dw(size_t(l.out) * l.in), db(l.out);
    const double flops = 2.0 * N * l.in * l.out;
    const std::string shape =
        " " + std::to_string(N) + "x" + std::to_string(l.in) + "->" + std::to_string(l.out);
    rows.push_back({std::string("matmul fwd ") + l.name + shape, time_median([&] {
                      cpu::matmul_forward<float>(out.data(), inp.data(), w.data(), bias.data(), N,
                                                 l.in, l.out);
                    }),
                    flops, true});
    rows.push_back({std::string("matmul bwd ") + l.name + shape, time_median([&] {
                      cpu::matmul_backward<float>(dinp.data(), dw.data(), db.data(), dout.data(),
                                                  inp.data(), w.data(), N, l.in, l.out);
                    }),
                    2 * flops, true});
  }

  {
    const size_t nqkv = size_t(N) * 3 * C;       // (B, S, 3, NH, HS)
    const size_t natt = size_t(B) * NH * S * S;  // (B, NH, S, S)
    const auto qkv = random_floats(nqkv, 20);
    const auto dout = random_floats(size_t(N) * C, 21);  // (B, S, NH, HS)
    std::vector<float> out(size_t(N) * C), att(natt), dqkv(nqkv);
    std::vector<float> scratch(cpu::attention_scratch_elems(S));  // (threads, S, S)
    const double flops = 4.0 * B * NH * double(S) * S * HS;
    rows.push_back({"attention fwd (dense-eq)", time_median([&] {
                      cpu::attention_forward<float>(out.data(), att.data(), qkv.data(), B, S, NH,
                                                    NH, HS);
                    }),
                    flops, true});
    rows.push_back({"attention bwd (dense-eq)", time_median([&] {
                      cpu::attention_backward<float>(dqkv.data(), dout.data(), qkv.data(),
                                                     att.data(), scratch.data(), B, S, NH, NH, HS);
                    }),
                    2 * flops, true});
  }

  {
    const size_t n = size_t(N) * C;
    const auto inp = random_floats(n, 30), dout = random_floats(n, 31);  // (N, C)
    const auto w = random_floats(C, 32), b = random_floats(C, 33);       // (C)
    std::vector<float> out(n), mean(N), rstd(N), dinp(n), dw(C), db(C);
    const double f = sizeof(float);
    // forward: read inp, write out; backward: read inp and dout, read+write dinp.
    rows.push_back({"layernorm fwd", time_median([&] {
                      cpu::layernorm_forward<float>(out.data(), mean.data(), rstd.data(),
                                                    inp.data(), w.data(), b.data(), N, C);
                    }),
                    2 * n * f, false});
    rows.push_back({"layernorm bwd", time_median([&] {
                      cpu::layernorm_backward<float>(dinp.data(), dw.data(), db.data(), dout.data(),
                                                     inp.data(), w.data(), mean.data(), rstd.data(),
                                                     N, C);
                    }),
                    4 * n * f, false});
  }

  {
    const size_t n = size_t(N) * 4 * C;  // the MLP's hidden activation (N, 4C)
    const auto inp = random_floats(n, 40, 3.0f), dout = random_floats(n, 41);
    std::vector<float> out(n), dinp(n);
    const double f = sizeof(float);
    rows.push_back({"gelu fwd",
                    time_median([&] { cpu::gelu_forward<float>(out.data(), inp.data(), n); }),
                    2 * n * f, false});
    rows.push_back({"gelu bwd", time_median([&] {
                      cpu::gelu_backward<float>(dinp.data(), inp.data(), dout.data(), n);
                    }),
                    4 * n * f, false});
  }

  // ---- Llama-family ops: grouped-query attention, RoPE, RMSNorm, SwiGLU ----
  const int KVH = 2, F = 1024;
  {
    const size_t nqkv = size_t(N) * (NH + 2 * KVH) * HS;  // (B, S, NH + 2·KVH, HS)
    const size_t natt = size_t(B) * NH * S * S;           // (B, NH, S, S)
    const auto qkv = random_floats(nqkv, 50);
    const auto dout = random_floats(size_t(N) * C, 51);  // (B, S, NH, HS)
    std::vector<float> out(size_t(N) * C), att(natt), dqkv(nqkv);
    std::vector<float> scratch(cpu::attention_scratch_elems(S));  // (threads, S, S)
    const double flops = 4.0 * B * NH * double(S) * S * HS;
    const std::string gqa = " KVH=" + std::to_string(KVH);
    rows.push_back({"attention fwd (dense-eq)" + gqa, time_median([&] {
                      cpu::attention_forward<float>(out.data(), att.data(), qkv.data(), B, S, NH,
                                                    KVH, HS);
                    }),
                    flops, true});
    rows.push_back({"attention bwd (dense-eq)" + gqa, time_median([&] {
                      cpu::attention_backward<float>(dqkv.data(), dout.data(), qkv.data(),
                                                     att.data(), scratch.data(), B, S, NH, KVH, HS);
                    }),
                    2 * flops, true});

    // RoPE on the same layout, in place: the query and key heads read and written once.
    std::vector<float> cos_sin(size_t(S) * HS);  // (S, HS): [cos | sin] per position
    for (int s = 0; s < S; ++s) {
      for (int i = 0; i < HS / 2; ++i) {
        const double theta = s * std::pow(10000.0, -2.0 * i / HS);
        cos_sin[size_t(s) * HS + i] = float(std::cos(theta));
        cos_sin[size_t(s) * HS + HS / 2 + i] = float(std::sin(theta));
      }
    }
    std::vector<float> x = qkv;
    const double bytes = 2.0 * N * (NH + KVH) * HS * sizeof(float);
    rows.push_back({"rope fwd" + gqa, time_median([&] {
                      cpu::rope_forward<float>(x.data(), cos_sin.data(), B, S, NH, KVH, HS);
                    }),
                    bytes, false});
    rows.push_back({"rope bwd" + gqa, time_median([&] {
                      cpu::rope_backward<float>(x.data(), cos_sin.data(), B, S, NH, KVH, HS);
                    }),
                    bytes, false});
  }

  {
    const size_t n = size_t(N) * C;
    const auto inp = random_floats(n, 60), dout = random_floats(n, 61);  // (N, C)
    const auto w = random_floats(C, 62);                                 // (C)
    std::vector<float> out(n), rstd(N), dinp(n), dw(C);
    const double f = sizeof(float);
    // forward: read inp, write out; backward: read inp and dout, read+write dinp.
    rows.push_back({"rmsnorm fwd", time_median([&] {
                      cpu::rmsnorm_forward<float>(out.data(), rstd.data(), inp.data(), w.data(), N,
                                                  C, 1e-5f);
                    }),
                    2 * n * f, false});
    rows.push_back({"rmsnorm bwd", time_median([&] {
                      cpu::rmsnorm_backward<float>(dinp.data(), dw.data(), dout.data(), inp.data(),
                                                   w.data(), rstd.data(), N, C);
                    }),
                    4 * n * f, false});
  }

  {
    const size_t n = size_t(N) * F;                       // the MLP's hidden activation (N, F)
    const auto gate_up = random_floats(2 * n, 70, 3.0f);  // (N, 2F)
    const auto dout = random_floats(n, 71);               // (N, F)
    std::vector<float> out(n), dgate_up(2 * n);
    const double f = sizeof(float);
    // forward: read gate_up, write out; backward: read gate_up and dout, write dgate_up.
    rows.push_back({"swiglu fwd F=" + std::to_string(F), time_median([&] {
                      cpu::swiglu_forward<float>(out.data(), gate_up.data(), N, F);
                    }),
                    3 * n * f, false});
    rows.push_back({"swiglu bwd F=" + std::to_string(F), time_median([&] {
                      cpu::swiglu_backward<float>(dgate_up.data(), dout.data(), gate_up.data(), N,
                                                  F);
                    }),
                    5 * n * f, false});
  }
  // memcpy on the MLP's hidden activation, one chunk per thread: the memory-bound ops' roofline.
  double memcpy_gbs = 0;
  {
    const size_t n = size_t(N) * 4 * C;
    const auto src = random_floats(n, 80);
    std::vector<float> dst(n);
    const double t = time_median([&] {
#pragma omp parallel
      {
        const size_t chunk = (n + omp_get_num_threads() - 1) / omp_get_num_threads();
        const size_t begin = std::min(n, chunk * omp_get_thread_num());
        const size_t len = std::min(n - begin, chunk);
        std::memcpy(dst.data() + begin, src.data() + begin, len * sizeof(float));
      }
    });
    memcpy_gbs = 2.0 * n * sizeof(float) / t / 1e9;
  }
  const double sgemm_last = measure_sgemm("last");
  const double numpy_last = measure_numpy("last");
  const double sgemm = 0.5 * (sgemm_first + sgemm_last);
  std::printf("sgemm reference (mean of first and last): %.1f GFLOP/s\n", sgemm);
  if (numpy_first > 0 && numpy_last > 0) {
    const double numpy = 0.5 * (numpy_first + numpy_last);
    std::printf("numpy sgemm (mean of first and last): %.1f GFLOP/s; Strata / numpy = %.2f\n",
                numpy, sgemm / numpy);
  }
  std::printf("memcpy %zu floats, read and written: %.1f GB/s\n", size_t(N) * 4 * C, memcpy_gbs);
  for (const auto& row : rows) print_row(row, sgemm, memcpy_gbs);
  return 0;
}
