#include "partitioner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "runtime/error.h"
#include "runtime/json_file.h"

namespace strata {

using nlohmann::json;

namespace {

double get_num(const json& o, const char* key, const std::string& where, const std::string& file) {
  if (!o.contains(key) || !o.at(key).is_number() || o.at(key).get<double>() < 0) {
    throw InputError(file, where + "." + key, "a non-negative number");
  }
  return o.at(key).get<double>();
}

}  // namespace

Profile profile_from_json(const json& j, const std::string& file) {
  if (!j.is_object() || !j.contains("entries") || !j.at("entries").is_array() ||
      j.at("entries").empty()) {
    throw InputError(file, "entries", "a non-empty array of per-layer timings");
  }
  Profile p;
  p.device = j.value("device", std::string());
  p.precision = j.value("precision", std::string("fp32"));
  p.seq_len = j.value("seq_len", 0);
  p.hidden_size = j.value("hidden_size", 0);
  for (size_t i = 0; i < j.at("entries").size(); ++i) {
    const json& e = j.at("entries")[i];
    const std::string w = "entries[" + std::to_string(i) + "]";
    if (!e.is_object()) throw InputError(file, w, "an object");
    ProfileEntry pe;
    pe.micro_batch_size = static_cast<int>(get_num(e, "micro_batch_size", w, file));
    pe.tensor = e.contains("tensor") ? static_cast<int>(get_num(e, "tensor", w, file)) : 1;
    if (pe.micro_batch_size < 1 || pe.tensor < 1) {
      throw InputError(file, w, "micro_batch_size and tensor >= 1");
    }
    pe.layer_forward_s = get_num(e, "layer_forward_s", w, file);
    pe.layer_backward_s = get_num(e, "layer_backward_s", w, file);
    pe.embedding_forward_s = get_num(e, "embedding_forward_s", w, file);
    pe.embedding_backward_s = get_num(e, "embedding_backward_s", w, file);
    pe.head_forward_s = get_num(e, "head_forward_s", w, file);
    pe.head_backward_s = get_num(e, "head_backward_s", w, file);
    pe.optimizer_s_per_param = get_num(e, "optimizer_s_per_param", w, file);
    if (e.contains("attention_forward_s")) {
      pe.attention_forward_s = get_num(e, "attention_forward_s", w, file);
    }
    p.entries.push_back(pe);
  }
  return p;
}

json profile_to_json(const Profile& p) {
  json entries = json::array();
  for (const ProfileEntry& e : p.entries) {
    entries.push_back({{"micro_batch_size", e.micro_batch_size},
                       {"tensor", e.tensor},
                       {"layer_forward_s", e.layer_forward_s},
                       {"layer_backward_s", e.layer_backward_s},
                       {"embedding_forward_s", e.embedding_forward_s},
                       {"embedding_backward_s", e.embedding_backward_s},
                       {"head_forward_s", e.head_forward_s},
                       {"head_backward_s", e.head_backward_s},
                       {"optimizer_s_per_param", e.optimizer_s_per_param},
                       {"attention_forward_s", e.attention_forward_s}});
  }
  return {{"device", p.device},
          {"precision", p.precision},
          {"seq_len", p.seq_len},
          {"hidden_size", p.hidden_size},
          {"entries", entries}};
}

Profile load_profile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw InputError("<command line>", "--profile", "a readable profile JSON, got " + path);
  return profile_from_json(read_json_file(path), path);
}

void check_profile_matches(const Profile& p, const ModelDescription& m, const std::string& precision,
                           const std::string& file) {
  if (p.seq_len != 0 && p.seq_len != m.seq_len())
    throw InputError(file, "seq_len", "the model's sequence length " + std::to_string(m.seq_len()) +
                                          " (profile measured at " + std::to_string(p.seq_len) +
                                          "; run strata profile for this model)");
  if (p.hidden_size != 0 && p.hidden_size != m.hidden_size())
    throw InputError(file, "hidden_size",
                     "the model's hidden size " + std::to_string(m.hidden_size()) +
                         " (profile measured at " + std::to_string(p.hidden_size) +
                         "; run strata profile for this model)");
  if (!p.precision.empty() && p.precision != precision)
    throw InputError(file, "precision",
                     "the planned precision " + precision + " (profile measured in " +
                         p.precision + "; pass --precision " + p.precision + " or re-profile)");
}

namespace {

// Above this many (stage, micro-batch, chunk) forwards the steady state is extrapolated.
constexpr int64_t kMaxSimulatedOps = 4096;

double elem_bytes(const std::string& precision) { return precision == "fp32" ? 4.0 : 2.0; }

struct Gemm {
  double M, N, K;
};

double gemm_time(const Gemm& g, double peak, double hbm, double eb, const CostParams& cp) {
  const double eff = cp.gemm_max_eff /
                     (1 + cp.gemm_half_dim / g.M + cp.gemm_half_dim / g.N + cp.gemm_half_dim / g.K);
  const double compute = 2 * g.M * g.N * g.K / (peak * eff);
  const double memory = eb * (g.M * g.K + g.K * g.N + g.M * g.N) / (hbm * cp.mem_eff);
  return std::max(compute, memory);
}

// Ring all-reduce (or all-gather + reduce-scatter) of `bytes` over n ranks on one link.
double ring_allreduce(double bytes, int n, const Link& l, double net_eff) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / (l.bandwidth * net_eff) + 2.0 * (n - 1) * l.latency_s;
}

LayerTimes profile_times(const Profile& prof, const PlanConfig& c, int* measured_tensor) {
  const ProfileEntry* best = nullptr;
  for (const ProfileEntry& e : prof.entries) {
    auto score = [&](const ProfileEntry& x) {
      return (x.tensor == c.tensor ? 0 : 1000) + std::abs(x.micro_batch_size - c.micro_batch_size);
    };
    if (best == nullptr || score(e) < score(*best)) best = &e;
  }
  // Layer work is linear in the micro-batch at the sizes a profile covers; an entry of
  // another tensor width is rescaled by the ratio of widths (a rank of width t does 1/t of the
  // layer's work; its all-reduces are added by the caller from the analytical model).
  const double k = static_cast<double>(c.micro_batch_size) / best->micro_batch_size *
                   static_cast<double>(best->tensor) / c.tensor;
  *measured_tensor = best->tensor;
  LayerTimes t;
  t.layer_fwd = best->layer_forward_s * k;
  t.layer_bwd = best->layer_backward_s * k;
  if (c.recompute == Recompute::kFull) t.layer_bwd += t.layer_fwd;
  if (c.recompute == Recompute::kSelective) t.layer_bwd += best->attention_forward_s * k;
  t.layer_bwd_input = t.layer_bwd / 2;
  t.layer_bwd_weight = t.layer_bwd / 2;
  t.emb_fwd = best->embedding_forward_s * k;
  t.emb_bwd = best->embedding_backward_s * k;
  t.head_fwd = best->head_forward_s * k;
  t.head_bwd = best->head_backward_s * k;
  return t;
}

// Time of the forward (or backward) of a part's work on one rank: GEMMs on the efficiency
// curve, the attention core at the fused kernels' efficiency, elementwise passes at HBM speed.
struct PartTimes {
  double gemm_f = 0, dgrad = 0, wgrad = 0;  // GEMMs of the forward, input and weight gradients
  double attn_f = 0, attn_b = 0;
  double elem_f = 0, elem_b = 0;  // elementwise passes in the activation precision
  double f32_f = 0, f32_b = 0;    // and in f32
  double tp_f = 0, tp_b = 0;      // tensor-group collectives
};

PartTimes part_times(const PartWork& w, const Cluster& cl, const CostParams& cp,
                     const std::string& precision, int tensor) {
  const double eb = elem_bytes(precision);
  const double peak = cl.peak(precision), hbm = cl.hbm_bandwidth;
  const double mem_rate = hbm * cp.mem_eff;
  PartTimes t;
  for (const GemmShape& g : w.gemms) {
    t.gemm_f += gemm_time({g.m, g.n, g.k}, peak, hbm, eb, cp);
    t.dgrad += gemm_time({g.m, g.k, g.n}, peak, hbm, eb, cp);
    t.wgrad += gemm_time({g.n, g.k, g.m}, peak, hbm, eb, cp);
  }
  t.attn_f = w.attention_flops / (peak * cp.attn_fwd_eff);
  t.attn_b = 2 * w.attention_flops / (peak * cp.attn_bwd_eff);
  t.elem_f = w.elementwise_fwd * eb / mem_rate;
  t.elem_b = w.elementwise_bwd * eb / mem_rate;
  t.f32_f = w.f32_fwd * 4 / mem_rate;
  t.f32_b = w.f32_bwd * 4 / mem_rate;
  for (double n : w.tp_collectives_fwd) t.tp_f += ring_allreduce(n * eb, tensor, cl.intra_node, cp.net_eff);
  for (double n : w.tp_collectives_bwd) t.tp_b += ring_allreduce(n * eb, tensor, cl.intra_node, cp.net_eff);
  return t;
}

}  // namespace

LayerTimes layer_times(const CostContext& ctx, const PlanConfig& c) {
  const ModelDescription& m = *ctx.model;
  const Cluster& cl = *ctx.cluster;
  const CostParams& cp = ctx.params;
  const double eb = elem_bytes(ctx.precision);
  const int b = c.micro_batch_size;
  const RankShape rs{c.tensor, c.sequence_parallel};
  const double t = c.tensor;

  // Point-to-point between stages: the boundary activation of b·s·h elements, b·s·h/t per rank
  // when t > 1 (scatter, then all-gather over NVLink on the receiver); stages sit in different
  // nodes once t·d fills a node.
  const bool cross_node = c.tensor * c.data >= cl.gpus_per_node;
  const Link p2p_link = cross_node ? Link{cl.inter_node_bandwidth_per_gpu(), cl.inter_node.latency_s}
                                   : cl.intra_node;
  LayerTimes lt;
  const double act_bytes = m.boundary_elems(b, RankShape{c.tensor, false}) * eb;
  lt.p2p = p2p_link.latency_s +
           act_bytes / t / (p2p_link.bandwidth * (cross_node ? cp.ib_eff : cp.net_eff)) +
           (c.tensor > 1 ? (t - 1) / t * act_bytes / (cl.intra_node.bandwidth * cp.net_eff) : 0);

  const PartTimes layer = part_times(m.layer_work(b, rs), cl, cp, ctx.precision, c.tensor);
  const double exp_f = std::max(layer.tp_f * (1 - cp.tp_overlap), layer.tp_f - layer.gemm_f);
  const double exp_b =
      std::max(layer.tp_b * (1 - cp.tp_overlap), layer.tp_b - layer.dgrad - layer.wgrad);

  const double launch_f = cp.kernel_overhead_s * cp.kernels_per_layer_fwd;
  const double launch_b = cp.kernel_overhead_s * cp.kernels_per_layer_bwd;
  lt.layer_fwd = layer.gemm_f + layer.attn_f + layer.f32_f + layer.elem_f + exp_f + launch_f;
  lt.layer_bwd_weight = layer.wgrad;
  lt.layer_bwd_input = layer.dgrad + layer.attn_b + layer.f32_b + layer.elem_b + exp_b + launch_b;
  if (c.recompute == Recompute::kFull) lt.layer_bwd_input += lt.layer_fwd;
  if (c.recompute == Recompute::kSelective) lt.layer_bwd_input += layer.attn_f;
  lt.layer_bwd = lt.layer_bwd_input + lt.layer_bwd_weight;
  lt.tp_exposed_per_layer = exp_f + exp_b + (c.recompute == Recompute::kFull ? exp_f : 0);

  // Embedding: its lookup (and with t > 1 the sum of the vocab-parallel lookup), the
  // scatter-add into the table in the backward pass.
  const PartTimes emb = part_times(m.embedding_work(b, rs), cl, cp, ctx.precision, c.tensor);
  lt.emb_fwd = emb.gemm_f + emb.f32_f + emb.elem_f + emb.tp_f;
  lt.emb_bwd = emb.dgrad + emb.wgrad + emb.f32_b + emb.elem_b + emb.tp_b;
  // Head: final norm, the logits GEMM, the fp32 loss over the logits.
  const PartTimes head = part_times(m.head_work(b, rs), cl, cp, ctx.precision, c.tensor);
  lt.head_fwd = head.gemm_f + head.f32_f + head.elem_f + head.tp_f;
  lt.head_bwd = head.dgrad + head.wgrad + head.f32_b + head.elem_b + head.tp_b;
  if (ctx.profile == nullptr || ctx.profile->empty()) return lt;

  // A measured profile replaces the compute. An entry of the plan's width t already contains
  // its all-reduces; one of another width is rescaled (profile_times) and gets the modelled
  // exposed tensor-parallel communication added.
  int measured_t = 0;
  LayerTimes pt = profile_times(*ctx.profile, c, &measured_t);
  pt.p2p = lt.p2p;
  if (measured_t != c.tensor) {
    const double bwd_extra = exp_b + (c.recompute == Recompute::kFull ? exp_f : 0);
    pt.layer_fwd += exp_f;
    pt.layer_bwd_input += bwd_extra;
    pt.layer_bwd += bwd_extra;
    pt.tp_exposed_per_layer = lt.tp_exposed_per_layer;
    pt.emb_fwd += emb.tp_f;
  }
  return pt;
}

Link data_parallel_link(const Cluster& cl, int tensor, int data, const CostParams& cp) {
  if (tensor * data <= cl.gpus_per_node)
    return {cl.intra_node.bandwidth * cp.net_eff, cl.intra_node.latency_s};
  // The group's members in one node share the node's NICs (one ring leaves the node per NIC).
  const double members = std::max(1, std::min(data, cl.gpus_per_node / tensor));
  return {std::min(cl.intra_node.bandwidth * cp.net_eff,
                   cl.inter_node_bandwidth_per_gpu() * members * cp.ib_eff),
          cl.inter_node.latency_s};
}

std::vector<double> stage_parameters(const ModelDescription& m, const PlanConfig& c) {
  const int p = c.pipeline, v = c.virtual_stages;
  std::vector<double> n(static_cast<size_t>(p), 0.0);
  for (int st = 0; st < p; ++st) {
    for (int ch = 0; ch < v; ++ch) {
      const int k = ch * p + st;
      n[static_cast<size_t>(st)] += static_cast<double>(
          piece_parameters(m, c.tensor, k, p * v, c.layers_per_piece[static_cast<size_t>(k)]));
    }
  }
  return n;
}

IterationTime iteration_time(const CostContext& ctx, const PlanConfig& c, bool keep_timeline) {
  const ModelDescription& m = *ctx.model;
  const Cluster& cl = *ctx.cluster;
  const CostParams& cp = ctx.params;
  const LayerTimes lt = layer_times(ctx, c);
  const int p = c.pipeline, v = c.virtual_stages, pieces = p * v;
  // [piece] times of one micro-batch.
  std::vector<double> pf(static_cast<size_t>(pieces)), pb(pf.size()), pbi(pf.size()), pbw(pf.size());
  for (int k = 0; k < pieces; ++k) {
    const double n = c.layers_per_piece[static_cast<size_t>(k)];
    const size_t i = static_cast<size_t>(k);
    pf[i] = n * lt.layer_fwd + (k == 0 ? lt.emb_fwd : 0) + (k == pieces - 1 ? lt.head_fwd : 0);
    pbi[i] = n * lt.layer_bwd_input + (k == 0 ? lt.emb_bwd : 0) +
             (k == pieces - 1 ? lt.head_bwd : 0);
    pbw[i] = n * lt.layer_bwd_weight;
    // The transfers of this piece's forward (send, or receive) and backward stay on the
    // stage's critical path: Megatron waits for its batched send/receive.
    if (pieces > 1) {
      const double x = cp.p2p_exposed * lt.p2p;
      pf[i] += x;
      pbi[i] += x;
    }
    pb[i] = pbi[i] + pbw[i];
  }

  // Data-parallel reduction and the optimizer step, per stage.
  const std::vector<double> nparam = stage_parameters(m, c);
  const bool fp32 = ctx.precision == "fp32";
  // Gradients are reduced in the training precision (bf16: Megatron-Core's bf16 reduction).
  const double grad_bytes = fp32 ? 4 : 2, param_bytes = fp32 ? 4 : 2;
  const Link dp_link = data_parallel_link(cl, c.tensor, c.data, cp);
  IterationTime it;
  std::vector<double> reduce(static_cast<size_t>(p), 0.0), opt(static_cast<size_t>(p), 0.0);
  for (int st = 0; st < p; ++st) {
    const size_t si = static_cast<size_t>(st);
    double win_b = 0, win_f = 0;
    for (int ch = 0; ch < v; ++ch) {
      win_b += pb[static_cast<size_t>(ch * p + st)];
      win_f += pf[static_cast<size_t>(ch * p + st)];
    }
    const double n = nparam[si];
    if (c.data > 1) {
      const double d = c.data;
      const double rate = dp_link.bandwidth;
      if (c.distributed_optimizer) {
        const double rs = (d - 1) / d * grad_bytes * n / rate + (d - 1) * dp_link.latency_s;
        const double ag = (d - 1) / d * param_bytes * n / rate + (d - 1) * dp_link.latency_s;
        reduce[si] = std::max(0.0, rs - cp.dp_overlap * win_b) +
                     std::max(0.0, ag - cp.dp_overlap * win_f);
      } else {
        const double ar = 2 * (d - 1) / d * grad_bytes * n / rate + 2 * (d - 1) * dp_link.latency_s;
        reduce[si] = std::max(0.0, ar - cp.dp_overlap * win_b);
      }
    }
    const double shard = n / (c.distributed_optimizer ? c.data : 1);
    if (ctx.profile != nullptr && !ctx.profile->empty()) {
      opt[si] = shard * ctx.profile->entries.front().optimizer_s_per_param;
    } else {
      // Adam: read master, grad, m, v; write master, m, v (fp32); bf16 also writes its copy.
      opt[si] = shard * (fp32 ? 28.0 : 30.0) / (cl.hbm_bandwidth * cp.mem_eff);
    }
  }

  SimOptions so;
  so.latency = p > 1 ? lt.p2p : 0;
  // The step's sums over the pipeline (loss, gradient norm) and the tied embedding's as the
  // runtime makes them: blocking at the step of the flushing schedules, posted at ReduceGrads
  // and completed at the step by 2bw (launch/train/model_stage.h).
  so.collectives = true;
  so.duration = [&](int stage, const Instr& in) -> double {
    const size_t k = static_cast<size_t>(in.chunk * p + stage);
    switch (in.op) {
      case Op::kForward: return pf[k];
      case Op::kBackward: return pb[k];
      case Op::kBackwardInput: return pbi[k];
      case Op::kBackwardWeight: return pbw[k];
      case Op::kReduceGrads: return reduce[static_cast<size_t>(stage)];
      case Op::kOptimizerStep: return opt[static_cast<size_t>(stage)];
      default: return 0.0;
    }
  };
  ScheduleSpec spec;
  spec.kind = c.schedule;
  spec.stages = p;
  spec.microbatches = c.num_microbatches;
  spec.chunks = c.schedule == ScheduleKind::kInterleaved ? v : 1;
  double makespan = 0;
  if (c.schedule == ScheduleKind::kTwoBW) {
    // 2bw never flushes: the steady-state time of one batch from runs of 2 and 4 batches.
    spec.batches = 2;
    const SimResult two = simulate(spec, so);
    spec.batches = 4;
    it.sim = simulate(spec, so);
    makespan = (it.sim.makespan - two.makespan) / 2;
  } else if (static_cast<int64_t>(p) * spec.microbatches * spec.chunks > kMaxSimulatedOps &&
             c.schedule != ScheduleKind::kGPipe) {
    // Long runs: past the warm-up every further micro-batch adds one period of the slowest
    // stage (steady state), so simulate fewer micro-batches and extend; the in-flight counts
    // are reached during the warm-up and do not grow.
    const int m_full = spec.microbatches;
    const int m_sim = std::max(2 * p, static_cast<int>(kMaxSimulatedOps / (p * spec.chunks)) / p * p);
    spec.microbatches = std::min(m_full, m_sim);
    it.sim = simulate(spec, so);
    double period = 0;
    for (int st = 0; st < p; ++st) {
      double per = 0;
      for (int ch = 0; ch < v; ++ch) per += pb[static_cast<size_t>(ch * p + st)] + pf[static_cast<size_t>(ch * p + st)];
      period = std::max(period, per);
    }
    const double extra = (m_full - spec.microbatches) * period;
    makespan = it.sim.makespan + extra;
    double busy = 0;
    for (size_t st = 0; st < it.sim.busy.size(); ++st) {
      double per = 0;
      for (int ch = 0; ch < v; ++ch) per += pb[static_cast<size_t>(ch * p) + st] + pf[static_cast<size_t>(ch * p) + st];
      it.sim.busy[st] += (m_full - spec.microbatches) * per;
      busy += it.sim.busy[st];
    }
    it.sim.makespan = makespan;
    it.sim.bubble_fraction = 1 - busy / (p * makespan);
  } else {
    it.sim = simulate(spec, so);
    makespan = it.sim.makespan;
  }
  it.iteration_s = makespan;
  it.pipeline_s = makespan;
  it.bubble_fraction = it.sim.bubble_fraction;
  it.dp_exposed_s = *std::max_element(reduce.begin(), reduce.end());
  it.optimizer_s = *std::max_element(opt.begin(), opt.end());
  int most_layers = 0;
  for (int st = 0; st < p; ++st) {
    int n = 0;
    for (int ch = 0; ch < v; ++ch) n += c.layers_per_piece[static_cast<size_t>(ch * p + st)];
    most_layers = std::max(most_layers, n);
  }
  it.tp_exposed_s = lt.tp_exposed_per_layer * most_layers * c.num_microbatches;
  it.stage_compute_s = it.sim.busy;
  it.peak_inflight = it.sim.peak_inflight;
  if (!keep_timeline) it.sim.timeline.clear();
  return it;
}

}  // namespace strata
