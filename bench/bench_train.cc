// bench_train — single-process training throughput on the CPU backend.
//
// GPT with 6 layers, hidden 384, 6 heads, sequence 256, vocabulary 256, micro-batch 8 (issue
// 2's benchmark model). Prints tokens/s and achieved GFLOP/s (Megatron's model FLOP count: 6 ×
// matmul parameters × tokens plus the attention FLOPs), and beside it the OpenBLAS sgemm rate of
// this machine at the same thread count, measured in the same run, so the ratio is meaningful
// whatever the machine. Never fails on time.
//
// usage: bench_train [threads] [iterations]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "models/registry.h"
#include "runtime/backend/backend.h"
#include "runtime/base/rng.h"
#include "runtime/engine/optimizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double sgemm_gflops(int M, int N, int K, int reps) {
  std::vector<float> a(static_cast<size_t>(M) * K), b(static_cast<size_t>(N) * K),
      c(static_cast<size_t>(M) * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(strata::normal01(1, i));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(strata::normal01(2, i));
  strata::kernels::cpu::gemm<float>(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f,
                                    c.data(), N);  // warm-up
  const auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r)
    strata::kernels::cpu::gemm<float>(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f,
                                      c.data(), N);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return 2.0 * M * N * K * reps / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  const int threads = argc > 1 ? std::atoi(argv[1]) : resolve_cpu_threads(std::nullopt, 1);
  const int iters = argc > 2 ? std::atoi(argv[2]) : 5;
  auto be = make_backend("cpu", threads);

  ModelConfig mc;
  mc.num_layers = 6;
  mc.hidden_size = 384;
  mc.num_heads = 6;
  mc.ffn_hidden_size = 4 * 384;
  mc.seq_len = 256;
  mc.vocab_size = 256;
  const int B = 8, S = mc.seq_len;
  ModelOptions mo;
  mo.seed = 1234;
  const std::unique_ptr<Model> model = build_model(mc, mo, *be);
  ParamStore& params = model->params();
  std::vector<OptSegment> segments;
  for (const ParamInfo& p : params.infos())
    segments.push_back({p.offset, p.offset, p.numel, p.decay});
  OptimizerConfig oc;
  AdamW opt(*be, oc, segments);

  Tensor tokens = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
  Tensor targets = be->empty({B, S}, MemCategory::kActivations, DType::kI32);
  for (int i = 0; i < B * S; ++i) {
    tokens.i32()[i] = static_cast<int32_t>(mix64(static_cast<uint64_t>(i)) % 256);
    targets.i32()[i] = static_cast<int32_t>(mix64(static_cast<uint64_t>(i) + 7777) % 256);
  }
  auto step = [&] {
    params.zero_grads();
    LossSum loss;
    auto acts = model->forward(ModelBatch{tokens, targets, Tensor()}, &loss);
    model->backward(*acts, 1.0f / static_cast<float>(B * S));
    opt.step(params.params(), params.grads(), 1e-4);
  };
  step();  // warm-up: first-touch of every buffer
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) step();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count() / iters;

  const std::unique_ptr<ModelDescription> desc = describe_model(mc);
  const FlopCount f = desc->flops_per_iteration(B, Recompute::kNone);
  const double tok_s = B * S / s;
  const double gflops = f.model / s / 1e9;
  const double peak = sgemm_gflops(2048, 2048, 2048, 3);
  const double mlp = sgemm_gflops(B * S, 4 * 384, 384, 10);
  std::printf(
      "bench_train: GPT 6 layers, hidden 384, 6 heads, seq 256, vocab 256, micro-batch 8\n");
  std::printf("  backend              %s\n", be->name().c_str());
  std::printf("  parameters           %lld\n", static_cast<long long>(desc->parameters()));
  std::printf("  step                 %.1f ms (mean of %d)\n", s * 1e3, iters);
  std::printf("  tokens/s             %.0f\n", tok_s);
  std::printf("  achieved GFLOP/s     %.1f (model FLOPs %.3g per step)\n", gflops, f.model);
  std::printf("  sgemm 2048^3         %.1f GFLOP/s (same %d threads, same run)\n", peak, threads);
  std::printf("  sgemm MLP shape      %.1f GFLOP/s (2048 x 1536 x 384)\n", mlp);
  std::printf("  training / sgemm     %.2f (target >= 0.50)\n", gflops / peak);
  return 0;
}
