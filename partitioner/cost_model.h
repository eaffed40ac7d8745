// cost_model.h — predicted time of one training iteration of a plan (docs/planner.md).
//
// Three inputs, each describing one thing: the model's work per micro-batch and part
// (models/description.h: GEMM shapes, attention shape and FLOPs, elementwise passes, logits,
// tensor-group collectives), the device's measured efficiency (efficiency.h, carried by the
// cluster: GEMM time by shape, attention throughput by sequence and head size, memory-bound
// bandwidth, kernel gaps, the sustained share of single-kernel throughput) and the runtime's
// behaviour (runtime_model.h: what it overlaps, what its kernels move). Per transformer layer
// and micro-batch on one rank:
//   GEMMs      GemmCurve::seconds of each (M, N, K), the backward's input and weight
//              gradients as (M, K, N) and (N, K, M);
//   attention  fused: its causal FLOPs at the device's attention throughput for (seq, head
//              size); unfused: batched Q·Kᵀ and P·V GEMMs on the GEMM curve plus the softmax
//              (and dropout) passes over the scores at memory bandwidth;
//   elementwise the model's elementwise and f32 passes (the runtime's loss bytes per logit
//              where it counts its own) at memory bandwidth; the kernel gap per kernel;
//   TP         ring collectives over NVLink at the link's efficiency, blocking or pipelined
//              with the GEMMs as the runtime does;
//   EP         a mixture's all-to-alls over its expert group (e > 1), blocking: (e−1)/e of the
//              bytes a rank sends over the group's link (NVLink when the group lies in a node,
//              else the node's NICs) plus a latency per peer;
//   CP         context parallelism (c > 1): a rank's share of every part is 1/c of the model's
//              (context_share, memory_model.h); the ring attention's c steps per layer each take
//              the longer of the step's block and its key/value transfer on the context group's
//              link (ring_attention_times), forward and backward, and again in the backward with
//              selective or full recompute;
// or, with a measured profile (profile JSON), the measured layer times.
// Per stage: its layers' times (each kind of layer priced once: Qwen3-MoE's dense layers apart
// from its mixtures) + the embedding (first piece) and the head (last piece).
// Pipeline: the schedule is simulated (schedules/simulator.h) with these per-stage, per-chunk
// durations; a transfer of b·s·h/t elements costs the receiver (or both ends) its time. Data
// parallel: each stage's gradient buckets reduce as the runtime starts them (during the last
// micro-batch's backward, or at ReduceGrads), one after another on the stage's link; what is
// not done when the stage reaches ReduceGrads is exposed there. With expert parallelism the
// experts' gradients are summed over the expert-data-parallel group (d/e ranks, on its own
// link), the rest over the data-parallel group (d·c ranks with context parallelism). The
// distributed optimizer's parameter all-gather after the step, or behind the next forward. The
// optimizer step: the runtime's bytes per parameter at the device's optimizer bandwidth.
//
// Thread-safety: pure functions, but for the GemmMemo a context may carry (one thread's).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "partitioner/cluster.h"
#include "partitioner/memory_model.h"
#include "partitioner/runtime_model.h"
#include "schedules/simulator.h"

namespace strata {

// A measured profile (strata profile): per-layer times on one device for one micro-batch
// size, scaled linearly in b to other sizes. JSON:
//   {"device": "...", "precision": "fp32", "seq_len": 64, "hidden_size": 64,
//    "entries": [{"micro_batch_size": 1, "tensor": 1, "layer_forward_s": ..,
//                 "layer_backward_s": .., "embedding_forward_s": .., "embedding_backward_s": ..,
//                 "head_forward_s": .., "head_backward_s": .., "optimizer_s_per_param": ..,
//                 "attention_forward_s": ..}]}
// (attention_forward_s, optional: the attention core's forward alone, what selective
// recompute runs again in the backward pass; full recompute adds layer_forward_s.)
// `strata profile` (launch/commands/profile.h) writes it.
struct ProfileEntry {
  int micro_batch_size = 1;
  int tensor = 1;
  double layer_forward_s = 0, layer_backward_s = 0;
  double embedding_forward_s = 0, embedding_backward_s = 0;
  double head_forward_s = 0, head_backward_s = 0;
  double optimizer_s_per_param = 0;
  double attention_forward_s = 0;  // optional; 0: selective recompute costs nothing extra
};
struct Profile {
  std::string device;
  std::string precision;
  int seq_len = 0;
  int hidden_size = 0;
  std::vector<ProfileEntry> entries;
  bool empty() const { return entries.empty(); }
};
Profile profile_from_json(const nlohmann::json& j, const std::string& file);
nlohmann::json profile_to_json(const Profile& p);
Profile load_profile(const std::string& path);
// A profile times one model shape: InputError(file, "seq_len" / "hidden_size" / "precision")
// when it was measured for another sequence length, hidden size or precision than `m` and
// `precision` (0 or "" in the profile: not recorded, accepted).
void check_profile_matches(const Profile& p, const ModelDescription& m,
                           const std::string& precision, const std::string& file);

// Times (seconds) of the pieces of one micro-batch on one rank.
struct LayerTimes {
  double layer_fwd = 0, layer_bwd = 0;               // one transformer layer (recompute included)
  double layer_bwd_input = 0, layer_bwd_weight = 0;  // zero-bubble split of layer_bwd
  double emb_fwd = 0, emb_bwd = 0;                   // the embedding (first piece)
  double head_fwd = 0, head_bwd = 0;                 // final norm, head, loss (last piece)
  double tp_exposed_per_layer = 0;                   // of layer_fwd + layer_bwd: TP not hidden
  double ep_exposed_per_layer = 0;                   // of layer_fwd + layer_bwd: the all-to-alls
  double cp_exposed_per_layer = 0;  // of layer_fwd + layer_bwd: the ring's transfers not hidden
  double p2p = 0;                   // one activation transfer between stages
  // Of layer_fwd and of layer_bwd_input: the exposed tensor-parallel communication and the
  // expert-parallel all-to-alls (for the timeline's picture).
  double tp_fwd = 0, tp_bwd = 0;
  double ep_fwd = 0, ep_bwd = 0;
  double cp_fwd = 0, cp_bwd = 0;  // the ring attention's exposed transfers
};

// GEMM times already priced, by (M, N, K, batch): a search prices the same shapes for many
// layouts, and a curve with many measured points is dearer to evaluate than to look up. One
// memo serves one cluster and precision, from one thread.
struct GemmMemo {
  std::map<std::array<double, 4>, double> seconds;
};

struct CostContext {
  const ModelDescription* model = nullptr;
  const Cluster* cluster = nullptr;  // its `efficiency` prices the compute
  std::string precision = "bf16";
  const Profile* profile = nullptr;  // null or empty: the analytical model
  RuntimeModel runtime;              // the runtime the plan is for
  GemmMemo* memo = nullptr;          // optional (search_plans keeps one per search)
};

// The times of one layer of kind `kind` (ModelDescription::layer_kind; a model of one kind has
// only 0) with the embedding's, the head's and a transfer's. With a measured profile, which times
// the model's first layer, another kind's are the measured times scaled by the two kinds'
// analytical compute.
LayerTimes layer_times(const CostContext& ctx, const ParallelLayout& c, int kind = 0);
// [kind] layer_times of every kind of layer of the model.
std::vector<LayerTimes> kind_times(const CostContext& ctx, const ParallelLayout& c);

struct IterationTime {
  double iteration_s = 0;
  double pipeline_s = 0;  // the simulated schedule (forward, backward, bubble)
  double bubble_fraction = 0;
  double dp_exposed_s = 0;  // gradient reduction (and ZeRO's parameter gather) not hidden
  double optimizer_s = 0;
  double tp_exposed_s = 0;  // summed over the stage's layers and micro-batches (inside pipeline_s)
  double ep_exposed_s = 0;  // the all-to-alls, the same way (inside pipeline_s)
  double cp_exposed_s = 0;  // the ring attention's transfers not hidden, the same way
  std::vector<double> stage_compute_s;  // [stage] busy time of one iteration
  std::vector<int> peak_inflight;       // [stage] from the simulation
  SimResult sim;                        // kept when asked for (traces)
  // [piece] of each forward and backward (input) op: the share that is communication (exposed
  // tensor-parallel collectives, transfers both ends wait for), for the timeline's picture.
  std::vector<double> comm_share_fwd, comm_share_bwd;
};

// Bytes/s a data-parallel ring of `data` ranks, each tensor group `tensor` wide, achieves per
// rank (after the link efficiency), and its per-hop latency: NVLink when the group fits in a
// node, else the NICs of the node shared by the group's members there.
Link data_parallel_link(const Cluster& cl, int tensor, int data);

// Seconds of the data-parallel reduction of `params` gradient elements over `data` ranks (an
// all-reduce, or the distributed optimizer's reduce-scatter) and of the parameter all-gather
// (0 without the distributed optimizer), on `link`.
struct DataParallelTimes {
  double reduce = 0, gather = 0;
};
DataParallelTimes data_parallel_times(const RuntimeModel& rt, double params, int data,
                                      bool distributed_optimizer, const Link& link);

// The link an all-to-all over an expert group of `expert` ranks takes, its members
// tensor · context ranks apart: NVLink when the group's tensor · context · expert consecutive
// ranks lie in one node (that span divides the GPUs per node), else the node's NICs, each GPU
// its share of them (every GPU of the node runs its own all-to-all at once).
Link expert_link(const Cluster& cl, int tensor, int context, int expert);
// Seconds of an all-to-all in which each of n ranks sends `bytes` (its own share included):
// (n−1)/n · bytes / (bandwidth · efficiency) + (n−1) · latency (one message per peer).
double all_to_all_s(double bytes, int n, const Link& link);

// The link the ring attention's transfers take, a context group being `context` ranks `tensor`
// apart: NVLink when its tensor · context consecutive ranks lie in one node (that span divides
// the GPUs per node), else the node's NICs, each GPU its share of them (every GPU of the node
// sends its block at once).
Link context_link(const Cluster& cl, int tensor, int context);

// The ring attention of one layer and micro-batch on one rank of a context group of c:
// `attn_fwd` / `attn_bwd` seconds of the rank's whole attention core (c blocks), `kv_bytes` the
// key/value block a step sends, `dkv_bytes` its gradient (backward). Forward: c steps of
// attn_fwd / c, c − 1 of them beside a key/value transfer; backward: c steps of attn_bwd / c,
// each beside the transfer of the key/value gradient the steps accumulate (c of them: c − 1
// round the ring and the last one home), the first c − 1 with the next key/value block too. A
// transfer takes bytes / (bandwidth · efficiency) plus a latency per message. With overlap a
// step takes the longer of its block and its transfer, else their sum. Returns the seconds the
// transfers add to the core: (fwd, bwd), 0 at c = 1.
struct RingTimes {
  double fwd = 0, bwd = 0;
};
RingTimes ring_attention_times(double attn_fwd, double attn_bwd, double kv_bytes, double dkv_bytes,
                               int context, const Link& link, bool overlap);

// Parameters on the busiest rank of each stage (elements), dense and expert-split (at the plan's
// t and e), for the DP and optimizer terms.
std::vector<RankParameters> stage_parameters(const ModelDescription& m, const ParallelLayout& c);
// The gradient reduction (and ZeRO's parameter gather) of a stage holding `n`: the dense
// parameters over the d·c data and context ranks (t apart: a span of t·c·d) on
// data_parallel_link, the experts' (e > 1) over the d/e
// ranks of the expert-data-parallel group (t·c·e ranks apart) on its own link, one after the
// other.
DataParallelTimes stage_reduction_times(const Cluster& cl, const RuntimeModel& rt,
                                        const ParallelLayout& c, const RankParameters& n);
// Elements of a stage's optimizer state on one rank: all of `n`, or with the distributed
// optimizer the dense parameters' 1/(d·c) and the experts' 1/(d/e).
double optimizer_shard(const ParallelLayout& c, const RankParameters& n);

// The whole prediction by simulating the schedule (keep_timeline: keep sim.timeline for a
// trace). Precondition: c is valid (sizes divide, layers_per_piece covers the model).
IterationTime iteration_time(const CostContext& ctx, const ParallelLayout& c, bool keep_timeline);

}  // namespace strata
