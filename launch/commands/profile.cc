#include "launch/commands/profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "launch/args.h"
#include "launch/commands/profile_device.h"
#include "launch/config/config_parse.h"
#include "launch/config/world_layout.h"
#include "models/registry.h"
#include "partitioner/planner.h"
#include "runtime/backend/backend.h"
#include "runtime/base/error.h"
#include "runtime/engine/grad_reducer.h"
#include "runtime/engine/optimizer.h"
#include "schedules/simulator.h"

namespace strata {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* kProfileUsage =
    "usage: strata profile --config FILE [--set k=v ...] [--out PROFILE.json] [--repeat N]\n"
    "                      [--micro-batch-sizes b1,b2,...]\n"
    "                      [--cluster-out CLUSTER.json [--cluster BASE]]\n"
    "\n"
    "Times, on this machine and backend (device, train.threads and train.precision of the\n"
    "config), the forward and backward of one transformer block, of the embedding and of the\n"
    "head of the config's model at its sequence length, and the optimizer step per parameter;\n"
    "each figure is the median of N rounds after two warm-up rounds. Writes the profile JSON\n"
    "that `strata plan --profile` reads (docs/planner.md).\n"
    "\n"
    "With --cluster-out it measures this device's efficiency curves instead (GEMM time by\n"
    "shape, attention by sequence and head size, memory-bound and optimizer bandwidth, the\n"
    "kernel gap; under mpirun with 2+ ranks also the link between ranks) and writes them into a\n"
    "cluster description for `strata plan --cluster CLUSTER.json` and `strata train --dry-run\n"
    "--cluster CLUSTER.json`.\n"
    "\n"
    "options:\n"
    "  --config FILE              the training config (its model, train and device keys)\n"
    "  --set section.key=value    override a config key (repeatable)\n"
    "  --out PROFILE.json         write the profile there (default: print it on stdout)\n"
    "  --repeat N                 timed rounds per figure (default 10; 3 for --cluster-out)\n"
    "  --micro-batch-sizes LIST   profile these micro-batch sizes (default: the config's\n"
    "                             train.micro_batch_size)\n"
    "  --cluster-out FILE         write this device's efficiency curves into a cluster file\n"
    "  --cluster BASE             the cluster (preset or file) whose nodes, links and memory\n"
    "                             the written file keeps (default: cpu-local on the CPU;\n"
    "                             required on a GPU)\n"
    "  --help                     this text\n"
    "\n"
    "exit status: 0 done, 2 bad input (one line: error: <file>: <where>: <expected>)\n";

// Warm-up passes, and the shortest timed round (several passes of a figure each).
constexpr int kWarmup = 2;
constexpr double kMinRoundS = 0.05;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One entry: the config's model built with three pieces (the embedding alone, one layer, the
// head alone) at micro-batch `micro`, and the per-parameter step work on the same parameters.
ProfileEntry measure_entry(Backend& be, const Config& cfg, const ModelOptions& base, int micro,
                           int repeat) {
  const int S = cfg.model.seq_len;
  ModelOptions o = base;
  o.pieces = {{0, 0, true, false},   // embedding
              {0, 1, false, false},  // layer 0
              {1, 0, false, true}};  // final norm, head, loss
  const std::unique_ptr<Model> model = build_model(cfg.model, o, be);

  // Tokens spread over the vocabulary (their values do not change the work).
  std::vector<int32_t> host(static_cast<size_t>(micro) * S), tgt(host.size());
  uint64_t x = 0x9e3779b97f4a7c15ULL ^ cfg.train.seed;
  for (size_t i = 0; i < host.size(); ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    host[i] = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(cfg.model.vocab_size));
    tgt[i] = static_cast<int32_t>((x >> 13) % static_cast<uint64_t>(cfg.model.vocab_size));
  }
  ModelBatch batch;
  batch.tokens = be.empty({micro, S}, MemCategory::kActivations, DType::kI32);
  batch.targets = be.empty({micro, S}, MemCategory::kActivations, DType::kI32);
  be.upload(batch.tokens, host.data());
  be.upload(batch.targets, tgt.data());
  const float scale = static_cast<float>(1.0 / (static_cast<double>(micro) * S));

  // One pass: the six figures of one micro-batch, added to acc[figure].
  auto pass = [&](double* acc) {
    LossSum loss;
    Clock::time_point c[7];
    be.synchronize();
    c[0] = Clock::now();
    PieceActsPtr emb = model->forward_piece(0, Tensor(), batch, &loss);
    be.synchronize();
    c[1] = Clock::now();
    PieceActsPtr blk = model->forward_piece(1, model->piece_output(*emb), batch, &loss);
    be.synchronize();
    c[2] = Clock::now();
    PieceActsPtr head = model->forward_piece(2, model->piece_output(*blk), batch, &loss);
    be.synchronize();
    c[3] = Clock::now();
    // The attention core alone (selective recompute runs it again in the backward pass), on the
    // layer's own saved inputs, in the run's activation type.
    model->rerun_selective_recompute(*blk);
    be.synchronize();
    const Clock::time_point a1 = Clock::now();
    Tensor d_head = model->backward_piece(*head, Tensor(), scale, false);
    be.synchronize();
    c[4] = Clock::now();
    Tensor d_blk = model->backward_piece(*blk, d_head, scale, false);
    be.synchronize();
    c[5] = Clock::now();
    model->backward_piece(*emb, d_blk, scale, false);
    be.synchronize();
    c[6] = Clock::now();
    acc[0] += seconds(c[0], c[1]);
    acc[1] += seconds(c[1], c[2]);
    acc[2] += seconds(c[2], c[3]);
    acc[3] += seconds(a1, c[4]);
    acc[4] += seconds(c[4], c[5]);
    acc[5] += seconds(c[5], c[6]);
    acc[6] += seconds(c[3], a1);
  };
  // Warm-up, then rounds of `inner` passes each lasting at least kMinRoundS, so that every
  // sample averages over the machine's scheduling noise the way a training step does; the
  // figure is the median over the rounds of the mean pass.
  double warm[7] = {0, 0, 0, 0, 0, 0, 0};
  for (int r = 0; r < kWarmup; ++r) pass(warm);
  double one = 0;
  for (double w : warm) one += w / kWarmup;
  const int inner =
      std::clamp(static_cast<int>(std::ceil(kMinRoundS / std::max(one, 1e-9))), 1, 1000);
  // [figure][round]: emb f, layer f, head f, head b, layer b, emb b, attention core f
  std::vector<std::vector<double>> t(7);
  for (int r = 0; r < repeat; ++r) {
    double acc[7] = {0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < inner; ++i) pass(acc);
    for (int k = 0; k < 7; ++k) t[static_cast<size_t>(k)].push_back(acc[k] / inner);
  }
  ProfileEntry e;
  e.micro_batch_size = micro;
  e.tensor = 1;
  e.embedding_forward_s = median(t[0]);
  e.layer_forward_s = median(t[1]);
  e.head_forward_s = median(t[2]);
  e.head_backward_s = median(t[3]);
  e.layer_backward_s = median(t[4]);
  e.embedding_backward_s = median(t[5]);
  e.attention_forward_s = median(t[6]);

  // The step's per-parameter work, as the trainer does it on one rank: zero the gradients,
  // (no reduction), the norm, clipping, AdamW over the parameters' segments (one per tensor,
  // as in the whole model), on this three-piece model so that large models need no more
  // than one block's parameters.
  ParamStore& params = model->params();
  std::vector<ParamSpan> spans;
  for (const ParamInfo& p : params.infos()) spans.push_back({p.offset, p.numel, p.decay, true});
  GradReducer reducer(be, nullptr, params.grads(), spans, cfg.comm.bucket_mb, false);
  AdamW opt(be, cfg.optimizer, reducer.optimizer_segments());
  auto step = [&]() {
    params.zero_grads();
    reducer.begin_iteration();
    reducer.finish();
    const double norm = std::sqrt(reducer.local_sum_squares());
    // Clipping scales every gradient inside the AdamW update, as in the trainer.
    opt.step(params.params(), reducer.optimizer_grads(), cfg.optimizer.lr, 1.0 / (1.0 + norm));
    be.synchronize();
  };
  Clock::time_point w0 = Clock::now();
  for (int r = 0; r < kWarmup; ++r) step();
  const double one_step = seconds(w0, Clock::now()) / kWarmup;
  const int inner_steps =
      std::clamp(static_cast<int>(std::ceil(kMinRoundS / std::max(one_step, 1e-9))), 1, 1000);
  std::vector<double> steps;
  for (int r = 0; r < repeat; ++r) {
    be.synchronize();
    const Clock::time_point a = Clock::now();
    for (int i = 0; i < inner_steps; ++i) step();
    steps.push_back(seconds(a, Clock::now()) / inner_steps);
  }
  e.optimizer_s_per_param = median(steps) / static_cast<double>(params.numel());
  return e;
}

}  // namespace

json make_profile(const Config& cfg, int repeat, const std::vector<int>& micro_batch_sizes) {
  if (repeat < 1) throw InputError("<command line>", "--repeat", "a positive integer");
  if (cfg.layout.tensor != 1 || cfg.layout.sequence_parallel) {
    // One process profiles tensor rank shapes of t = 1 only.
    throw InputError(cfg.source_file, "parallel.tensor",
                     "1 for strata profile (it times one unsharded rank)");
  }
  const int threads = resolve_cpu_threads(cfg.train.threads, 1);
  std::unique_ptr<Backend> backend = make_backend(cfg.device, threads, cfg.train.attention_backend);
  ModelOptions options;
  options.bf16 = cfg.train.precision == "bf16";  // as the trainer: bf16 weights and activations
  options.seed = cfg.train.seed;
  std::vector<int> sizes = micro_batch_sizes;
  if (sizes.empty()) sizes.push_back(cfg.layout.micro_batch_size);
  Profile p;
  p.device = backend->name();
  p.precision = cfg.train.precision;
  p.seq_len = cfg.model.seq_len;
  p.hidden_size = cfg.model.hidden_size;
  for (int b : sizes) p.entries.push_back(measure_entry(*backend, cfg, options, b, repeat));
  json j = profile_to_json(p);
  // Context for a reader (the loader ignores these keys).
  j["threads"] = threads;
  j["repeat"] = repeat;
  j["model"] = describe_model(cfg.model)->shape_json();
  return j;
}

json predict_with_profile(const Config& cfg, const Cluster& cluster, const Profile& profile) {
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.cluster = cluster;
  req.cluster.nodes = 1;
  req.cluster.gpus_per_node = 1;
  req.global_batch_size = cfg.train.global_batch_size;
  req.precision = cfg.train.precision;
  req.memory.precision = cfg.train.precision;
  if (cfg.train.precision == "fp32") {
    req.memory.flash_attention = false;  // the CPU runtime keeps the probabilities
    req.memory.cpu_threads = cfg.train.threads.value_or(1);
  }
  req.memory.bucket_mb = cfg.comm.bucket_mb;
  req.runtime = strata_runtime(cfg.device != "cuda", cfg.train.precision, cfg.comm.bucket_mb);
  check_profile_matches(profile, *req.model, req.precision, "<profile>");
  req.profile = &profile;
  ParallelLayout c = layout_for_world(cfg, 1);
  if (c.tensor * c.pipeline * c.data != 1) {
    throw InputError(cfg.source_file, "parallel",
                     "tensor = pipeline = data = 1 for a one-rank prediction");
  }
  c.sequence_parallel = false;
  c.distributed_optimizer = false;
  return plan_result_json(evaluate_plan(req, c));
}

namespace {

// --cluster-out: the device's curves into a cluster file (profile_device.h). Rank 0 writes.
// comm: the world (collective over it).
int write_device_cluster(const Config& cfg, const std::string& base_name, const std::string& out,
                         int repeat, Communicator& comm) {
  const World& w = world();
  const int threads = resolve_cpu_threads(cfg.train.threads, w.local_size);
  std::unique_ptr<Backend> backend = make_backend(cfg.device, threads, cfg.train.attention_backend);
  const bool gpu = backend->device() == Device::kCUDA;
  if (gpu && base_name.empty()) {
    bad_flag("--cluster",
             "a base cluster for a GPU profile (its nodes, links and memory are "
             "kept): --cluster PRESET|FILE");
  }
  const Cluster base = load_cluster(base_name.empty() ? "cpu-local" : base_name, configs_dir());
  const json j = measure_device_cluster(cfg, *backend, &comm, base, repeat);
  if (w.rank != 0) return 0;
  {
    std::ofstream f(out);
    f << j.dump(2) << "\n";
    if (!f) bad_flag("--cluster-out", "a writable path, got " + out);
  }
  const Cluster c = cluster_from_json(j, out);
  const GemmCurve* g = c.efficiency.gemm_for(cfg.train.precision);
  std::printf(
      "strata profile: %s, %s, %d rank(s) -> %s\n"
      "  GEMMs: %.4g FLOP/s large, %.3g s fixed, %.4g B/s operands (%zu shapes)\n"
      "  memory-bound kernels %.4g B/s, optimizer %.4g B/s, kernel gap %.3g s\n",
      backend->name().c_str(), cfg.train.precision.c_str(), w.size, out.c_str(), g->flops,
      g->fixed_s, g->bandwidth, g->points.size(), c.efficiency.memory_bandwidth,
      c.efficiency.optimizer_rate(), c.efficiency.kernel_gap_s);
  if (w.size > 1)
    std::printf("  link between ranks: %.4g B/s, %.3g s latency\n", c.intra_node.bandwidth,
                c.intra_node.latency_s);
  return 0;
}

}  // namespace

int cmd_profile(const std::vector<std::string>& args) {
  std::string config, out, cluster_out, cluster_base;
  std::vector<std::string> sets;
  std::vector<int> sizes;
  int repeat = 0;  // 0: not given (10 rounds for a profile, 3 for --cluster-out)
  const std::vector<Flag> flags = {
      path_flag("--config", &config, "a config file path"),
      value_flag("--set",
                 [&sets](const std::string& v) {
                   if (v.find('=') == std::string::npos || v.front() == '=')
                     bad_flag("--set", "section.key=value, got '" + v + "'");
                   sets.push_back(v);
                 }),
      path_flag("--out", &out, "an output file path"),
      positive_flag("--repeat", &repeat, 100000),
      path_flag("--cluster-out", &cluster_out, "an output file path"),
      path_flag("--cluster", &cluster_base, "a cluster preset or file"),
      value_flag("--micro-batch-sizes",
                 [&sizes](const std::string& v) {
                   sizes.clear();
                   for (size_t start = 0; start <= v.size();) {
                     const size_t comma = std::min(v.find(',', start), v.size());
                     sizes.push_back(positive_int("--micro-batch-sizes",
                                                  v.substr(start, comma - start), 1 << 20));
                     start = comma + 1;
                   }
                 }),
  };
  if (!read_flags(args, flags, kProfileUsage,
                  "an option of strata profile (see strata profile --help)"))
    return 0;
  if (config.empty()) bad_flag("--config", "a config: strata profile --config FILE");
  const Config cfg = load_config(config, sets);
  if (!out.empty()) check_output_flag("--out", out);
  if (!cluster_out.empty()) {
    // Under mpirun every rank measures; rank 0 alone probes the output path (two ranks probing
    // one file at once would see each other's probe) and its verdict reaches all of them.
    std::unique_ptr<Communicator> comm =
        make_world_communicator(CommBackend::kMPI, cfg.comm.timeout_s);
    decide_on_rank0(*comm, [&]() -> std::string {
      check_output_flag("--cluster-out", cluster_out);
      return "";
    });
    write_device_cluster(cfg, cluster_base, cluster_out, repeat > 0 ? repeat : 3, *comm);
    if (out.empty()) return 0;
  } else if (!cluster_base.empty()) {
    bad_flag("--cluster", "--cluster-out FILE with it (the base of the cluster written)");
  }
  if (repeat == 0) repeat = 10;
  const json j = make_profile(cfg, repeat, sizes);
  if (out.empty()) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  {
    std::ofstream f(out);
    f << j.dump(2) << "\n";
    if (!f) bad_flag("--out", "a writable path, got " + out);
  }
  std::printf("strata profile: %s, seq %d, hidden %d, %d timed rounds each -> %s\n",
              j["device"].get<std::string>().c_str(), cfg.model.seq_len, cfg.model.hidden_size,
              repeat, out.c_str());
  std::printf("  %5s %12s %12s %12s %12s %12s %12s %12s %14s\n", "b", "layer_f_ms", "layer_b_ms",
              "attn_f_ms", "emb_f_ms", "emb_b_ms", "head_f_ms", "head_b_ms", "opt_ns/param");
  for (const json& e : j["entries"]) {
    std::printf(
        "  %5d %12.4f %12.4f %12.4f %12.4f %12.4f %12.4f %12.4f %14.4f\n",
        e["micro_batch_size"].get<int>(), e["layer_forward_s"].get<double>() * 1e3,
        e["layer_backward_s"].get<double>() * 1e3, e["attention_forward_s"].get<double>() * 1e3,
        e["embedding_forward_s"].get<double>() * 1e3, e["embedding_backward_s"].get<double>() * 1e3,
        e["head_forward_s"].get<double>() * 1e3, e["head_backward_s"].get<double>() * 1e3,
        e["optimizer_s_per_param"].get<double>() * 1e9);
  }
  return 0;
}

}  // namespace strata
