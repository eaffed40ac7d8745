#include "partitioner/planner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "partitioner/figures.h"
#include "runtime/base/error.h"

namespace strata {

using nlohmann::json;

namespace {

// The balanced split for identical layers with end extras (exact and O(pieces · log)): the
// smallest max piece time T such that the pieces' capacities floor((T - extra)/c) cover L.
std::vector<int> split_fast(int L, int pieces, double c, double first_extra, double last_extra) {
  auto cap = [&](double T, int k) {
    const double extra = (k == 0 ? first_extra : 0) + (k == pieces - 1 ? last_extra : 0);
    return static_cast<int>(std::floor((T - extra) / c + 1e-9));
  };
  auto covers = [&](double T) {
    int64_t sum = 0;
    for (int k = 0; k < pieces; ++k) {
      const int n = cap(T, k);
      if (n < 1) return false;
      sum += n;
    }
    return sum >= L;
  };
  // The optimum is n·c + e for the binding piece's extra e ∈ {0, first, last}: for each e the
  // smallest covering n by bisection (coverage grows with T).
  double bestT = std::numeric_limits<double>::infinity();
  for (double e : {0.0, first_extra, last_extra}) {
    int lo = 1;
    const int hi_n = L + 1 + static_cast<int>(std::ceil(std::max(first_extra, last_extra) / c));
    int hi = hi_n;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (covers(mid * c + e))
        hi = mid;
      else
        lo = mid + 1;
    }
    if (lo < hi_n) bestT = std::min(bestT, lo * c + e);
  }
  std::vector<int> out(static_cast<size_t>(pieces));
  int sum = 0;
  for (int k = 0; k < pieces; ++k) sum += out[static_cast<size_t>(k)] = cap(bestT, k);
  // Remove the excess from the fullest pieces, middle first.
  for (int k = pieces / 2, step = 0; sum > L; ++step) {
    const int idx = (k + step) % pieces;
    if (out[static_cast<size_t>(idx)] > 1) {
      out[static_cast<size_t>(idx)]--;
      sum--;
    }
  }
  return out;
}

std::string placement_text(const Cluster& cl, const ParallelLayout& c) {
  std::ostringstream os;
  const int gpn = cl.gpus_per_node;
  if (c.context > 1) {
    os << "ranks r = tp + " << c.tensor << "·(cp + " << c.context << "·(dp + " << c.data
       << "·pp)); tensor groups of " << c.tensor << " inside one node (NVLink); context groups of "
       << c.context << " ranks " << c.tensor << " apart "
       << (gpn % (c.tensor * c.context) == 0 ? "inside a node (NVLink)"
                                             : "across nodes (InfiniBand)")
       << ", each rank S/" << c.context << " tokens of every sequence (ring attention)";
  } else {
    os << "ranks r = tp + " << c.tensor << "·(dp + " << c.data << "·pp); tensor groups of "
       << c.tensor << " inside one node (NVLink)";
  }
  const int per_stage = c.tensor * c.context * c.data;
  if (per_stage <= gpn) {
    os << "; data groups inside a node; " << std::max(1, gpn / per_stage)
       << " pipeline stage(s) per node";
  } else {
    os << "; each data group spans " << (per_stage + gpn - 1) / gpn
       << " nodes (InfiniBand); pipeline stages on different nodes";
  }
  if (c.expert > 1) {
    const int span = c.tensor * c.context * c.expert;
    os << "; expert groups of " << c.expert << " consecutive data ranks (" << c.tensor * c.context
       << " apart) " << (gpn % span == 0 ? "inside a node (NVLink)" : "across nodes (InfiniBand)");
  }
  return os.str();
}

struct Estimate {
  ParallelLayout config;
  double time = 0;
  double peak_mem = 0;
  int peak_stage = 0;
  double bubble_s = 0, tp_s = 0, dp_s = 0, ep_s = 0, cp_s = 0;
};

// Megatron's in-flight (micro-batch, chunk) pairs per stage, for the closed-form pass.
std::vector<int> closed_form_inflight(const ParallelLayout& c) {
  const int p = c.pipeline, m = c.num_microbatches, v = c.virtual_stages;
  std::vector<int> out(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    int n = 0;
    switch (c.schedule) {
      case ScheduleKind::kGPipe:
        n = m;
        break;
      case ScheduleKind::kInterleaved:
        n = std::min(m * v, 2 * (p - s - 1) + (v - 1) * p + 1);
        break;
      default:
        n = std::min(m, p - s);
        break;
    }
    out[static_cast<size_t>(s)] = n;
  }
  return out;
}

json family_json(int t, int c, int p, ScheduleKind k) {
  return {{"tensor", t}, {"context", c}, {"pipeline", p}, {"schedule", to_string(k)}};
}

}  // namespace

std::string expert_invalid_reason(const ModelDescription& m, const ParallelLayout& c) {
  const int e = c.expert, E = m.num_experts();
  if (e == 1) return "";
  const std::string es = "expert " + std::to_string(e);
  if (e < 1) return es + " must be at least 1";
  if (E == 0) return es + " for a model without experts (a dense MLP: expert must be 1)";
  if (E % e != 0) return es + " does not divide num_experts " + std::to_string(E);
  if (c.data % e != 0) return es + " does not divide data " + std::to_string(c.data);
  return "";
}

std::string context_invalid_reason(const ModelDescription& m, const ParallelLayout& c) {
  const int cp = c.context;
  if (cp == 1) return "";
  const std::string cs = "context " + std::to_string(cp);
  if (cp < 1) return cs + " must be at least 1";
  const int64_t S = m.seq_len();
  if (S % (2 * int64_t{cp}) != 0) {
    return cs + " cuts each sequence into " + std::to_string(2 * cp) + " chunks: seq_len " +
           std::to_string(S) + " is not a multiple of " + std::to_string(2 * cp);
  }
  if (c.sequence_parallel && c.tensor > 1 && (S / cp) % c.tensor != 0) {
    return "sequence_parallel needs a context rank's " + std::to_string(S / cp) +
           " tokens (seq_len " + std::to_string(S) + " / " + cs + ") divisible by tensor " +
           std::to_string(c.tensor);
  }
  return "";
}

std::string sizes_invalid_reason(const ModelDescription& m, const Cluster& cl,
                                 const ParallelLayout& c) {
  const int64_t world = int64_t{c.tensor} * c.context * c.pipeline * c.data;
  if (world != cl.world_size()) {
    return "tensor " + std::to_string(c.tensor) +
           (c.context != 1 ? " × context " + std::to_string(c.context) : std::string()) +
           " × pipeline " + std::to_string(c.pipeline) + " × data " + std::to_string(c.data) +
           " = " + std::to_string(world) + " but the cluster has " +
           std::to_string(cl.world_size()) + " GPUs";
  }
  if (std::string why = context_invalid_reason(m, c); !why.empty()) return why;
  if (c.tensor > cl.gpus_per_node) {
    return "tensor " + std::to_string(c.tensor) + " would span nodes (" +
           std::to_string(cl.gpus_per_node) + " GPUs per node)";
  }
  if (std::string why = m.tensor_split_reason(c.tensor, c.sequence_parallel); !why.empty())
    return why;
  if (std::string why = expert_invalid_reason(m, c); !why.empty()) return why;
  if (c.pipeline * c.virtual_stages > m.num_layers()) {
    return std::to_string(c.pipeline * c.virtual_stages) + " pieces for " +
           std::to_string(m.num_layers()) + " layers";
  }
  return "";
}

std::string split_invalid_reason(const ModelDescription& m, const ParallelLayout& c) {
  if (!c.layers_per_piece.empty()) {
    int64_t layers = 0;
    for (int n : c.layers_per_piece) layers += n;
    if (static_cast<int>(c.layers_per_piece.size()) != c.pieces() || layers != m.num_layers()) {
      return "layers_per_stage has " + std::to_string(c.layers_per_piece.size()) + " pieces of " +
             std::to_string(layers) + " layers in all, but pipeline " + std::to_string(c.pipeline) +
             " × virtual_stages " + std::to_string(c.virtual_stages) + " needs " +
             std::to_string(c.pieces()) + " pieces of the model's " +
             std::to_string(m.num_layers()) + " layers";
    }
  }
  return "";
}

std::string plan_invalid_reason(const ModelDescription& m, const Cluster& cl, int B,
                                const ParallelLayout& c) {
  if (std::string why = sizes_invalid_reason(m, cl, c); !why.empty()) return why;
  if (std::string why = split_invalid_reason(m, c); !why.empty()) return why;
  if (B % (c.micro_batch_size * c.data) != 0) {
    return "global batch " + std::to_string(B) + " is not a multiple of micro-batch " +
           std::to_string(c.micro_batch_size) + " × data " + std::to_string(c.data);
  }
  if (c.schedule != ScheduleKind::kInterleaved && c.virtual_stages != 1) {
    return "virtual_stages " + std::to_string(c.virtual_stages) + " needs the interleaved schedule";
  }
  ScheduleSpec spec;
  spec.kind = c.schedule;
  spec.stages = c.pipeline;
  spec.microbatches = B / (c.micro_batch_size * c.data);
  spec.chunks = c.virtual_stages;
  spec.batches = c.schedule == ScheduleKind::kTwoBW ? 2 : 1;
  return schedule_invalid_reason(spec);
}

RuntimeModel runtime_for(const PlanRequest& req) {
  return req.runtime ? *req.runtime
                     : strata_runtime(req.cluster.cpu, req.precision, req.memory.bucket_mb);
}

PlanResult evaluate_plan(const PlanRequest& req, ParallelLayout c) {
  const ModelDescription& m = *req.model;
  const std::string bad = plan_invalid_reason(m, req.cluster, req.global_batch_size, c);
  if (!bad.empty()) throw InputError("<plan>", "parallel", bad);
  c.num_microbatches = req.global_batch_size / (c.micro_batch_size * c.data);
  CostContext ctx{&m, &req.cluster, req.precision, req.profile, runtime_for(req)};
  const int pieces = c.pipeline * c.virtual_stages;
  if (c.layers_per_piece.empty()) {
    // Each layer at its kind's time (a mixture's dense layers are cheaper than its sparse ones).
    const std::vector<LayerTimes> kinds = kind_times(ctx, c);
    std::vector<double> cost(static_cast<size_t>(m.num_layers()));
    for (int l = 0; l < m.num_layers(); ++l) {
      const LayerTimes& x = kinds[static_cast<size_t>(m.layer_kind(l))];
      cost[static_cast<size_t>(l)] = x.layer_fwd + x.layer_bwd;
    }
    const LayerTimes& lt = kinds.front();
    c.layers_per_piece =
        split_layers_dp(cost, pieces, lt.emb_fwd + lt.emb_bwd, lt.head_fwd + lt.head_bwd);
  }
  PlanResult r;
  r.config = c;
  r.time = iteration_time(ctx, c, false);
  r.memory = stage_memory(m, c, req.memory, r.time.peak_inflight);
  for (size_t s = 0; s < r.memory.size(); ++s) {
    if (r.memory[s].total() > r.peak_memory) {
      r.peak_memory = r.memory[s].total();
      r.peak_stage = static_cast<int>(s);
    }
  }
  const double world = req.cluster.world_size();
  const double peak = req.cluster.peak(req.precision);
  const FlopCount flops = m.flops_per_iteration(req.global_batch_size, c.recompute);
  r.tflops_per_gpu = flops.hardware / world / r.time.iteration_s / 1e12;
  r.mfu = flops.model / world / r.time.iteration_s / peak;
  r.placement = placement_text(req.cluster, c);
  return r;
}

namespace {

// A family of the search: tensor size, pipeline size and schedule. Its best estimate, or the
// smallest overage and why nothing fitted, become its line in the rejected list.
struct Family {
  int t = 1, c = 1, p = 1;
  ScheduleKind k = ScheduleKind::kOneFOneB;
  bool any_fit = false;
  double best_time = std::numeric_limits<double>::infinity();
  Estimate best;
  double least_over = std::numeric_limits<double>::infinity();
  int over_stage = 0;
  std::string invalid;  // the first reason one of its points could not work
  // When no point of it could be costed: why (family_blocker), and the group it shares.
  std::string blocked, blocked_group, blocked_item;
};
using Families = std::map<std::tuple<int, int, int, int>, Family>;  // [(t, c, p, schedule)]

// What every candidate of one search shares.
struct Search {
  explicit Search(const PlanRequest& r)
      : req(r),
        m(*r.model),
        cl(r.cluster),
        fx(r.fixes),
        world(r.cluster.world_size()),
        B(r.global_batch_size),
        rt(runtime_for(r)),
        ctx{&m, &cl, r.precision, r.profile, rt, &memo} {}
  const PlanRequest& req;
  const ModelDescription& m;
  const Cluster& cl;
  const PinnedLayout& fx;
  const int world, B;
  const RuntimeModel rt;
  GemmMemo memo;
  CostContext ctx;
  // The layers' times by the fields of a point they depend on (t, c, e, b, sequence parallel,
  // recompute, and whether a stage spans a node: the transfer's link): the points of a search
  // share them across p, d, v, the schedule and the distributed optimizer.
  std::map<std::array<int, 7>, std::vector<LayerTimes>> layer_memo;

  const std::vector<LayerTimes>& kinds(const ParallelLayout& c) {
    const int spans = c.tensor * c.context * c.data >= cl.gpus_per_node ? 1 : 0;
    const std::array<int, 7> key = {c.tensor,
                                    c.context,
                                    c.expert,
                                    c.micro_batch_size,
                                    c.sequence_parallel ? 1 : 0,
                                    static_cast<int>(c.recompute),
                                    spans};
    auto it = layer_memo.find(key);
    if (it == layer_memo.end()) it = layer_memo.emplace(key, kind_times(ctx, c)).first;
    return it->second;
  }
};

// The context sizes to search beside a tensor group of t: every c dividing the world's other
// ranks that cuts each sequence into 2c equal chunks of at least kMinContextChunk tokens (only 1
// beside a pinned expert size above 1: the two do not compose yet); or the pinned size
// (refused, if it does not work, by plan_invalid_reason with its numbers).
constexpr int64_t kMinContextChunk = 512;  // the attention tables' shortest sequence
std::vector<int> context_sizes(const Search& s, int t) {
  if (s.fx.context) return {*s.fx.context};
  std::vector<int> sizes = {1};
  if (s.fx.expert && *s.fx.expert > 1) return sizes;
  const int64_t S = s.m.seq_len();
  for (int c = 2; c <= s.world / t && S / (2 * int64_t{c}) >= kMinContextChunk; ++c)
    if ((s.world / t) % c == 0 && S % (2 * int64_t{c}) == 0) sizes.push_back(c);
  return sizes;
}

// Calls f(t, c, p, d, schedule) for every family the cluster and the pins allow, in search
// order.
template <class F>
void for_each_family(const Search& s, F f) {
  const ScheduleKind kinds[] = {ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved,
                                ScheduleKind::kZeroBubbleH1, ScheduleKind::kGPipe,
                                ScheduleKind::kTwoBW};
  const PinnedLayout& fx = s.fx;
  for (int t = 1; t <= s.cl.gpus_per_node; t *= 2) {
    if (fx.tensor && *fx.tensor != t) continue;
    for (int c : context_sizes(s, t)) {
      if (c < 1 || s.world % (t * c) != 0) {
        // A pinned size that does not divide the world: one family, whose points
        // plan_invalid_reason refuses naming the sizes.
        f(t, c, fx.pipeline.value_or(1), std::max(1, s.world / (t * std::max(1, c))),
          fx.schedule.value_or(ScheduleKind::kOneFOneB));
        continue;
      }
      for (int p = 1; p <= std::min(s.m.num_layers(), s.world / (t * c)); ++p) {
        if (fx.pipeline && *fx.pipeline != p) continue;
        if (s.world % (t * c * p) != 0) continue;
        const int d = s.world / (t * c * p);
        if (fx.data && *fx.data != d) continue;
        for (ScheduleKind k : kinds) {
          if (fx.schedule && *fx.schedule != k) continue;
          // With one stage every schedule is the same 1F1B loop (gpipe only holds more).
          if (p == 1 && k != ScheduleKind::kOneFOneB && !fx.schedule) continue;
          // 2bw changes the optimizer's semantics (stale weights): only when asked for.
          if (k == ScheduleKind::kTwoBW && !fx.schedule) continue;
          f(t, c, p, d, k);
        }
      }
    }
  }
}

// Every micro-batch size that cuts the data rank's share of the batch evenly (14 of 56 as well
// as the powers of two); a pinned size that does not is the family's reason.
std::vector<int> micro_batch_sizes(const Search& s, int d, Family* F) {
  const PinnedLayout& fx = s.fx;
  std::vector<int> sizes;
  if (s.B % d == 0)
    for (int b = 1; b <= s.B / d; ++b)
      if ((s.B / d) % b == 0 && (!fx.micro_batch_size || *fx.micro_batch_size == b))
        sizes.push_back(b);
  if (fx.micro_batch_size && sizes.empty() && F->invalid.empty()) {
    const std::string B = std::to_string(s.B), dt = std::to_string(d);
    F->invalid = "micro_batch_size " + std::to_string(*fx.micro_batch_size) +
                 " does not divide the global batch " + B + " over data " + dt + " (" + B +
                 " / (b · " + dt + ") must be a whole number of micro-batches)";
  }
  return sizes;
}

// The model chunks per stage a schedule runs: 1, or for interleaving every v ≥ 2 whose p·v
// pieces cut the layers evenly.
std::vector<int> chunk_counts(const Search& s, ScheduleKind k, int p) {
  if (k != ScheduleKind::kInterleaved) return {1};
  std::vector<int> vs;
  for (int v = 2; v * p <= s.m.num_layers(); ++v)
    if (s.m.num_layers() % (v * p) == 0) vs.push_back(v);
  return vs;
}

// The expert-parallel sizes to search on d data ranks: every divisor of d that divides the
// model's experts (only 1 for a dense model), or the pinned size (refused, if it does not
// divide, by plan_invalid_reason with both numbers).
std::vector<int> expert_sizes(const Search& s, int d) {
  if (s.fx.expert) return {*s.fx.expert};
  const int E = s.m.num_experts();
  std::vector<int> sizes = {1};
  for (int e = 2; e <= d && E > 0; ++e)
    if (d % e == 0 && E % e == 0) sizes.push_back(e);
  return sizes;
}

// Why family F (on d data ranks) has no point to cost, the first blocking constraint in this
// order: the sizes themselves (world, context, a tensor group inside a node, the heads over the
// tensor group, experts, pieces for the layers), the pins that need a group (sequence
// parallelism, ZeRO-1), the layers into p·v equal chunks (interleaved), a pinned layer split, the
// batch over the data ranks and micro-batches, then the first point's own reason (schedule
// limits).
// Sets F->blocked, and F->blocked_group (with "{}" for the varying F->blocked_item) for the
// families that share it.
void family_blocker(const Search& s, int d, Family* F) {
  const PinnedLayout& fx = s.fx;
  const int t = F->t, p = F->p, L = s.m.num_layers();
  auto set = [F](const std::string& text, const std::string& group = "",
                 const std::string& item = "") {
    F->blocked = text;
    F->blocked_group = group.empty() ? text : group;
    F->blocked_item = item;
  };
  ParallelLayout probe;
  probe.tensor = t;
  probe.context = F->c;
  probe.pipeline = p;
  probe.data = d;
  probe.schedule = F->k;
  probe.expert = fx.expert.value_or(1);
  probe.micro_batch_size = 1;
  probe.sequence_parallel = fx.sequence_parallel.value_or(false);
  if (std::string why = sizes_invalid_reason(s.m, s.cl, probe); !why.empty()) {
    set(why);
    return;
  }
  if (fx.sequence_parallel && *fx.sequence_parallel && t == 1) {
    set("sequence_parallel needs tensor > 1");
    return;
  }
  if (fx.distributed_optimizer && *fx.distributed_optimizer && d * F->c == 1) {
    set("distributed_optimizer (ZeRO-1) needs data × context > 1");
    return;
  }
  const std::string Ls = std::to_string(L), ps = std::to_string(p);
  if (F->k == ScheduleKind::kInterleaved) {
    const std::vector<int> vs = chunk_counts(s, F->k, p);
    if (vs.empty()) {
      set(Ls + " layers do not split into " + ps +
              "·v equal chunks for any v ≥ 2 (the interleaved schedule's pieces)",
          Ls + " layers do not split into p·v equal chunks for any v ≥ 2 (interleaved, p in {})",
          ps);
      return;
    }
    if (fx.virtual_stages && std::find(vs.begin(), vs.end(), *fx.virtual_stages) == vs.end()) {
      const std::string v = std::to_string(*fx.virtual_stages);
      set("virtual_stages " + v + ": " + ps + "·" + v + " = " +
              std::to_string(p * *fx.virtual_stages) + " chunks do not cut " + Ls +
              " layers evenly",
          "virtual_stages " + v + ": p·" + v + " chunks do not cut " + Ls +
              " layers evenly (p in {})",
          ps);
      return;
    }
  } else if (fx.virtual_stages && *fx.virtual_stages != 1) {
    set("virtual_stages " + std::to_string(*fx.virtual_stages) + " needs the interleaved schedule");
    return;
  }
  if (fx.layers_per_piece) {
    probe.layers_per_piece =
        std::vector<int>(fx.layers_per_piece->begin(), fx.layers_per_piece->end());
    if (F->k == ScheduleKind::kInterleaved)
      probe.virtual_stages = fx.virtual_stages.value_or(chunk_counts(s, F->k, p).front());
    if (std::string why = split_invalid_reason(s.m, probe); !why.empty()) {
      set(why);
      return;
    }
  }
  if (s.B % d != 0) {
    const std::string B = std::to_string(s.B);
    set("global batch " + B + " does not split over data " + std::to_string(d),
        "global batch " + B + " does not split over data d (d in {})", std::to_string(d));
    return;
  }
  if (fx.micro_batch_size && (s.B / d) % *fx.micro_batch_size != 0) {
    const std::string B = std::to_string(s.B), b = std::to_string(*fx.micro_batch_size);
    set(F->invalid,
        "micro_batch_size " + b + " does not divide the global batch " + B +
            " over data d (d in {})",
        std::to_string(d));
    return;
  }
  if (!F->invalid.empty()) {
    set(F->invalid);
    return;
  }
  set("the pins leave no point of this family to cost");
}

// Calls f(c) for every point of family F (on d data ranks) the pins allow and whose sizes work:
// every micro-batch size, expert size, chunk count, recompute, sequence parallelism (t > 1) and
// distributed optimizer (d·c > 1: ZeRO-1 shards over data × context). The first point whose
// sizes do not work gives the family its reason.
template <class Fn>
void for_each_candidate(const Search& s, int d, Family* F, Fn f) {
  const Recompute recs[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  const PinnedLayout& fx = s.fx;
  const int t = F->t, cp = F->c, p = F->p;
  int64_t costed = 0;
  for (int b : micro_batch_sizes(s, d, F)) {
    for (int e : expert_sizes(s, d)) {
      for (int v : chunk_counts(s, F->k, p)) {
        if (fx.virtual_stages && *fx.virtual_stages != v) continue;
        for (Recompute rc : recs) {
          if (fx.recompute && *fx.recompute != rc) continue;
          for (int sp = 0; sp <= (t > 1 ? 1 : 0); ++sp) {
            if (fx.sequence_parallel && *fx.sequence_parallel != (sp == 1)) continue;
            for (int dist = 0; dist <= (d * cp > 1 ? 1 : 0); ++dist) {
              if (fx.distributed_optimizer && *fx.distributed_optimizer != (dist == 1)) continue;
              ParallelLayout c;
              c.tensor = t;
              c.context = cp;
              c.expert = e;
              c.pipeline = p;
              c.data = d;
              c.virtual_stages = v;
              c.micro_batch_size = b;
              c.schedule = F->k;
              c.recompute = rc;
              c.sequence_parallel = sp == 1;
              c.distributed_optimizer = dist == 1;
              if (fx.layers_per_piece) c.layers_per_piece = *fx.layers_per_piece;
              const std::string bad = plan_invalid_reason(s.m, s.cl, s.B, c);
              if (!bad.empty()) {
                if (F->invalid.empty()) F->invalid = bad;
                continue;
              }
              c.num_microbatches = s.B / (b * d);
              ++costed;
              f(c);
            }
          }
        }
      }
    }
  }
  if (costed == 0) family_blocker(s, d, F);
}

// The closed-form estimate of c: the slowest stage's compute stretched by Megatron's bubble
// ratio, the exposed tensor- and data-parallel communication and the optimizer step; memory
// with Megatron's in-flight counts; the split balanced for identical layers (unless pinned):
// with several kinds of layer (a mixture's dense layers), for layers of their mean time, the
// stages then priced with the kinds they hold (the exact pass splits by each layer's time).
Estimate estimate(Search& s, ParallelLayout c) {
  const ModelDescription& m = s.m;
  const RuntimeModel& rt = s.rt;
  const int p = c.pipeline, v = c.virtual_stages;
  const std::vector<LayerTimes>& kinds = s.kinds(c);
  const LayerTimes& lt = kinds.front();
  // The mean layer's time and exposed communication (one kind: its own).
  const std::vector<int> all = layer_kind_counts(m, 0, m.num_layers());
  double per_layer = 0, tp_per_layer = 0, ep_per_layer = 0, cp_per_layer = 0;
  for (size_t kind = 0; kind < kinds.size(); ++kind) {
    const double share = static_cast<double>(all[kind]) / m.num_layers();
    per_layer += share * (kinds[kind].layer_fwd + kinds[kind].layer_bwd);
    tp_per_layer += share * kinds[kind].tp_exposed_per_layer;
    ep_per_layer += share * kinds[kind].ep_exposed_per_layer;
    cp_per_layer += share * kinds[kind].cp_exposed_per_layer;
  }
  const double p2p_op = p * v > 1 && rt.p2p_both_ends ? lt.p2p : 0;
  if (c.layers_per_piece.empty())
    c.layers_per_piece = split_fast(m.num_layers(), p * v, per_layer, lt.emb_fwd + lt.emb_bwd,
                                    lt.head_fwd + lt.head_bwd);
  const std::vector<int> first = first_layers(c.layers_per_piece);
  // The slowest stage, and its forward share.
  double stage_max = 0, stage_f = 0;
  for (int st = 0; st < p; ++st) {
    double fsum = 0, bsum = 0;
    for (int ch = 0; ch < v; ++ch) {
      const int pk = ch * p + st;
      const size_t k = static_cast<size_t>(pk);
      const std::vector<int> held = layer_kind_counts(m, first[k], c.layers_per_piece[k]);
      double layers_f = 0, layers_b = 0;
      for (size_t kind = 0; kind < kinds.size(); ++kind) {
        layers_f += held[kind] * kinds[kind].layer_fwd;
        layers_b += held[kind] * kinds[kind].layer_bwd;
      }
      fsum += layers_f + (pk == 0 ? lt.emb_fwd : 0) + (pk == p * v - 1 ? lt.head_fwd : 0) + p2p_op;
      bsum += layers_b + (pk == 0 ? lt.emb_bwd : 0) + (pk == p * v - 1 ? lt.head_bwd : 0) + p2p_op;
    }
    if (fsum + bsum > stage_max) {
      stage_max = fsum + bsum;
      stage_f = fsum;
    }
  }
  ScheduleSpec spec;
  spec.kind = c.schedule;
  spec.stages = p;
  spec.microbatches = c.num_microbatches;
  spec.chunks = v;
  spec.batches = c.schedule == ScheduleKind::kTwoBW ? 4 : 1;
  const double ratio = c.schedule == ScheduleKind::kTwoBW ? 0.0 : theoretical_bubble_ratio(spec);
  const double compute = c.num_microbatches * stage_max;
  Estimate e;
  e.bubble_s = compute * ratio + (p > 1 ? 2.0 * (p - 1) * lt.p2p : 0);
  e.tp_s = tp_per_layer * c.num_microbatches * m.num_layers() / (p);
  e.ep_s = ep_per_layer * c.num_microbatches * m.num_layers() / (p);
  e.cp_s = cp_per_layer * c.num_microbatches * m.num_layers() / (p);
  // DP and optimizer through the same formulas as the exact pass, cheaply: one stage with the
  // largest parameter count.
  const std::vector<RankParameters> np = stage_parameters(m, c);
  const RankParameters nmax = *std::max_element(
      np.begin(), np.end(),
      [](const RankParameters& a, const RankParameters& b) { return a.total() < b.total(); });
  // The last micro-batch's backward (all of the stage's chunks) is the window a runtime that
  // reduces during the backward has; the first forward hides an overlapped parameter gather.
  const DataParallelTimes dpt = stage_reduction_times(s.cl, rt, c, nmax);
  const bool early = rt.dp_overlap && rt.collectives_progress_alone;
  double dp = std::max(0.0, dpt.reduce - (early ? stage_max - stage_f : 0.0));
  dp += rt.param_gather_overlap ? std::max(0.0, dpt.gather - stage_f) : dpt.gather;
  e.dp_s = dp;
  const double opt =
      optimizer_shard(c, nmax) * rt.step_bytes_per_param / s.cl.efficiency.optimizer_rate();
  e.time = compute + e.bubble_s + dp + opt;
  const std::vector<MemoryBreakdown> mem =
      stage_memory(m, c, s.req.memory, closed_form_inflight(c));
  for (size_t st = 0; st < mem.size(); ++st) {
    if (mem[st].total() > e.peak_mem) {
      e.peak_mem = mem[st].total();
      e.peak_stage = static_cast<int>(st);
    }
  }
  e.config = std::move(c);
  return e;
}

// An estimate into its family and, when it fits in `memory_bytes`, into `fits`.
void keep_estimate(const Estimate& e, double memory_bytes, Family* F, std::vector<Estimate>* fits) {
  if (e.peak_mem > memory_bytes) {
    const double over = e.peak_mem - memory_bytes;
    if (over < F->least_over) {
      F->least_over = over;
      F->over_stage = e.peak_stage;
    }
    return;
  }
  F->any_fit = true;
  if (e.time < F->best_time) {
    F->best_time = e.time;
    F->best = e;
  }
  fits->push_back(e);
}

// The exact pass on the most promising estimates (`fits`, fastest first): the best top_k plans that
// fit once the split is balanced by dynamic programming (unless pinned) and the schedule simulated;
// those that no longer fit into `rejected`.
std::vector<PlanResult> best_exact_plans(const PlanRequest& req, const std::vector<Estimate>& fits,
                                         std::vector<Rejection>* rejected) {
  const double memory_bytes = req.cluster.memory_bytes;
  const size_t exact_n = std::min(fits.size(), static_cast<size_t>(std::max(32, req.top_k * 6)));
  std::vector<PlanResult> exact;
  for (size_t i = 0; i < exact_n; ++i) {
    ParallelLayout c = fits[i].config;
    c.layers_per_piece = req.fixes.layers_per_piece.value_or(std::vector<int>());
    PlanResult r = evaluate_plan(req, c);
    if (r.peak_memory > memory_bytes) {
      rejected->push_back({plan_config_json(r.config),
                           "over memory by " + bytes_text(r.peak_memory - memory_bytes) +
                               " on stage " + std::to_string(r.peak_stage) +
                               " with the simulated in-flight micro-batches",
                           ""});
      continue;
    }
    exact.push_back(std::move(r));
  }
  std::sort(exact.begin(), exact.end(), [](const PlanResult& a, const PlanResult& b) {
    return a.time.iteration_s < b.time.iteration_s;
  });
  if (static_cast<int>(exact.size()) > req.top_k) exact.resize(static_cast<size_t>(req.top_k));
  return exact;
}

// A family's reason, and the reason it shares with the families it is grouped with: `group`
// with "{}" where the set of their `item`s, or the range of their `amount`s, goes.
struct Why {
  std::string text, group, item;
  double amount = std::numeric_limits<double>::quiet_NaN();
};

// Why family F has no plan in `plans`: slower than the best (and the cost that makes the
// difference), over memory, or its sizes; empty when a plan of it is listed, or when nothing
// fits at all but F had points that fit (no best to compare with).
Why family_reason(const ModelDescription& m, const Family& F, const std::vector<Estimate>& fits,
                  const std::vector<PlanResult>& plans) {
  const auto in_family = [&F](const ParallelLayout& c) {
    return c.tensor == F.t && c.context == F.c && c.pipeline == F.p && c.schedule == F.k;
  };
  for (const PlanResult& r : plans)
    if (in_family(r.config)) return {};
  if (F.any_fit) {
    if (plans.empty()) return {};
    const Estimate& e = F.best;
    const double slower = (e.time / plans.front().time.iteration_s - 1) * 100;
    // The best family's fastest estimate (`fits` is fastest first), to tell which cost makes
    // the difference.
    const ParallelLayout& top = plans.front().config;
    const Estimate* ref = nullptr;
    for (const Estimate& x : fits) {
      if (x.config.tensor == top.tensor && x.config.context == top.context &&
          x.config.pipeline == top.pipeline && x.config.schedule == top.schedule) {
        ref = &x;
        break;
      }
    }
    std::string cause = "compute efficiency (smaller GEMMs or recompute)";
    if (ref != nullptr) {
      const double db = e.bubble_s - ref->bubble_s, dt = e.tp_s - ref->tp_s,
                   dd = e.dp_s - ref->dp_s, de = e.ep_s - ref->ep_s, dc = e.cp_s - ref->cp_s;
      const double mx = std::max({db, dt, dd});
      if (de > 0 && de > mx && de > 0.2 * (e.time - ref->time)) {
        cause = "expert-parallel all-to-all";
      } else if (dc > 0 && dc > mx && dc > 0.2 * (e.time - ref->time)) {
        cause = "context-parallel ring transfers";
      } else if (mx > 0.2 * (e.time - ref->time)) {
        cause = mx == db   ? "pipeline bubble"
                : mx == dt ? "tensor-parallel communication"
                           : "data-parallel communication";
      }
    }
    const std::string expert =
        m.num_experts() > 0 ? ", e=" + std::to_string(e.config.expert) : std::string();
    Why w;
    w.text = "slower by " + three(std::max(0.0, slower)) + "% than the best plan because of " +
             cause + " (best of family: b=" + std::to_string(e.config.micro_batch_size) + expert +
             ", v=" + std::to_string(e.config.virtual_stages) + ", recompute " +
             to_string(e.config.recompute) + ")";
    w.group = "slower than the best plan by {}% because of " + cause;
    w.amount = std::max(0.0, slower);
    return w;
  }
  if (F.least_over < std::numeric_limits<double>::infinity()) {
    Why w;
    w.text = "over memory by " + bytes_text(F.least_over) + " on stage " +
             std::to_string(F.over_stage) + " even with its smallest configuration";
    w.group = "over memory by {} even with their smallest configuration";
    w.amount = F.least_over;  // bytes
    return w;
  }
  return {F.blocked, F.blocked_group, F.blocked_item};
}

// "{}" in `group` replaced by the items ("{4, 8}") or the amounts' range ("2.1–40.3").
std::string group_text(const std::string& group, const std::vector<std::string>& items, double lo,
                       double hi) {
  const size_t at = group.find("{}");
  if (at == std::string::npos) return group;
  std::string fill;
  if (!items.empty()) {
    fill = "{";
    for (size_t i = 0; i < items.size(); ++i) fill += (i ? ", " : "") + items[i];
    fill += "}";
  } else {
    // Memory in bytes ("777 GiB–6.95 TiB"), else a percentage's figures ("2.1–40.3").
    auto text = [&group](double v) {
      return group.rfind("over memory", 0) == 0 ? bytes_text(v) : three(v);
    };
    fill = text(lo) + (text(hi) != text(lo) ? "–" + text(hi) : std::string());
  }
  return group.substr(0, at) + fill + group.substr(at + 2);
}

// The families' reasons grouped: the sizes' reasons first, then memory, then the slower ones;
// each group's text with its families' items or amounts filled in.
void add_family_rejections(const std::vector<std::pair<json, Why>>& whys,
                           std::vector<Rejection>* rejected) {
  struct Group {
    int rank = 0;
    size_t first = 0;
    std::vector<std::string> items;
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    std::vector<size_t> members;
  };
  std::map<std::string, Group> groups;
  for (size_t i = 0; i < whys.size(); ++i) {
    const Why& w = whys[i].second;
    auto [it, fresh] = groups.try_emplace(w.group);
    Group& g = it->second;
    if (fresh) {
      g.first = i;
      g.rank = !std::isnan(w.amount) ? (w.group.rfind("over memory", 0) == 0 ? 1 : 2) : 0;
    }
    if (!w.item.empty() && std::find(g.items.begin(), g.items.end(), w.item) == g.items.end())
      g.items.push_back(w.item);
    if (!std::isnan(w.amount)) {
      g.lo = std::min(g.lo, w.amount);
      g.hi = std::max(g.hi, w.amount);
    }
    g.members.push_back(i);
  }
  std::vector<const std::pair<const std::string, Group>*> order;
  for (const auto& g : groups) order.push_back(&g);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return std::tie(a->second.rank, a->second.first) < std::tie(b->second.rank, b->second.first);
  });
  for (const auto* g : order) {
    const std::string text = group_text(g->first, g->second.items, g->second.lo, g->second.hi);
    for (size_t i : g->second.members)
      rejected->push_back({whys[i].first, whys[i].second.text, text});
  }
}

// Why the pins leave no family at all (for_each_family called nothing): a tensor size the search
// does not try, more stages than layers, or sizes whose product is not the cluster's.
std::string pins_exclude_reason(const Search& s) {
  const PinnedLayout& fx = s.fx;
  const int gpn = s.cl.gpus_per_node;
  if (fx.tensor) {
    const int t = *fx.tensor;
    if (t > gpn)
      return "tensor " + std::to_string(t) + " would span nodes (" + std::to_string(gpn) +
             " GPUs per node)";
    if ((t & (t - 1)) != 0) {
      std::string sizes;
      for (int x = 1; x <= gpn; x *= 2) sizes += (sizes.empty() ? "" : ", ") + std::to_string(x);
      return "tensor " + std::to_string(t) + " is not a size the search tries (powers of two up " +
             "to a node's " + std::to_string(gpn) + " GPUs: " + sizes + ")";
    }
  }
  if (fx.pipeline && *fx.pipeline > s.m.num_layers())
    return "pipeline " + std::to_string(*fx.pipeline) + " is more stages than the model's " +
           std::to_string(s.m.num_layers()) + " layers";
  std::string pins;
  const std::pair<const char*, const std::optional<int>*> sizes[] = {{"tensor", &fx.tensor},
                                                                     {"context", &fx.context},
                                                                     {"pipeline", &fx.pipeline},
                                                                     {"data", &fx.data}};
  for (const auto& [name, v] : sizes)
    if (*v) pins += (pins.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(**v);
  return "no tensor × context × pipeline × data equal to the cluster's " + std::to_string(s.world) +
         " GPUs has " + (pins.empty() ? "the pinned sizes" : pins);
}

}  // namespace

PlanOutput search_plans(const PlanRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  Search s(req);
  PlanOutput out;
  Families families;
  std::vector<Estimate> fits;  // the estimates that fit in memory, in search order
  for_each_family(s, [&](int t, int cp, int p, int d, ScheduleKind k) {
    Family& F = families[{t, cp, p, static_cast<int>(k)}];
    F.t = t;
    F.c = cp;
    F.p = p;
    F.k = k;
    for_each_candidate(s, d, &F, [&](const ParallelLayout& c) {
      ++out.candidates;
      keep_estimate(estimate(s, c), s.cl.memory_bytes, &F, &fits);
    });
  });
  std::sort(fits.begin(), fits.end(),
            [](const Estimate& a, const Estimate& b) { return a.time < b.time; });
  out.plans = best_exact_plans(req, fits, &out.rejected);
  std::vector<std::pair<json, Why>> whys;
  for (const auto& [key, F] : families) {
    Why w = family_reason(s.m, F, fits, out.plans);
    if (!w.text.empty()) whys.emplace_back(family_json(F.t, F.c, F.p, F.k), std::move(w));
  }
  if (families.empty()) {
    // The pins left no family at all: say which.
    const std::string why = pins_exclude_reason(s);
    whys.emplace_back(json::object(), Why{why, why, ""});
  }
  add_family_rejections(whys, &out.rejected);
  out.search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

namespace {

// "t=8 p=16 d=1 v=1 b=1 1f1b, recompute full: 14.2 s per iteration, 71.30 GiB on the fullest
// GPU"
std::string plan_summary(const PlanResult& r) {
  const ParallelLayout& c = r.config;
  std::string s = "t=" + std::to_string(c.tensor);
  if (c.context > 1) s += " c=" + std::to_string(c.context);
  s += " p=" + std::to_string(c.pipeline) + " d=" + std::to_string(c.data);
  if (c.expert > 1) s += " e=" + std::to_string(c.expert);
  s += " v=" + std::to_string(c.virtual_stages) + " b=" + std::to_string(c.micro_batch_size) + " " +
       to_string(c.schedule) + ", recompute " + to_string(c.recompute) +
       (c.sequence_parallel ? ", sp" : "") + (c.distributed_optimizer ? ", ZeRO-1" : "") + ": " +
       seconds_text(r.time.iteration_s) + " per iteration, " + bytes_text(r.peak_memory) +
       " on the fullest GPU";
  return s;
}

std::string yes_no(bool b) {
  return b ? "true" : "false";
}

}  // namespace

std::vector<std::string> bottom_line(const PlanRequest& req, int max_extra_nodes) {
  PlanRequest q = req;
  q.top_k = 1;
  if (!search_plans(q).plans.empty()) return {};
  std::vector<std::string> lines;
  // Each pin released alone, the ones that change memory or time least first.
  using Pins = PinnedLayout;
  struct Release {
    const char* name;
    std::function<bool(const Pins&)> pinned;
    std::function<void(Pins&)> release;
    std::function<std::string(const Pins&)> pin_value;
    std::function<std::string(const ParallelLayout&)> value;
  };
  auto num = [](int x) { return std::to_string(x); };
  const std::vector<Release> releases = {
      {"recompute", [](const Pins& p) { return p.recompute.has_value(); },
       [](Pins& p) { p.recompute.reset(); },
       [](const Pins& p) { return std::string(to_string(*p.recompute)); },
       [](const ParallelLayout& c) { return std::string(to_string(c.recompute)); }},
      {"micro_batch_size", [](const Pins& p) { return p.micro_batch_size.has_value(); },
       [](Pins& p) { p.micro_batch_size.reset(); },
       [num](const Pins& p) { return num(*p.micro_batch_size); },
       [num](const ParallelLayout& c) { return num(c.micro_batch_size); }},
      {"distributed_optimizer", [](const Pins& p) { return p.distributed_optimizer.has_value(); },
       [](Pins& p) { p.distributed_optimizer.reset(); },
       [](const Pins& p) { return yes_no(*p.distributed_optimizer); },
       [](const ParallelLayout& c) { return yes_no(c.distributed_optimizer); }},
      {"sequence_parallel", [](const Pins& p) { return p.sequence_parallel.has_value(); },
       [](Pins& p) { p.sequence_parallel.reset(); },
       [](const Pins& p) { return yes_no(*p.sequence_parallel); },
       [](const ParallelLayout& c) { return yes_no(c.sequence_parallel); }},
      {"virtual_stages", [](const Pins& p) { return p.virtual_stages.has_value(); },
       [](Pins& p) { p.virtual_stages.reset(); },
       [num](const Pins& p) { return num(*p.virtual_stages); },
       [num](const ParallelLayout& c) { return num(c.virtual_stages); }},
      {"schedule", [](const Pins& p) { return p.schedule.has_value(); },
       [](Pins& p) { p.schedule.reset(); },
       [](const Pins& p) { return std::string(to_string(*p.schedule)); },
       [](const ParallelLayout& c) { return std::string(to_string(c.schedule)); }},
      {"layers_per_stage", [](const Pins& p) { return p.layers_per_piece.has_value(); },
       [](Pins& p) { p.layers_per_piece.reset(); },
       [](const Pins&) { return std::string("split"); },
       [](const ParallelLayout&) { return std::string("searched"); }},
      {"context", [](const Pins& p) { return p.context.has_value(); },
       [](Pins& p) { p.context.reset(); }, [num](const Pins& p) { return num(*p.context); },
       [num](const ParallelLayout& c) { return num(c.context); }},
      {"expert", [](const Pins& p) { return p.expert.has_value(); },
       [](Pins& p) { p.expert.reset(); }, [num](const Pins& p) { return num(*p.expert); },
       [num](const ParallelLayout& c) { return num(c.expert); }},
      {"tensor", [](const Pins& p) { return p.tensor.has_value(); },
       [](Pins& p) { p.tensor.reset(); }, [num](const Pins& p) { return num(*p.tensor); },
       [num](const ParallelLayout& c) { return num(c.tensor); }},
      {"pipeline", [](const Pins& p) { return p.pipeline.has_value(); },
       [](Pins& p) { p.pipeline.reset(); }, [num](const Pins& p) { return num(*p.pipeline); },
       [num](const ParallelLayout& c) { return num(c.pipeline); }},
      {"data", [](const Pins& p) { return p.data.has_value(); }, [](Pins& p) { p.data.reset(); },
       [num](const Pins& p) { return num(*p.data); },
       [num](const ParallelLayout& c) { return num(c.data); }},
  };
  bool pinned = false;
  for (const Release& r : releases) {
    if (!r.pinned(req.fixes)) continue;
    pinned = true;
    PlanRequest relaxed = q;
    r.release(relaxed.fixes);
    const PlanOutput o = search_plans(relaxed);
    if (o.plans.empty()) continue;
    lines.push_back("fits with " + std::string(r.name) + " " + r.value(o.plans.front().config) +
                    " instead of the pinned " + r.pin_value(req.fixes) + ": " +
                    plan_summary(o.plans.front()));
  }
  // More nodes of the same cluster, the pins kept: the fewest that fit, every count between
  // tried.
  const int nodes = req.cluster.nodes;
  for (int n = nodes + 1; n <= nodes + max_extra_nodes; ++n) {
    PlanRequest more = q;
    more.cluster.nodes = n;
    const PlanOutput o = search_plans(more);
    if (o.plans.empty()) continue;
    lines.push_back(
        "needs at least " + std::to_string(n) + " nodes of " + req.cluster.name +
        (pinned ? " with the pins kept" : "") + " (" + std::to_string(req.cluster.gpus_per_node) +
        " GPUs each; nothing fits on " + std::to_string(nodes) +
        (n - 1 > nodes ? "–" + std::to_string(n - 1) : std::string()) +
        "): " + plan_summary(o.plans.front()) + " (strata plan --nodes " + std::to_string(n) + ")");
    return lines;
  }
  lines.push_back("nothing fits on " + std::to_string(nodes) + "–" +
                  std::to_string(nodes + max_extra_nodes) + " nodes of " + req.cluster.name +
                  (pinned ? " with the pins kept" : ""));
  return lines;
}

json plan_config_json(const ParallelLayout& c) {
  json lps = json::array();
  for (int s = 0; s < c.pipeline; ++s) {
    json row = json::array();
    for (int ch = 0; ch < c.virtual_stages; ++ch) {
      const size_t k = static_cast<size_t>(ch * c.pipeline + s);
      if (k < c.layers_per_piece.size()) row.push_back(c.layers_per_piece[k]);
    }
    lps.push_back(row);
  }
  return {{"tensor", c.tensor},
          {"context", c.context},
          {"expert", c.expert},
          {"pipeline", c.pipeline},
          {"data", c.data},
          {"virtual_stages", c.virtual_stages},
          {"micro_batch_size", c.micro_batch_size},
          {"num_microbatches", c.num_microbatches},
          {"schedule", to_string(c.schedule)},
          {"recompute", to_string(c.recompute)},
          {"sequence_parallel", c.sequence_parallel},
          {"distributed_optimizer", c.distributed_optimizer},
          {"layers_per_stage", lps}};
}

json plan_result_json(const PlanResult& r) {
  json j = plan_config_json(r.config);
  j["placement"] = r.placement;
  const MemoryBreakdown& m = r.memory[static_cast<size_t>(r.peak_stage)];
  json stages = json::array();
  for (const MemoryBreakdown& s : r.memory) {
    stages.push_back({{"parameters", s.parameters},
                      {"gradients", s.gradients},
                      {"optimizer", s.optimizer},
                      {"activations", s.activations},
                      {"buffers", s.buffers},
                      {"total", s.total()}});
  }
  j["predicted"] = {{"iteration_s", r.time.iteration_s},
                    {"tflops_per_gpu", r.tflops_per_gpu},
                    {"mfu", r.mfu},
                    {"bubble_fraction", r.time.bubble_fraction},
                    {"dp_exposed_s", r.time.dp_exposed_s},
                    {"tp_exposed_s", r.time.tp_exposed_s},
                    {"ep_exposed_s", r.time.ep_exposed_s},
                    {"cp_exposed_s", r.time.cp_exposed_s},
                    {"optimizer_s", r.time.optimizer_s},
                    {"peak_stage", r.peak_stage},
                    {"memory_bytes_per_gpu",
                     {{"parameters", m.parameters},
                      {"gradients", m.gradients},
                      {"optimizer", m.optimizer},
                      {"activations", m.activations},
                      {"buffers", m.buffers},
                      {"total", m.total()}}},
                    {"memory_bytes_per_stage", stages}};
  return j;
}

json plan_output_json(const PlanRequest& req, const PlanOutput& out) {
  const ModelDescription& m = *req.model;
  json plans = json::array();
  for (const PlanResult& r : out.plans) plans.push_back(plan_result_json(r));
  json rejected = json::array();
  for (const Rejection& r : out.rejected) {
    json x = {{"config", r.config}, {"reason", r.reason}};
    if (!r.group.empty()) x["group"] = r.group;
    rejected.push_back(std::move(x));
  }
  json model = m.shape_json();
  model["arch"] = m.arch();
  model["parameters"] = m.parameters();
  return {{"model", model},
          {"cluster", cluster_to_json(req.cluster)},
          {"global_batch_size", req.global_batch_size},
          {"precision", req.precision},
          {"plans", plans},
          {"rejected", rejected},
          {"bottom_line", out.bottom_line}};
}

}  // namespace strata
