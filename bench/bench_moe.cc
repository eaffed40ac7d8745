// bench_moe — a mixture of experts at expert 1, 2 and 4, under `mpirun -np 4` (any world the
// expert sizes divide), CPU backend, fp32. Prints, per expert size e:
//   layer    one MoE layer's forward + backward (hidden 256, 8 SwiGLU experts of 512, top-2,
//            512 tokens a rank): ms and tokens/s over the world (the slowest rank's time,
//            median of blocks);
//   a2a      the layer's all-to-alls (the counts, the rows to the experts and back, and the
//            same two in the backward) replayed alone with the counts the layer used, and their
//            share of the layer's time;
//   train    training steps of a small Mixtral (4 layers, hidden 128, 8 experts of 256, top-2,
//            sequence 128) at data = world: tokens/s from the trainer's own figures.
// and, at expert 1, what dispatch and combine cost inside the layer — the dispatch plan, the
// permutation into the expert order and the weighted combine, forward and backward, each timed
// alone on the layer's own tensors — as a share of the layer's time (issue 37's target: under
// 15%). Never fails on time; the machine's figures are what they are (docs/testing.md: oversub-
// scribed ranks share cores, so compare the rows of one run).
//
// usage: mpirun -np 4 bench_moe [blocks]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "models/layers/moe.h"
#include "models/layers/parallel.h"
#include "runtime/backend/backend.h"
#include "runtime/base/rng.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/process_groups.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kC = 256, kF = 512, kB = 4, kS = 128;
constexpr int kExperts = 8, kTopK = 2;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of `body`, the slowest rank's, median over blocks of `reps` calls.
double timed(Communicator& world, const std::function<void()>& body, int blocks, int reps) {
  body();  // warm-up
  std::vector<double> t;
  for (int b = 0; b < blocks; ++b) {
    world.barrier();
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) body();
    float s = static_cast<float>(std::chrono::duration<double>(Clock::now() - t0).count() / reps);
    world.all_reduce(&s, 1, DType::kF32, ReduceOp::kMax);
    t.push_back(s);
  }
  return median(t);
}

Tensor random(Backend& be, const Shape& shape, uint64_t seed) {
  Tensor t = be.empty(shape, MemCategory::kActivations);
  std::vector<float> h(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(normal01(seed, i));
  be.upload(t, h.data());
  return t;
}

struct LayerFigures {
  double layer_s = 0, a2a_s = 0, dispatch_combine_s = 0;
};

LayerFigures bench_layer(Backend& be, int e, int blocks) {
  const int world_size = world().size;
  ProcessGroups g = make_process_groups(1, 1, world_size, CommBackend::kMPI, 300, nullptr, e);
  MoeSpec spec;
  spec.experts = kExperts;
  spec.top_k = kTopK;
  spec.hidden = kF;
  ParamLayout layout(1, 0, e, g.ep_rank);
  const MixtureOfExperts moe(layout, spec, {"router", "experts_gate_up", "experts_down"}, kC, 0.5,
                             0.02);
  ParamStore store(std::move(layout), be, false, 1234);
  TensorParallel tp(be, nullptr, 1, 0, false, DType::kF32);
  const LayerEnv env{be, store, tp, DType::kF32, g.ep.get()};
  // Each rank routes its own tokens.
  const Tensor x = random(be, {kB, kS, kC}, 10 + static_cast<uint64_t>(g.dp_rank));
  const Tensor residual = be.zeros({kB, kS, kC}, MemCategory::kActivations);
  const Tensor dout = random(be, {kB, kS, kC}, 20 + static_cast<uint64_t>(g.dp_rank));

  LayerFigures f;
  MixtureOfExperts::Saved kept;
  f.layer_s = timed(
      *g.world,
      [&] {
        MixtureOfExperts::Saved s;
        moe.forward(env, x, residual, s, nullptr);
        if (e > 1) kept = s;  // the counts of this routing (the same every call)
        BackwardPass pass;
        moe.backward(env, pass, dout, s);
      },
      blocks, 3);

  if (e > 1) {
    // The layer's all-to-alls alone: the counts (E/e a peer), then rows there and back, twice.
    const auto rows = [](const std::vector<size_t>& v) {
      std::vector<size_t> out(v);
      for (size_t& n : out) n *= static_cast<size_t>(kC);
      return out;
    };
    size_t sent = 0, received = 0;
    for (size_t n : kept.sent) sent += n;
    for (size_t n : kept.received) received += n;
    Tensor a = be.empty({static_cast<int64_t>(sent), kC}, MemCategory::kActivations);
    Tensor b = be.empty({static_cast<int64_t>(received), kC}, MemCategory::kActivations);
    std::vector<int32_t> cs(kExperts), cr(kExperts);
    const std::vector<size_t> per_peer(static_cast<size_t>(e), kExperts / e);
    f.a2a_s = timed(
        *g.world,
        [&] {
          g.ep->all_to_allv(cs.data(), per_peer, cr.data(), per_peer, DType::kI32);
          for (int pass = 0; pass < 2; ++pass) {
            g.ep->all_to_allv(a.data(), rows(kept.sent), b.data(), rows(kept.received),
                              DType::kF32);
            g.ep->all_to_allv(b.data(), rows(kept.received), a.data(), rows(kept.sent),
                              DType::kF32);
          }
        },
        blocks, 3);
  } else {
    // Dispatch and combine inside the layer: the plan, the permutation, the weighted combine
    // and the two backwards, on a routing of these tokens.
    const int64_t N = kB * kS;
    MixtureOfExperts::Saved s;
    moe.forward(env, x, residual, s, nullptr);
    Tensor counts = be.empty({kExperts}, MemCategory::kActivations, DType::kI32);
    Tensor routed = be.empty({kExperts}, MemCategory::kActivations, DType::kI32);
    const int64_t R = s.xp.size(0);
    Tensor xp = be.empty({R, kC}, MemCategory::kActivations);
    Tensor out = be.empty({N, kC}, MemCategory::kActivations);
    Tensor dy = be.empty({R, kC}, MemCategory::kActivations);
    Tensor dw = be.empty({N, kTopK}, MemCategory::kActivations);
    Tensor dx = be.empty({N, kC}, MemCategory::kActivations);
    f.dispatch_combine_s = timed(
        *g.world,
        [&] {
          be.moe_dispatch_plan(s.dest, counts, routed, s.topk_idx, s.topk_w, kExperts, -1);
          be.moe_permute(xp, s.x, s.dest);
          be.moe_unpermute(out, s.y, s.dest, s.topk_w);
          be.moe_unpermute_backward(dy, dw, out, s.y, s.dest, s.topk_w);
          be.moe_permute_backward(dx, xp, s.dest);
        },
        blocks, 3);
  }
  return f;
}

double bench_training(int e) {
  const int world_size = world().size;
  const Config cfg = load_config(
      "", {"model.preset=mixtral-tiny", "model.num_layers=4", "model.hidden_size=128",
           "model.num_heads=4", "model.num_key_value_heads=2", "model.num_experts=8",
           "model.moe_intermediate_size=256", "model.seq_len=128", "model.vocab_size=256",
           "train.threads=1", "train.iterations=6", "train.micro_batch_size=4",
           "train.global_batch_size=" + std::to_string(8 * world_size), "train.eval_interval=0",
           "data.source=synthetic", "log.interval=1000", "parallel.expert=" + std::to_string(e)});
  RunContext ctx;
  ctx.verbose = false;
  const TrainResult r = run_training(cfg, ctx);
  // The steps after the first two (warm-up), tokens over their wall time.
  double s = 0;
  for (size_t i = 2; i < r.step_s.size(); ++i) s += r.step_s[i];
  const double tokens = static_cast<double>(cfg.train.global_batch_size) * cfg.model.seq_len *
                        static_cast<double>(r.step_s.size() - 2);
  return tokens / s;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  const World w = init_world(&argc, &argv);
  const int blocks = argc > 1 ? std::max(3, std::atoi(argv[1])) : 7;
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  if (w.rank == 0)
    std::printf(
        "bench_moe: %d ranks, CPU fp32, one thread a rank; layer: hidden %lld, %d experts of "
        "%lld, top-%d, %lld tokens a rank\n",
        w.size, static_cast<long long>(kC), kExperts, static_cast<long long>(kF), kTopK,
        static_cast<long long>(kB * kS));
  double layer1 = 0;
  for (int e : {1, 2, 4}) {
    if (w.size % e != 0 || kExperts % e != 0) continue;
    const LayerFigures f = bench_layer(*be, e, blocks);
    const double tokens = static_cast<double>(kB * kS) * w.size;
    const double train = bench_training(e);
    if (e == 1) layer1 = f.layer_s;
    if (w.rank == 0) {
      std::printf("expert %d: layer %7.2f ms (%8.0f tok/s, %.2fx expert 1)", e, f.layer_s * 1e3,
                  tokens / f.layer_s, layer1 / f.layer_s);
      if (e > 1)
        std::printf(" | a2a %6.2f ms = %4.1f%% of the layer", f.a2a_s * 1e3,
                    100 * f.a2a_s / f.layer_s);
      else
        std::printf(" | dispatch + combine %6.2f ms = %4.1f%% of the layer (target < 15%%)",
                    f.dispatch_combine_s * 1e3, 100 * f.dispatch_combine_s / f.layer_s);
      std::printf(" | train %8.0f tok/s\n", train);
    }
  }
  finalize_world();
  return 0;
}
