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
//     the query and key heads in place), against no roofline: STREAM-like bandwidth was not
//     measured here.
//   Attention's op names say "dense-eq" for that reason.
// Time per op is the median of repetitions after one warm-up; it never fails on time. The sgemm
// reference is measured first and again last: on a shared machine the two differ when other
// work competed for the cores, and the percentages use their mean.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/threads.h"

namespace cpu = strata::kernels::cpu;

namespace {

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

void print_row(const Row& row, double sgemm_gflops) {
  const double rate = row.work / row.seconds / 1e9;
  if (row.flops) {
    std::printf("%-34s %9.3f ms %9.1f GFLOP/s  %5.0f%% of sgemm\n", row.name.c_str(),
                row.seconds * 1e3, rate, 100.0 * rate / sgemm_gflops);
  } else {
    std::printf("%-34s %9.3f ms %9.1f GB/s\n", row.name.c_str(), row.seconds * 1e3, rate);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = threads_from(argc, argv);
  cpu::set_num_threads(threads);

  const int B = 8, S = 256, C = 384, NH = 6, V = 256;
  const int HS = C / NH;
  const int N = B * S;  // tokens per micro-batch
  std::printf("bench_kernels: B=%d S=%d C=%d NH=%d HS=%d V=%d, threads=%d, OpenBLAS %s\n", B, S, C,
              NH, HS, V, cpu::num_threads(), cpu::blas_parallel_mode());

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
  const double sgemm_first = measure_sgemm("first");
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
  const double sgemm_last = measure_sgemm("last");
  const double sgemm = 0.5 * (sgemm_first + sgemm_last);
  std::printf("sgemm reference (mean of first and last): %.1f GFLOP/s\n", sgemm);
  for (const auto& row : rows) print_row(row, sgemm);
  return 0;
}
