#include "launch/commands/profile_device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "models/registry.h"
#include "partitioner/efficiency.h"
#include "partitioner/runtime_model.h"
#include "runtime/engine/optimizer.h"

namespace strata {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Times one rank's own work (never a collective: the number of calls is the rank's own).
// Every rank runs the same measurements in the same order, started together (sync()), so
// ranks sharing a machine contend as in training; a barrier per figure would spin in MPI while
// the other rank computes, and is left out.
struct Timer {
  Backend& be;
  Communicator* world;
  int repeat;
  double min_round_s;

  void sync() const {
    if (world != nullptr && world->size() > 1) world->barrier();
  }

  // Median over `repeat` rounds of the mean time of `f`, each round as many calls as fill
  // min_round_s, after one warm-up call.
  double operator()(const std::function<void()>& f) const {
    be.synchronize();
    auto t0 = Clock::now();
    f();
    be.synchronize();
    const double one = std::chrono::duration<double>(Clock::now() - t0).count();
    const int inner =
        std::clamp(static_cast<int>(std::ceil(min_round_s / std::max(one, 1e-7))), 1, 100000);
    std::vector<double> rounds;
    for (int r = 0; r < repeat; ++r) {
      be.synchronize();
      t0 = Clock::now();
      for (int i = 0; i < inner; ++i) f();
      be.synchronize();
      rounds.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / inner);
    }
    std::sort(rounds.begin(), rounds.end());
    return rounds[rounds.size() / 2];
  }
};

// A tensor of `shape` in `dtype` holding values in [-1, 1) (f32 written, then cast).
Tensor filled(Backend& be, const Shape& shape, DType dtype, uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> host(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 12345u;
  for (float& v : host) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(x >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  }
  Tensor f = be.empty(shape, MemCategory::kActivations, DType::kF32);
  be.upload(f, host.data());
  if (dtype == DType::kF32) return f;
  Tensor t = be.empty(shape, MemCategory::kActivations, dtype);
  be.cast(t, f);
  return t;
}

json gemm_curve(const Config& cfg, Backend& be, const Timer& time, DType dt, bool gpu) {
  // The grid, and the model's own shapes (forward, input and weight gradients of the layer's
  // and the head's GEMMs at the config's micro-batch).
  std::set<std::array<double, 3>> shapes;
  const double lo = gpu ? 256 : 128, hi = gpu ? 16384 : 2048;
  const double max_flops = gpu ? std::pow(2.0, 41) : std::pow(2.0, 30);
  for (double m = lo; m <= hi; m *= 4)
    for (double n = lo; n <= hi; n *= 4)
      for (double k = lo; k <= hi; k *= 4)
        if (2 * m * n * k <= max_flops) shapes.insert({m, n, k});
  const std::unique_ptr<ModelDescription> d = describe_model(cfg.model);
  const int b = cfg.layout.micro_batch_size;
  for (int t : {1, 2, 4, cfg.layout.tensor}) {
    if (!d->tensor_split_reason(t, false).empty()) continue;
    std::vector<PartWork> parts = {d->head_work(b, RankShape{t, false})};
    for (int kind = 0; kind < d->layer_kinds(); ++kind)
      parts.push_back(d->layer_work(b, RankShape{t, false}, kind));
    for (const PartWork& w : parts) {
      for (const GemmShape& g : w.gemms) {
        shapes.insert({g.m, g.n, g.k});
        shapes.insert({g.m, g.k, g.n});
        shapes.insert({g.n, g.k, g.m});
      }
    }
  }
  std::vector<std::array<double, 4>> points;
  time.sync();
  for (const auto& [M, N, K] : shapes) {
    const int64_t m = static_cast<int64_t>(M), n = static_cast<int64_t>(N),
                  k = static_cast<int64_t>(K);
    Tensor inp = filled(be, {m, k}, dt, 1), w = filled(be, {n, k}, dt, 2);
    Tensor out = be.empty({m, n}, MemCategory::kActivations, dt);
    const double s = time([&] { be.matmul_forward(out, inp, w, nullptr); });
    points.push_back({M, N, K, 2 * M * N * K / s});
  }
  const GemmCurve c = fit_gemm_curve(points, static_cast<double>(dtype_size(dt)));
  json pts = json::array();
  for (const auto& p : c.points) pts.push_back({p[0], p[1], p[2], p[3]});
  return {{"flops", c.flops}, {"fixed_s", c.fixed_s}, {"bandwidth", c.bandwidth}, {"points", pts}};
}

json attention_table(const Config& cfg, Backend& be, const Timer& time, DType dt) {
  const int B = cfg.layout.micro_batch_size, S = cfg.model.seq_len, C = cfg.model.hidden_size;
  std::set<int> heads_sizes = {64, 128, C / cfg.model.num_heads};
  json fwd = json::array(), bwd = json::array();
  time.sync();
  for (int hs : heads_sizes) {
    if (hs <= 0 || C % hs != 0) continue;
    const int nh = C / hs;
    for (int s : {S / 4, S / 2, S}) {
      if (s < 16) continue;
      Tensor qkv = filled(be, {B, s, 3 * nh * hs}, dt, 3);
      Tensor out = be.empty({B, s, nh * hs}, MemCategory::kActivations, dt);
      Tensor saved = be.empty(be.attention_saved_shape(B, nh, s), MemCategory::kActivations);
      Tensor dout = filled(be, {B, s, nh * hs}, dt, 4);
      Tensor dqkv = be.empty({B, s, 3 * nh * hs}, MemCategory::kActivations, dt);
      // The planner's counting: the causal half of 4·B·s²·C forward, twice that backward.
      const double flops = 0.5 * 4.0 * B * double{1.0} * s * s * nh * hs;
      const double tf = time([&] { be.attention_forward(out, saved, qkv, nh, nh); });
      const double tb = time([&] { be.attention_backward(dqkv, dout, qkv, out, saved, nh, nh); });
      fwd.push_back({s, hs, flops / tf});
      bwd.push_back({s, hs, 2 * flops / tb});
    }
  }
  return {{"forward", fwd}, {"backward", bwd}};
}

// The layer's elementwise kernels, forward and backward, against the bytes the description
// counts for them.
double elementwise_bandwidth(const Config& cfg, Backend& be, const Timer& time, DType dt) {
  const int64_t B = cfg.layout.micro_batch_size, S = cfg.model.seq_len, C = cfg.model.hidden_size;
  const int64_t F = cfg.model.ffn_hidden_size, N = B * S;
  // The block's own norm and MLP activation (the registry's spec of the config's model).
  const BlockSpec block = model_spec(cfg.model).block;
  const bool rms = block.norm.kind == NormKind::kRMSNorm;
  const bool swiglu = block.mlp.activation == MlpActivation::kSwiGlu;
  Tensor x = filled(be, {N, C}, dt, 5), y = filled(be, {N, C}, dt, 6),
         out = filled(be, {N, C}, dt, 7);
  Tensor dx = filled(be, {N, C}, dt, 8);
  Tensor w = filled(be, {C}, dt, 9), bias = filled(be, {C}, dt, 10);
  Tensor dw = filled(be, {C}, DType::kF32, 11), db = filled(be, {C}, DType::kF32, 12);
  Tensor mean = filled(be, {N}, DType::kF32, 13), rstd = filled(be, {N}, DType::kF32, 14);
  Tensor h = filled(be, {N, (swiglu ? 2 : 1) * F}, dt, 15), g = filled(be, {N, F}, dt, 16);
  Tensor dh = filled(be, {N, (swiglu ? 2 : 1) * F}, dt, 17), dg = filled(be, {N, F}, dt, 18);
  const float eps = static_cast<float>(block.norm.eps);
  auto norm_f = [&] {
    if (rms)
      be.rmsnorm_forward(out, rstd, x, w, eps);
    else
      be.layernorm_forward(out, mean, rstd, x, w, bias);
  };
  auto norm_b = [&] {
    if (rms)
      be.rmsnorm_backward(dx, dw, out, x, w, rstd);
    else
      be.layernorm_backward(dx, dw, db, out, x, w, mean, rstd);
  };
  auto act_f = [&] {
    if (swiglu)
      be.swiglu_forward(g, h);
    else
      be.gelu_forward(g, h);
  };
  auto act_b = [&] {
    if (swiglu)
      be.swiglu_backward(dh, dg, h);
    else
      be.gelu_backward(dh, h, dg);
  };
  // Per layer: two norms, the activation, two residual adds, each way.
  time.sync();
  const double t = 2 * time(norm_f) + time(act_f) + 2 * time([&] { be.add_inplace(y, x); }) +
                   2 * time(norm_b) + time(act_b) + 2 * time([&] { be.add_inplace(dx, y); });
  const std::unique_ptr<ModelDescription> d = describe_model(cfg.model);
  // The block's own kernels (kind 0: model_spec's block, timed above).
  const PartWork work = d->layer_work(static_cast<int>(B), RankShape{}, 0);
  return (work.elementwise_fwd + work.elementwise_bwd) * static_cast<double>(dtype_size(dt)) / t;
}

// The step's per-parameter work over a buffer, against the runtime's bytes per parameter.
double optimizer_bandwidth(const Config& cfg, Backend& be, const Timer& time, bool gpu) {
  const int64_t n = gpu ? (int64_t{1} << 24) : (int64_t{1} << 22);
  Tensor p = filled(be, {n}, DType::kF32, 19), grad = filled(be, {n}, DType::kF32, 20);
  const bool bf16 = cfg.train.precision == "bf16";
  Tensor low = bf16 ? be.empty({n}, MemCategory::kParameters, DType::kBF16) : Tensor();
  AdamW opt(be, cfg.optimizer, {OptSegment{0, 0, n, true}});
  time.sync();
  const double s = time([&] {
    be.zero(grad);
    be.sum_squares(grad);
    opt.step(p, grad, 1e-4, 1.0);
    if (bf16) be.cast(low, p);
  });
  return strata_runtime(!gpu, cfg.train.precision).step_bytes_per_param * n / s;
}

// Ring all-reduce times over the world at several sizes, fitted to
// t = 2(n−1)/n · bytes / bandwidth + 2(n−1) · latency (least squares on the two unknowns).
Link measure_link(Backend& be, Communicator& world, int repeat) {
  const double n = world.size();
  std::vector<std::pair<double, double>> xy;  // (2(n−1)/n · bytes, seconds)
  for (int64_t bytes : {int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 22, int64_t{1} << 24}) {
    Tensor buf = filled(be, {bytes / 4}, DType::kF32, 21);
    // The same number of calls on every rank (a collective): two warm-up calls, then rounds
    // of ten; the median round.
    world.barrier();
    for (int i = 0; i < 2; ++i) world.all_reduce(buf, ReduceOp::kSum);
    std::vector<double> rounds;
    for (int r = 0; r < std::max(3, repeat); ++r) {
      be.synchronize();
      const auto t0 = Clock::now();
      for (int i = 0; i < 10; ++i) world.all_reduce(buf, ReduceOp::kSum);
      be.synchronize();
      rounds.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 10);
    }
    std::sort(rounds.begin(), rounds.end());
    xy.push_back({2 * (n - 1) / n * static_cast<double>(bytes), rounds[rounds.size() / 2]});
  }
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : xy) {
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double k = static_cast<double>(xy.size());
  const double slope = (k * sxy - sx * sy) / (k * sxx - sx * sx);
  const double intercept = (sy - slope * sx) / k;
  Link l;
  l.bandwidth = 1.0 / std::max(slope, 1e-15);
  l.latency_s = std::max(0.0, intercept / (2 * (n - 1)));
  l.efficiency = 1.0;
  return l;
}

}  // namespace

json measure_device_cluster(const Config& cfg, Backend& be, Communicator* world,
                            const Cluster& base, int repeat) {
  const bool gpu = be.device() == Device::kCUDA;
  const DType dt = cfg.train.precision == "bf16" ? DType::kBF16 : DType::kF32;
  const Timer time{be, world, repeat, gpu ? 0.005 : 0.02};
  json eff = {{"source", "strata profile on " + be.name() + ", " + cfg.train.precision +
                             ", config " + cfg.source_file},
              {"sustained", base.efficiency_measured ? base.efficiency.sustained : 1.0}};
  eff["gemm"][cfg.train.precision] = gemm_curve(cfg, be, time, dt, gpu);
  eff["attention"][cfg.train.precision] = attention_table(cfg, be, time, dt);
  eff["memory_bandwidth"] = elementwise_bandwidth(cfg, be, time, dt);
  eff["optimizer_bandwidth"] = optimizer_bandwidth(cfg, be, time, gpu);
  Tensor one = filled(be, {1}, DType::kF32, 22), other = filled(be, {1}, DType::kF32, 23);
  eff["kernel_gap_s"] = time([&] { be.add_inplace(one, other); });

  Cluster c = base;
  c.efficiency = efficiency_from_json(eff, "<strata profile>");
  c.efficiency_measured = true;
  c.cpu = !gpu;
  if (world != nullptr && world->size() > 1) {
    // The ranks measured are one node: the link between them is the one measured.
    c.intra_node = measure_link(be, *world, repeat);
    c.nodes = 1;
    c.gpus_per_node = world->size();
  }
  if (const std::optional<double> peak = be.peak_flops(cfg.train.precision)) {
    c.peak_flops[cfg.train.precision] = *peak;
  }
  return cluster_to_json(c);
}

}  // namespace strata
