#include "partitioner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "runtime/base/error.h"
#include "runtime/io/json_file.h"

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

void check_profile_matches(const Profile& p, const ModelDescription& m,
                           const std::string& precision, const std::string& file) {
  if (p.seq_len != 0 && p.seq_len != m.seq_len())
    throw InputError(file, "seq_len",
                     "the model's sequence length " + std::to_string(m.seq_len()) +
                         " (profile measured at " + std::to_string(p.seq_len) +
                         "; run strata profile for this model)");
  if (p.hidden_size != 0 && p.hidden_size != m.hidden_size())
    throw InputError(file, "hidden_size",
                     "the model's hidden size " + std::to_string(m.hidden_size()) +
                         " (profile measured at " + std::to_string(p.hidden_size) +
                         "; run strata profile for this model)");
  if (!p.precision.empty() && p.precision != precision)
    throw InputError(file, "precision",
                     "the planned precision " + precision + " (profile measured in " + p.precision +
                         "; pass --precision " + p.precision + " or re-profile)");
}

namespace {

// Above this many (stage, micro-batch, chunk) forwards the steady state is extrapolated.
constexpr int64_t kMaxSimulatedOps = 4096;

double elem_bytes(const std::string& precision) {
  return precision == "fp32" ? 4.0 : 2.0;
}

// Ring all-reduce (or all-gather + reduce-scatter) of `bytes` over n ranks on one link.
double ring_allreduce(double bytes, int n, const Link& l) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / (l.bandwidth * l.efficiency) + 2.0 * (n - 1) * l.latency_s;
}

// The tensor-group collectives a part reports (models/layers/work.h), in elements of `eb` bytes,
// priced as ring all-reduces: an all-gather and a reduce-scatter (sequence parallelism's pairs
// around a tensor-parallel region) together cost one all-reduce of their mean size — on a ring
// exactly their bytes and steps — and a lone one half an all-reduce's bytes with an all-reduce's
// latency (the convention the calibration tables were fitted with, docs/planner.md).
double tensor_collectives_s(const std::vector<Collective>& cs, double eb, int tensor,
                            const Link& link) {
  double s = 0;
  double half = -1;  // elements of an all-gather or reduce-scatter waiting for its pair
  for (const Collective& c : cs) {
    if (c.group != CommGroup::kTensor) continue;
    if (c.kind == CollectiveKind::kAllReduce) {
      s += ring_allreduce(c.elements * eb, tensor, link);
    } else if (half < 0) {
      half = c.elements;
    } else {
      s += ring_allreduce((half + c.elements) / 2 * eb, tensor, link);
      half = -1;
    }
  }
  if (half >= 0) s += ring_allreduce(half / 2 * eb, tensor, link);
  return s;
}

// The expert-group all-to-alls a part reports, each rank sending `elements` of `eb` bytes.
double expert_collectives_s(const std::vector<Collective>& cs, double eb, int expert,
                            const Link& link) {
  double s = 0;
  for (const Collective& c : cs)
    if (c.group == CommGroup::kExpert) s += all_to_all_s(c.elements * eb, expert, link);
  return s;
}

LayerTimes profile_times(const Profile& prof, const ParallelLayout& c, int* measured_tensor) {
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

// What prices a part's work on this device in this precision (resolved once per call).
struct Pricing {
  const DeviceEfficiency* eff = nullptr;
  const GemmCurve* gemm = nullptr;
  const AttentionTable* attention = nullptr;  // null: no table in this precision
  double eb = 2;
  GemmMemo* memo = nullptr;
};

Pricing pricing_for(const CostContext& ctx) {
  Pricing d;
  d.eff = &ctx.cluster->efficiency;
  d.gemm = d.eff->gemm_for(ctx.precision);
  if (d.gemm == nullptr) {
    throw InputError(ctx.cluster->name, "efficiency.gemm." + ctx.precision,
                     "a GEMM curve for precision " + ctx.precision + " in the cluster");
  }
  d.attention = d.eff->attention_for(ctx.precision);
  d.eb = elem_bytes(ctx.precision);
  d.memo = ctx.memo;
  return d;
}

double gemm_s(const Pricing& d, double M, double N, double K, double batch = 1) {
  if (d.memo == nullptr) return d.gemm->seconds(M, N, K, d.eb, batch, d.eff->sustained);
  const auto [it, added] = d.memo->seconds.try_emplace({M, N, K, batch}, 0.0);
  if (added) it->second = d.gemm->seconds(M, N, K, d.eb, batch, d.eff->sustained);
  return it->second;
}

// Time of the forward (or backward) of a part's work on one rank.
struct PartTimes {
  double gemm_f = 0, dgrad = 0, wgrad = 0;  // GEMMs of the forward, input and weight gradients
  double attn_f = 0, attn_b = 0;            // the attention core (recomputed by selective)
  double elem_f = 0, elem_b = 0;            // memory-bound passes
  double tp_f = 0, tp_b = 0;                // tensor-group collectives
  double ep_f = 0, ep_b = 0;                // expert-group all-to-alls
};

// The attention core of one micro-batch: a fused kernel, or the unfused batched GEMMs and
// score passes (runtime_model.h), over `blocks` blocks of the shape's seq × seq (the ring
// attention's c steps; the fused kernels' FLOPs already count them all).
void attention_times(const PartWork& w, const Pricing& d, const RuntimeModel& rt, int blocks,
                     PartTimes* t) {
  const AttentionShape& a = w.attention;
  if (a.heads <= 0) return;
  const double sustained = d.eff->sustained;
  if (rt.fused_attention) {
    if (d.attention != nullptr) {
      t->attn_f = w.attention_flops / (d.attention->flops(a.seq, a.head_size, false) * sustained);
      t->attn_b =
          2 * w.attention_flops / (d.attention->flops(a.seq, a.head_size, true) * sustained);
    } else {
      // No table in this precision: the device's GEMM rate at the core's shape, halved.
      const double rate = 2 * a.seq * a.seq * a.head_size /
                          d.gemm->curve_seconds(a.seq, a.seq, a.head_size, d.eb, 1, sustained);
      t->attn_f = w.attention_flops / (0.5 * rate);
      t->attn_b = 2 * w.attention_flops / (0.5 * rate);
    }
    return;
  }
  // Q·Kᵀ (s, s, d) and P·V (s, d, s) per head, one batched kernel each; the backward's dP = dO·Vᵀ
  // (s, s, d), dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q (each (s, d, s)).
  const double batch = a.batch * a.heads, s = a.seq, hd = a.head_size;
  const double scores = batch * s * s;
  t->attn_f = blocks * (gemm_s(d, s, s, hd, batch) + gemm_s(d, s, hd, s, batch) +
                        scores * rt.score_bytes_fwd / d.eff->memory_bandwidth);
  t->attn_b = blocks * (gemm_s(d, s, s, hd, batch) + 3 * gemm_s(d, s, hd, s, batch) +
                        scores * rt.score_bytes_bwd / d.eff->memory_bandwidth);
}

PartTimes part_times(const PartWork& w, const Pricing& d, const Cluster& cl, const RuntimeModel& rt,
                     const ParallelLayout& c) {
  const int tensor = c.tensor;
  const double mem = d.eff->memory_bandwidth;
  PartTimes t;
  for (const GemmShape& g : w.gemms) {
    t.gemm_f += gemm_s(d, g.m, g.n, g.k);
    t.dgrad += gemm_s(d, g.m, g.k, g.n);
    t.wgrad += gemm_s(d, g.n, g.k, g.m);
  }
  attention_times(w, d, rt, c.context, &t);
  t.elem_f = w.elementwise_fwd * d.eb / mem;
  t.elem_b = w.elementwise_bwd * d.eb / mem;
  // The loss over the logits: the runtime's own bytes per logit, else the model's f32 passes.
  t.elem_f +=
      (rt.loss_bytes_fwd > 0 && w.logits > 0 ? w.logits * rt.loss_bytes_fwd : w.f32_fwd * 4) / mem;
  t.elem_b +=
      (rt.loss_bytes_bwd > 0 && w.logits > 0 ? w.logits * rt.loss_bytes_bwd : w.f32_bwd * 4) / mem;
  t.tp_f = tensor_collectives_s(w.collectives_fwd, d.eb, tensor, cl.intra_node);
  t.tp_b = tensor_collectives_s(w.collectives_bwd, d.eb, tensor, cl.intra_node);
  if (c.expert > 1) {
    const Link ep = expert_link(cl, c.tensor, c.context, c.expert);
    t.ep_f = expert_collectives_s(w.collectives_fwd, d.eb, c.expert, ep);
    t.ep_b = expert_collectives_s(w.collectives_bwd, d.eb, c.expert, ep);
  }
  return t;
}

// Exposed part of `comm` tensor-parallel seconds beside `gemm` seconds of GEMMs.
double tp_exposed(const RuntimeModel& rt, double comm, double gemm, int tensor) {
  if (!rt.tp_overlap) return comm;
  return std::max(comm / tensor, comm - gemm);
}

}  // namespace

LayerTimes layer_times(const CostContext& ctx, const ParallelLayout& c, int kind) {
  const ModelDescription& m = *ctx.model;
  const Cluster& cl = *ctx.cluster;
  const RuntimeModel& rt = ctx.runtime;
  const Pricing dev = pricing_for(ctx);
  const double eb = dev.eb;
  const int b = c.micro_batch_size;
  const RankShape rs{c.tensor, c.sequence_parallel, c.expert};
  const double t = c.tensor;
  const int cp = c.context;

  // Point-to-point between stages: what each rank holds of the boundary activation (its
  // sequence chunk with sequence parallelism, its S/c tokens with context parallelism), or with
  // the scatter/gather optimisation 1/t of it and an all-gather over NVLink on the receiver;
  // stages sit in different nodes once t·c·d fills a node.
  const bool cross_node = c.tensor * cp * c.data >= cl.gpus_per_node;
  const Link p2p_link = cross_node ? Link{cl.inter_node_bandwidth_per_gpu(),
                                          cl.inter_node.latency_s, cl.inter_node.efficiency}
                                   : cl.intra_node;
  LayerTimes lt;
  const double held = m.boundary_elems(b, rs) / cp * eb;
  const bool scatter = rt.p2p_scatter_gather && c.tensor > 1 && !c.sequence_parallel;
  const double sent = scatter ? held / t : held;
  lt.p2p =
      p2p_link.latency_s + sent / (p2p_link.bandwidth * p2p_link.efficiency) +
      (scatter ? (t - 1) / t * held / (cl.intra_node.bandwidth * cl.intra_node.efficiency) : 0);

  const PartWork layer_work = context_share(m.layer_work(b, rs, kind), cp);
  const PartTimes layer = part_times(layer_work, dev, cl, rt, c);
  // The ring attention (c > 1): each step after the first merges its partial output into the
  // running one by their log-sum-exps (reading both, writing one, in f32), and in the backward
  // adds its query gradient into the running one and its key/value gradient into the one that
  // travels (the same, f32): memory-bound passes beside the blocks. The transfers beside the
  // blocks (ring_attention_times) add what they do not hide.
  RingTimes ring;
  double merge_f = 0, merge_b = 0;
  if (cp > 1 && layer_work.attention.heads > 0) {
    const AttentionShape& a = layer_work.attention;
    const double block = a.batch * a.seq * 2 * a.kv_heads * a.head_size;  // seq is S/c here
    const double out = a.batch * a.seq * a.heads * a.head_size;
    merge_f = (cp - 1) * 3 * out * 4 / dev.eff->memory_bandwidth;
    merge_b = (cp - 1) * 3 * (out + block) * 4 / dev.eff->memory_bandwidth;
    ring = ring_attention_times(layer.attn_f + merge_f, layer.attn_b + merge_b, block * eb,
                                block * rt.ring_grad_wire_bytes, cp, context_link(cl, c.tensor, cp),
                                rt.ring_overlap);
  }
  const double exp_f = tp_exposed(rt, layer.tp_f, layer.gemm_f, c.tensor);
  const double exp_b = rt.tp_overlap_backward && !rt.tp_overlap
                           ? std::max(0.0, layer.tp_b - layer.dgrad - layer.wgrad)
                           : tp_exposed(rt, layer.tp_b, layer.dgrad + layer.wgrad, c.tensor);
  const double gap = dev.eff->kernel_gap_s;
  const double launch_f =
      gap * (rt.kernels_per_layer_fwd + (cp - 1) * rt.ring_kernels_per_step_fwd);
  const double launch_b =
      gap * (rt.kernels_per_layer_bwd + (cp - 1) * rt.ring_kernels_per_step_bwd);
  lt.layer_fwd = layer.gemm_f + layer.attn_f + layer.elem_f + exp_f + launch_f;
  lt.layer_bwd_weight = layer.wgrad;
  lt.layer_bwd_input = layer.dgrad + layer.attn_b + layer.elem_b + exp_b + launch_b;
  lt.tp_fwd = exp_f;
  lt.tp_bwd = exp_b;
  if (cp > 1) {
    lt.layer_fwd += merge_f + ring.fwd;
    lt.layer_bwd_input += merge_b + ring.bwd;
    lt.cp_fwd = ring.fwd;
    lt.cp_bwd = ring.bwd;
  }
  // The all-to-alls block (the experts wait for their rows, the combine for the outputs).
  if (c.expert > 1) {
    lt.layer_fwd += layer.ep_f;
    lt.layer_bwd_input += layer.ep_b;
    lt.ep_fwd = layer.ep_f;
    lt.ep_bwd = layer.ep_b;
  }
  // Recompute repeats the forward (full) or the attention core (selective), the ring's forward
  // transfers with it.
  if (c.recompute == Recompute::kFull) {
    lt.layer_bwd_input += lt.layer_fwd;
    lt.tp_bwd += exp_f;
    lt.ep_bwd += lt.ep_fwd;
    lt.cp_bwd += lt.cp_fwd;
  }
  if (c.recompute == Recompute::kSelective) {
    lt.layer_bwd_input += layer.attn_f + merge_f + ring.fwd;
    lt.cp_bwd += ring.fwd;
  }
  lt.layer_bwd = lt.layer_bwd_input + lt.layer_bwd_weight;
  lt.tp_exposed_per_layer = exp_f + exp_b + (c.recompute == Recompute::kFull ? exp_f : 0);
  lt.ep_exposed_per_layer = lt.ep_fwd + lt.ep_bwd;
  lt.cp_exposed_per_layer = lt.cp_fwd + lt.cp_bwd;

  // Embedding: its lookup (and with t > 1 the sum of the vocab-parallel lookup), the
  // scatter-add into the table in the backward pass.
  const PartTimes emb = part_times(context_share(m.embedding_work(b, rs), cp), dev, cl, rt, c);
  lt.emb_fwd = emb.gemm_f + emb.elem_f + emb.tp_f;
  lt.emb_bwd = emb.dgrad + emb.wgrad + emb.elem_b + emb.tp_b;
  // Head: final norm, the logits GEMM, the loss over the logits.
  const PartTimes head = part_times(context_share(m.head_work(b, rs), cp), dev, cl, rt, c);
  lt.head_fwd = head.gemm_f + head.elem_f + head.tp_f;
  lt.head_bwd = head.dgrad + head.wgrad + head.elem_b + head.tp_b;
  if (ctx.profile == nullptr || ctx.profile->empty()) return lt;

  // A measured profile replaces the compute. An entry of the plan's width t already contains
  // its all-reduces; one of another width is rescaled (profile_times) and gets the modelled
  // exposed tensor-parallel communication added. A profile is measured on one unsharded rank:
  // the all-to-alls of expert parallelism are added as modelled.
  int measured_t = 0;
  LayerTimes pt = profile_times(*ctx.profile, c, &measured_t);
  pt.p2p = lt.p2p;
  // strata profile times the model's first layer: another kind of layer (Qwen3-MoE's dense
  // layers beside its mixtures) takes the measured times scaled by the ratio of the two kinds'
  // analytical compute (their communication excluded: it is added below as modelled).
  const int measured_kind = m.layer_kind(0);
  if (kind != measured_kind) {
    CostContext analytic = ctx;
    analytic.profile = nullptr;
    const LayerTimes a = layer_times(analytic, c, measured_kind);
    const auto ratio = [](double want, double have) { return have > 0 ? want / have : 1.0; };
    const double f = ratio(lt.layer_fwd - lt.tp_fwd - lt.ep_fwd, a.layer_fwd - a.tp_fwd - a.ep_fwd);
    const double bw =
        ratio(lt.layer_bwd - lt.tp_bwd - lt.ep_bwd, a.layer_bwd - a.tp_bwd - a.ep_bwd);
    pt.layer_fwd *= f;
    pt.layer_bwd *= bw;
    pt.layer_bwd_input *= bw;
    pt.layer_bwd_weight *= bw;
  }
  if (cp > 1) {
    // A profile times whole sequences on one rank: a context rank works on S/c tokens of each
    // (1/c of every part, its attention core included), and the ring's merges and transfers
    // are added as modelled.
    for (double* x : {&pt.layer_fwd, &pt.layer_bwd, &pt.layer_bwd_input, &pt.layer_bwd_weight,
                      &pt.emb_fwd, &pt.emb_bwd, &pt.head_fwd, &pt.head_bwd})
      *x /= cp;
    const double rerun = c.recompute == Recompute::kNone ? 0 : merge_f;
    pt.layer_fwd += merge_f + lt.cp_fwd;
    pt.layer_bwd_input += merge_b + rerun + lt.cp_bwd;
    pt.layer_bwd += merge_b + rerun + lt.cp_bwd;
    pt.cp_fwd = lt.cp_fwd;
    pt.cp_bwd = lt.cp_bwd;
    pt.cp_exposed_per_layer = lt.cp_exposed_per_layer;
  }
  if (c.expert > 1) {
    pt.layer_fwd += lt.ep_fwd;
    pt.layer_bwd_input += lt.ep_bwd;
    pt.layer_bwd += lt.ep_bwd;
    pt.ep_fwd = lt.ep_fwd;
    pt.ep_bwd = lt.ep_bwd;
    pt.ep_exposed_per_layer = lt.ep_exposed_per_layer;
  }
  if (measured_t != c.tensor) {
    const double bwd_extra = exp_b + (c.recompute == Recompute::kFull ? exp_f : 0);
    pt.layer_fwd += exp_f;
    pt.layer_bwd_input += bwd_extra;
    pt.layer_bwd += bwd_extra;
    pt.tp_exposed_per_layer = lt.tp_exposed_per_layer;
    pt.tp_fwd = exp_f;
    pt.tp_bwd = bwd_extra;
    pt.emb_fwd += emb.tp_f;
  }
  return pt;
}

Link data_parallel_link(const Cluster& cl, int tensor, int data) {
  if (tensor * data <= cl.gpus_per_node)
    return {cl.intra_node.bandwidth * cl.intra_node.efficiency, cl.intra_node.latency_s, 1.0};
  // The group's members in one node share the node's NICs (one ring leaves the node per NIC).
  const double members = std::max(1, std::min(data, cl.gpus_per_node / tensor));
  return {std::min(cl.intra_node.bandwidth * cl.intra_node.efficiency,
                   cl.inter_node_bandwidth_per_gpu() * members * cl.inter_node.efficiency),
          cl.inter_node.latency_s, 1.0};
}

Link context_link(const Cluster& cl, int tensor, int context) {
  if (cl.gpus_per_node % (tensor * context) == 0) return cl.intra_node;
  return {cl.inter_node_bandwidth_per_gpu(), cl.inter_node.latency_s, cl.inter_node.efficiency};
}

RingTimes ring_attention_times(double attn_fwd, double attn_bwd, double kv_bytes, double dkv_bytes,
                               int context, const Link& l, bool overlap) {
  RingTimes r;
  if (context <= 1) return r;
  const double rate = l.bandwidth * l.efficiency;
  // What a step's transfer adds to its block: max(block, transfer) − block, or all of it.
  const auto exposed = [overlap](double block, double transfer) {
    return overlap ? std::max(0.0, transfer - block) : transfer;
  };
  const double n = context;
  const double fwd_block = attn_fwd / n, bwd_block = attn_bwd / n;
  // Forward: the last step has nothing left to send.
  const double kv = kv_bytes / rate + l.latency_s;
  r.fwd = (n - 1) * exposed(fwd_block, kv);
  // Backward: every step sends its accumulated key/value gradient on, the last one home; all
  // but the last send the key/value block with it.
  const double dkv = dkv_bytes / rate + l.latency_s;
  r.bwd = (n - 1) * exposed(bwd_block, kv + dkv) + exposed(bwd_block, dkv);
  return r;
}

Link expert_link(const Cluster& cl, int tensor, int context, int expert) {
  if (cl.gpus_per_node % (tensor * context * expert) == 0) return cl.intra_node;
  return {cl.inter_node_bandwidth_per_gpu(), cl.inter_node.latency_s, cl.inter_node.efficiency};
}

double all_to_all_s(double bytes, int n, const Link& l) {
  if (n <= 1) return 0;
  return (n - 1.0) / n * bytes / (l.bandwidth * l.efficiency) + (n - 1) * l.latency_s;
}

DataParallelTimes data_parallel_times(const RuntimeModel& rt, double params, int data,
                                      bool distributed_optimizer, const Link& l) {
  DataParallelTimes t;
  if (data <= 1) return t;
  const double d = data;
  const double rate = l.bandwidth * l.efficiency;
  if (distributed_optimizer) {
    t.reduce = (d - 1) / d * rt.grad_wire_bytes * params / rate + (d - 1) * l.latency_s;
    t.gather = (d - 1) / d * rt.param_wire_bytes * params / rate + (d - 1) * l.latency_s;
  } else {
    t.reduce = 2 * (d - 1) / d * rt.grad_wire_bytes * params / rate + 2 * (d - 1) * l.latency_s;
  }
  return t;
}

std::vector<RankParameters> stage_parameters(const ModelDescription& m, const ParallelLayout& c) {
  const int p = c.pipeline, v = c.virtual_stages;
  const std::vector<int> first = first_layers(c.layers_per_piece);
  std::vector<RankParameters> n(static_cast<size_t>(p));
  for (int st = 0; st < p; ++st) {
    for (int ch = 0; ch < v; ++ch) {
      const size_t k = static_cast<size_t>(ch * p + st);
      const RankParameters piece = rank_parameters(m, c.tensor, c.expert, static_cast<int>(k),
                                                   p * v, first[k], c.layers_per_piece[k]);
      n[static_cast<size_t>(st)].dense += piece.dense;
      n[static_cast<size_t>(st)].expert += piece.expert;
    }
  }
  return n;
}

DataParallelTimes stage_reduction_times(const Cluster& cl, const RuntimeModel& rt,
                                        const ParallelLayout& c, const RankParameters& n) {
  // The weight gradients are summed over data × context: d·c ranks t apart.
  const int ranks = gradient_reduction_ranks(c);
  const Link dp_link = data_parallel_link(cl, c.tensor, ranks);
  // Without expert parallelism the experts' gradients are summed with the rest.
  if (c.expert == 1)
    return data_parallel_times(rt, static_cast<double>(n.total()), ranks, c.distributed_optimizer,
                               dp_link);
  const DataParallelTimes dense = data_parallel_times(rt, static_cast<double>(n.dense), ranks,
                                                      c.distributed_optimizer, dp_link);
  // The experts' over the expert-data group: the c·d/e ranks of every context rank holding the
  // same experts, spanning the t·c·d ranks of the data × context group as it does.
  const int expert_ranks = c.context * c.data / c.expert;
  const DataParallelTimes experts =
      data_parallel_times(rt, static_cast<double>(n.expert), expert_ranks, c.distributed_optimizer,
                          data_parallel_link(cl, c.tensor * c.expert, expert_ranks));
  return {dense.reduce + experts.reduce, dense.gather + experts.gather};
}

double optimizer_shard(const ParallelLayout& c, const RankParameters& n) {
  // The distributed optimizer shards the experts' state over c·d/e ranks: e times a rank's E/e
  // experts over d·c, as much per rank as without expert parallelism.
  if (!c.distributed_optimizer) return static_cast<double>(n.total());
  return static_cast<double>(n.dense + n.expert * c.expert) / gradient_reduction_ranks(c);
}

namespace {

// When the data-parallel reduction of `stage` is done, from the simulated schedule: its
// buckets (gradients walked from the last parameter back, the order the backward finishes
// them) become ready as the last micro-batch's backward of the piece holding them (its weight
// pass with zero-bubble schedules) goes through the piece's parameters; each reduces after the
// one before on the stage's link. `start_s`: where ReduceGrads begins (the reduction waits for
// nothing before it when the runtime starts no bucket early). Returns the finish time.
double reduction_finish(const SimResult& sim, const RuntimeModel& rt, const ParallelLayout& c,
                        const ModelDescription& m, int stage, double reduce_s, double start_s) {
  const int p = c.pipeline, v = c.virtual_stages;
  if (!rt.dp_overlap || !rt.collectives_progress_alone) return start_s + reduce_s;
  // [chunk] (start, end) of the pass that makes the chunk's gradients final.
  const int last_mb = c.num_microbatches - 1;
  const bool split = c.schedule == ScheduleKind::kZeroBubbleH1;
  std::vector<std::pair<double, double>> pass(static_cast<size_t>(v), {start_s, start_s});
  for (const TimelineEvent& e : sim.timeline) {
    if (e.stage != stage || e.mb % c.num_microbatches != last_mb) continue;
    const bool final_pass = split ? e.op == Op::kBackwardWeight : e.op == Op::kBackward;
    if (final_pass && e.start < start_s + 1e-12)
      pass[static_cast<size_t>(e.chunk)] = {e.start, e.end};
  }
  // Parameters of each chunk, in the order its backward finishes them: chunk v−1 first.
  std::vector<double> params(static_cast<size_t>(v));
  const std::vector<int> first = first_layers(c.layers_per_piece);
  double total = 0;
  for (int ch = 0; ch < v; ++ch) {
    const size_t k = static_cast<size_t>(ch * p + stage);
    params[static_cast<size_t>(ch)] =
        static_cast<double>(rank_parameters(m, c.tensor, c.expert, static_cast<int>(k), p * v,
                                            first[k], c.layers_per_piece[k])
                                .total());
    total += params[static_cast<size_t>(ch)];
  }
  if (total <= 0) return start_s + reduce_s;
  const double bucket = std::max(1.0, rt.bucket_bytes / 4);  // elements (buckets of f32)
  const double per_elem = reduce_s / total;
  double link_free = 0, filled = 0;
  for (int ch = v - 1; ch >= 0; --ch) {
    const double n = params[static_cast<size_t>(ch)];
    const auto [a, e] = pass[static_cast<size_t>(ch)];
    // Buckets closing inside this chunk: the k-th closes when the pass has finished the
    // elements up to it (uniformly over the pass).
    double done = 0;
    while (done < n) {
      const double take = std::min(n - done, bucket - filled);
      done += take;
      filled += take;
      if (filled >= bucket - 1e-9 || (ch == 0 && done >= n)) {
        const double ready = a + (e - a) * done / n;
        link_free = std::max(link_free, ready) + filled * per_elem;
        filled = 0;
      }
    }
  }
  return std::max(link_free, start_s);
}

// Adds reduce[stage] seconds to each stage's ReduceGrads of a simulated flushing schedule (whose
// lists end with ReduceGrads and OptimizerStep, the step a collective over every stage: it
// starts when the last stage's ReduceGrads ends) and moves the steps after them.
void add_reduction_tails(SimResult* r, const std::vector<double>& reduce) {
  double ready = 0;
  for (TimelineEvent& e : r->timeline) {
    if (e.op != Op::kReduceGrads) continue;
    const double extra = reduce[static_cast<size_t>(e.stage)];
    e.end += extra;
    r->busy[static_cast<size_t>(e.stage)] += extra;
    ready = std::max(ready, e.end);
  }
  for (TimelineEvent& e : r->timeline) {
    if (e.op != Op::kOptimizerStep || e.start >= ready) continue;
    const double d = e.end - e.start;
    e.start = ready;
    e.end = ready + d;
  }
  double busy = 0;
  for (const TimelineEvent& e : r->timeline) r->makespan = std::max(r->makespan, e.end);
  for (double b : r->busy) busy += b;
  const double p = static_cast<double>(r->busy.size());
  r->bubble_fraction = 1 - busy / (p * r->makespan);
  r->bubble_ratio = busy > 0 ? (p * r->makespan - busy) / busy : 0;
}

// Seconds of one micro-batch's passes over each piece (k = chunk · p + stage), on the stage
// holding it: the layers' times, plus the embedding on the first piece and the head on the last.
struct PieceTimes {
  std::vector<double> forward;          // [piece]
  std::vector<double> backward;         // [piece] backward_input + backward_weight
  std::vector<double> backward_input;   // [piece] the zero-bubble B pass (or all but W)
  std::vector<double> backward_weight;  // [piece] the zero-bubble W pass
};

// Each piece's times from its layers of each kind (kinds: [kind] one layer's, with the
// embedding, head and transfer times); and it->comm_share_fwd/bwd, the share of each pass that
// is communication.
PieceTimes piece_times(const std::vector<LayerTimes>& kinds, const ModelDescription& m,
                       const ParallelLayout& c, const RuntimeModel& rt, IterationTime* it) {
  const int pieces = c.pipeline * c.virtual_stages;
  const LayerTimes& lt = kinds.front();
  const std::vector<int> first = first_layers(c.layers_per_piece);
  PieceTimes t;
  t.forward.resize(static_cast<size_t>(pieces));
  t.backward.resize(t.forward.size());
  t.backward_input.resize(t.forward.size());
  t.backward_weight.resize(t.forward.size());
  it->comm_share_fwd.assign(t.forward.size(), 0.0);
  it->comm_share_bwd.assign(t.forward.size(), 0.0);
  for (int k = 0; k < pieces; ++k) {
    const size_t i = static_cast<size_t>(k);
    const std::vector<int> held = layer_kind_counts(m, first[i], c.layers_per_piece[i]);
    double layers_f = 0, layers_bi = 0, layers_bw = 0, comm_f = 0, comm_b = 0;
    for (size_t kind = 0; kind < kinds.size(); ++kind) {
      const double n = held[kind];
      const LayerTimes& x = kinds[kind];
      layers_f += n * x.layer_fwd;
      layers_bi += n * x.layer_bwd_input;
      layers_bw += n * x.layer_bwd_weight;
      comm_f += n * (x.tp_fwd + x.ep_fwd + x.cp_fwd);
      comm_b += n * (x.tp_bwd + x.ep_bwd + x.cp_bwd);
    }
    t.forward[i] = layers_f + (k == 0 ? lt.emb_fwd : 0) + (k == pieces - 1 ? lt.head_fwd : 0);
    t.backward_input[i] =
        layers_bi + (k == 0 ? lt.emb_bwd : 0) + (k == pieces - 1 ? lt.head_bwd : 0);
    t.backward_weight[i] = layers_bw;
    // A runtime whose stages wait for their sends with their receives pays each transfer on
    // both ends' forward and backward; otherwise the receiver waits for it (the simulator's
    // latency, moving once the receive is posted).
    if (pieces > 1 && rt.p2p_both_ends) {
      t.forward[i] += lt.p2p;
      t.backward_input[i] += lt.p2p;
      comm_f += lt.p2p;
      comm_b += lt.p2p;
    }
    t.backward[i] = t.backward_input[i] + t.backward_weight[i];
    it->comm_share_fwd[i] = t.forward[i] > 0 ? comm_f / t.forward[i] : 0;
    it->comm_share_bwd[i] = t.backward_input[i] > 0 ? comm_b / t.backward_input[i] : 0;
  }
  return t;
}

// Seconds of one micro-batch's forward through every piece of `stage` (its chunks in order).
double stage_forward_s(const PieceTimes& t, int p, int v, int stage) {
  double first_fwd = 0;
  for (int ch = 0; ch < v; ++ch) first_fwd += t.forward[static_cast<size_t>(ch * p + stage)];
  return first_fwd;
}

// The distributed optimizer's parameter all-gather, as much as is exposed: after the step, or
// behind the next iteration's first forward (`first_fwd` seconds).
double exposed_gather(const RuntimeModel& rt, const DataParallelTimes& dp, double first_fwd) {
  return rt.param_gather_overlap ? std::max(0.0, dp.gather - first_fwd) : dp.gather;
}

// Per stage, the costs that come once per iteration: the data-parallel reduction and the
// optimizer step (with the exposed parameter all-gather). reduce and step_extra start at 0:
// expose_reductions sets what of the reduction the simulated schedule does not hide.
struct StageTimes {
  std::vector<DataParallelTimes> dp;  // [stage]
  std::vector<double> reduce;         // [stage] exposed at ReduceGrads (flushing schedules)
  std::vector<double> optimizer;      // [stage]
  std::vector<double> step_extra;     // [stage] exposed at the step (2bw)
};

StageTimes stage_times(const CostContext& ctx, const ParallelLayout& c, const PieceTimes& pieces) {
  const RuntimeModel& rt = ctx.runtime;
  const int p = c.pipeline, v = c.virtual_stages;
  const std::vector<RankParameters> nparam = stage_parameters(*ctx.model, c);
  StageTimes s;
  s.dp.resize(static_cast<size_t>(p));
  s.reduce.assign(static_cast<size_t>(p), 0.0);
  s.optimizer.assign(static_cast<size_t>(p), 0.0);
  s.step_extra.assign(static_cast<size_t>(p), 0.0);
  for (int st = 0; st < p; ++st) {
    const size_t si = static_cast<size_t>(st);
    s.dp[si] = stage_reduction_times(*ctx.cluster, rt, c, nparam[si]);
    const double shard = optimizer_shard(c, nparam[si]);
    if (ctx.profile != nullptr && !ctx.profile->empty()) {
      s.optimizer[si] = shard * ctx.profile->entries.front().optimizer_s_per_param;
    } else {
      s.optimizer[si] = shard * rt.step_bytes_per_param / ctx.cluster->efficiency.optimizer_rate();
    }
    s.optimizer[si] += exposed_gather(rt, s.dp[si], stage_forward_s(pieces, p, v, st));
  }
  return s;
}

// The simulator's durations: each op's piece or stage time. The stage times are read when an op
// runs, so `stages` may change between simulations (expose_reductions).
SimOptions pipeline_options(const ParallelLayout& c, const LayerTimes& lt, const RuntimeModel& rt,
                            const PieceTimes& pieces, const StageTimes& stages) {
  const int p = c.pipeline;
  SimOptions so;
  so.latency = p > 1 ? lt.p2p : 0;
  so.transfer_at_receive = !rt.p2p_both_ends;
  // The step's sums over the pipeline (loss, gradient norm) and the tied embedding's as the
  // runtime makes them: blocking at the step of the flushing schedules, posted at ReduceGrads
  // and completed at the step by 2bw (launch/train/pipeline_stage.h).
  so.collectives = true;
  so.duration = [&pieces, &stages, p](int stage, const Instr& in) -> double {
    const size_t k = static_cast<size_t>(in.chunk * p + stage);
    switch (in.op) {
      case Op::kForward:
        return pieces.forward[k];
      case Op::kBackward:
        return pieces.backward[k];
      case Op::kBackwardInput:
        return pieces.backward_input[k];
      case Op::kBackwardWeight:
        return pieces.backward_weight[k];
      case Op::kReduceGrads:
        return stages.reduce[static_cast<size_t>(stage)];
      case Op::kOptimizerStep:
        return stages.optimizer[static_cast<size_t>(stage)] +
               stages.step_extra[static_cast<size_t>(stage)];
      default:
        return 0.0;
    }
  };
  return so;
}

// The schedule to simulate: the plan's, with long runs of a non-gpipe flushing schedule cut to
// at most kMaxSimulatedOps forwards (*extrapolate: the rest is added as steady state), and 2bw
// over 4 batches.
ScheduleSpec simulated_spec(const ParallelLayout& c, bool* extrapolate) {
  const int p = c.pipeline, v = c.virtual_stages;
  ScheduleSpec spec;
  spec.kind = c.schedule;
  spec.stages = p;
  spec.microbatches = c.num_microbatches;
  spec.chunks = c.schedule == ScheduleKind::kInterleaved ? v : 1;
  const bool two_bw = c.schedule == ScheduleKind::kTwoBW;
  *extrapolate = !two_bw && c.schedule != ScheduleKind::kGPipe &&
                 static_cast<int64_t>(p) * spec.microbatches * spec.chunks > kMaxSimulatedOps;
  if (*extrapolate) {
    const int m_sim =
        std::max(2 * p, static_cast<int>(kMaxSimulatedOps / (p * spec.chunks)) / p * p);
    spec.microbatches = std::min(spec.microbatches, m_sim);
  }
  if (two_bw) spec.batches = 4;
  return spec;
}

// With data parallelism, from the first simulation (reductions free): when each stage's
// gradients become final and when it reaches ReduceGrads; the exposed remainder of each stage's
// reduction goes on its ReduceGrads (flushing schedules: stages->reduce) or, for 2bw (posted at
// ReduceGrads, completed at the step), on its step (stages->step_extra).
void expose_reductions(const SimResult& first, const CostContext& ctx, const ParallelLayout& c,
                       const ScheduleSpec& spec, StageTimes* stages) {
  if (gradient_reduction_ranks(c) <= 1) return;
  ParallelLayout sim_config = c;
  sim_config.num_microbatches = spec.microbatches;
  for (int st = 0; st < c.pipeline; ++st) {
    const size_t si = static_cast<size_t>(st);
    double reduce_at = 0, step_at = 0;
    for (const TimelineEvent& e : first.timeline) {
      if (e.stage != st) continue;
      if (e.op == Op::kReduceGrads && reduce_at == 0) reduce_at = e.start;
      if (e.op == Op::kOptimizerStep && step_at == 0) step_at = e.start;
    }
    if (c.schedule == ScheduleKind::kTwoBW) {
      // Posted at ReduceGrads, all buckets at once; the step waits for what is left.
      const double done = reduce_at + stages->dp[si].reduce;
      stages->step_extra[si] = std::max(0.0, done - step_at);
    } else {
      const double done = reduction_finish(first, ctx.runtime, sim_config, *ctx.model, st,
                                           stages->dp[si].reduce, reduce_at);
      stages->reduce[si] = std::max(0.0, done - reduce_at);
    }
  }
}

// Past the warm-up every further micro-batch adds one period of the slowest stage (steady
// state): extends *sim (makespan, busy, bubble) from spec.microbatches simulated to the plan's
// c.num_microbatches; returns the makespan. The in-flight counts are reached during the
// warm-up and do not grow.
double extrapolate_steady_state(const ParallelLayout& c, const ScheduleSpec& spec,
                                const PieceTimes& t, SimResult* sim) {
  const int p = c.pipeline, v = c.virtual_stages;
  const int m_full = c.num_microbatches;
  double period = 0;
  for (int st = 0; st < p; ++st) {
    double per = 0;
    for (int ch = 0; ch < v; ++ch)
      per += t.backward[static_cast<size_t>(ch * p + st)] +
             t.forward[static_cast<size_t>(ch * p + st)];
    period = std::max(period, per);
  }
  const double extra = (m_full - spec.microbatches) * period;
  const double makespan = sim->makespan + extra;
  double busy = 0;
  for (size_t st = 0; st < sim->busy.size(); ++st) {
    double per = 0;
    for (int ch = 0; ch < v; ++ch)
      per += t.backward[static_cast<size_t>(ch * p) + st] +
             t.forward[static_cast<size_t>(ch * p) + st];
    sim->busy[st] += (m_full - spec.microbatches) * per;
    busy += sim->busy[st];
  }
  sim->makespan = makespan;
  sim->bubble_fraction = 1 - busy / (p * makespan);
  return makespan;
}

// The iteration's exposed data-parallel time and optimizer step: the largest over the stages.
void data_parallel_and_step(const RuntimeModel& rt, const ParallelLayout& c,
                            const PieceTimes& pieces, const StageTimes& stages, IterationTime* it) {
  double dp_exposed = 0;
  for (int st = 0; st < c.pipeline; ++st) {
    const size_t si = static_cast<size_t>(st);
    const double gather = exposed_gather(rt, stages.dp[si],
                                         stage_forward_s(pieces, c.pipeline, c.virtual_stages, st));
    dp_exposed = std::max(dp_exposed, stages.reduce[si] + stages.step_extra[si] + gather);
    it->optimizer_s = std::max(it->optimizer_s, stages.optimizer[si] - gather);
  }
  it->dp_exposed_s = dp_exposed;
}

// The most any stage's layers (its pieces summed) take of a per-layer figure: `per_layer`
// of one layer of each kind.
double most_per_stage(const ModelDescription& m, const ParallelLayout& c,
                      const std::vector<double>& per_layer) {
  const int p = c.pipeline, v = c.virtual_stages;
  const std::vector<int> first = first_layers(c.layers_per_piece);
  double most = 0;
  for (int st = 0; st < p; ++st) {
    std::vector<int> held(per_layer.size(), 0);
    for (int ch = 0; ch < v; ++ch) {
      const size_t k = static_cast<size_t>(ch * p + st);
      const std::vector<int> n = layer_kind_counts(m, first[k], c.layers_per_piece[k]);
      for (size_t kind = 0; kind < n.size(); ++kind) held[kind] += n[kind];
    }
    double x = 0;
    for (size_t kind = 0; kind < held.size(); ++kind) x += per_layer[kind] * held[kind];
    most = std::max(most, x);
  }
  return most;
}

}  // namespace

std::vector<LayerTimes> kind_times(const CostContext& ctx, const ParallelLayout& c) {
  std::vector<LayerTimes> kinds;
  for (int kind = 0; kind < ctx.model->layer_kinds(); ++kind)
    kinds.push_back(layer_times(ctx, c, kind));
  return kinds;
}

IterationTime iteration_time(const CostContext& ctx, const ParallelLayout& c, bool keep_timeline) {
  const std::vector<LayerTimes> kinds = kind_times(ctx, c);
  const LayerTimes& lt = kinds.front();
  IterationTime it;
  const PieceTimes pieces = piece_times(kinds, *ctx.model, c, ctx.runtime, &it);
  StageTimes stages = stage_times(ctx, c, pieces);
  const SimOptions so = pipeline_options(c, lt, ctx.runtime, pieces, stages);
  bool extrapolate = false;
  ScheduleSpec spec = simulated_spec(c, &extrapolate);
  // A first pass with the reductions free; their exposed remainders then go on ReduceGrads or
  // the step (expose_reductions).
  SimResult first = simulate(spec, so);
  expose_reductions(first, ctx, c, spec, &stages);
  double makespan = 0;
  if (c.schedule == ScheduleKind::kTwoBW) {
    // 2bw never flushes: the steady-state time of one batch from runs of 2 and 4 batches.
    spec.batches = 2;
    const SimResult two = simulate(spec, so);
    spec.batches = 4;
    it.sim = simulate(spec, so);
    makespan = (it.sim.makespan - two.makespan) / 2;
  } else {
    // A flushing schedule ends each stage with ReduceGrads, then the step every stage enters
    // together: the exposed reductions lengthen only that tail, so the first pass is patched
    // instead of simulated again.
    it.sim = std::move(first);
    add_reduction_tails(&it.sim, stages.reduce);
    makespan = it.sim.makespan;
  }
  if (extrapolate) makespan = extrapolate_steady_state(c, spec, pieces, &it.sim);
  it.iteration_s = makespan;
  it.pipeline_s = makespan;
  it.bubble_fraction = it.sim.bubble_fraction;
  data_parallel_and_step(ctx.runtime, c, pieces, stages, &it);
  std::vector<double> tp, ep, cp;  // [kind] per layer
  for (const LayerTimes& x : kinds) {
    tp.push_back(x.tp_exposed_per_layer);
    ep.push_back(x.ep_exposed_per_layer);
    cp.push_back(x.cp_exposed_per_layer);
  }
  it.tp_exposed_s = most_per_stage(*ctx.model, c, tp) * c.num_microbatches;
  it.ep_exposed_s = most_per_stage(*ctx.model, c, ep) * c.num_microbatches;
  it.cp_exposed_s = most_per_stage(*ctx.model, c, cp) * c.num_microbatches;
  it.stage_compute_s = it.sim.busy;
  it.peak_inflight = it.sim.peak_inflight;
  if (!keep_timeline) it.sim.timeline.clear();
  return it;
}

}  // namespace strata
