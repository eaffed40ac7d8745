// cost_model.h — predicted time of one training iteration of a plan (docs/planner.md).
//
// The work of each part comes from the model's self-description (models/description.h: its
// GEMM shapes, attention FLOPs, elementwise passes and tensor-group collectives per
// micro-batch on one tensor-parallel rank), priced per transformer layer and micro-batch as:
//   GEMMs      2·M·N·K FLOPs each against peak · eff(M, N, K), the achievable-efficiency
//              curve eff = e_max / (1 + d0/M + d0/N + d0/K) (small dimensions leave tensor
//              cores idle), floored by the HBM roofline; the backward runs each GEMM twice;
//   attention  the causal core (half of Megatron's full s² count) at the fused-attention
//              efficiencies;
//   elementwise LayerNorm, GELU, residual adds, the loss: bytes moved against HBM bandwidth;
//   TP         ring all-reduces (or all-gather + reduce-scatter with sequence parallelism) of
//              the collectives' elements (GPT: 2 of b·s·h in each direction per layer),
//              partly hidden behind the GEMMs (tp_overlap);
// or, with a measured profile (profile JSON), the measured layer times.
// Per stage: layers · layer time + the embedding (first piece) and the head (last piece).
// Pipeline: the schedule is simulated (schedules/simulator.h) with these per-stage, per-chunk
// durations and the point-to-point transfer of b·s·h/t elements (Megatron's scatter/gather)
// as latency; the bubble comes from the simulation. Data parallel: the ring reduce-scatter
// (distributed optimizer: plus the parameter all-gather) or all-reduce of the gradients,
// hidden behind the last micro-batch's backward (and first forward) as the runtime overlaps
// it; then the optimizer step, bound by HBM bandwidth.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "partitioner/cluster.h"
#include "partitioner/memory_model.h"
#include "schedules/simulator.h"

namespace strata {

// The physics constants of the model (docs/planner.md: how they were chosen). One set for
// every GPU; nothing here is per model or per row of a benchmark.
struct CostParams {
  double gemm_max_eff = 0.64;   // best GEMM efficiency against the dense peak
  double gemm_half_dim = 256;    // d0 of the efficiency curve
  double attn_fwd_eff = 0.40;   // fused attention forward, of the causal FLOPs
  double attn_bwd_eff = 0.30;   // fused attention backward
  double mem_eff = 0.80;        // achieved share of HBM bandwidth in elementwise kernels
  double net_eff = 0.80;        // achieved share of NVLink bandwidth by NCCL collectives
  double ib_eff = 0.95;         // achieved share of a NIC's line rate between nodes
  double tp_overlap = 0.90;     // share of TP communication that can hide behind GEMMs
  double dp_overlap = 1.00;     // share of the overlap window the DP reduction can use
  // GPU idle time per kernel (launch gap, synchronisation), and the kernels of one layer.
  double kernel_overhead_s = 3e-6;
  double kernels_per_layer_fwd = 14, kernels_per_layer_bwd = 28;
  // Share of a pipeline transfer that stays on the critical path of each forward/backward
  // (Megatron posts send and receive together and waits for both).
  double p2p_exposed = 1.0;
};

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
void check_profile_matches(const Profile& p, const ModelDescription& m, const std::string& precision,
                           const std::string& file);


// Times (seconds) of the pieces of one micro-batch on one rank.
struct LayerTimes {
  double layer_fwd = 0, layer_bwd = 0;        // one transformer layer (recompute included)
  double layer_bwd_input = 0, layer_bwd_weight = 0;  // zero-bubble split of layer_bwd
  double emb_fwd = 0, emb_bwd = 0;            // the embedding (first piece)
  double head_fwd = 0, head_bwd = 0;          // final norm, head, loss (last piece)
  double tp_exposed_per_layer = 0;            // of layer_fwd + layer_bwd: TP not hidden
  double p2p = 0;                             // one activation transfer between stages
};

struct CostContext {
  const ModelDescription* model = nullptr;
  const Cluster* cluster = nullptr;
  std::string precision = "bf16";
  const Profile* profile = nullptr;  // null or empty: the analytical model
  CostParams params;
};

LayerTimes layer_times(const CostContext& ctx, const PlanConfig& c);

struct IterationTime {
  double iteration_s = 0;
  double pipeline_s = 0;      // the simulated schedule (forward, backward, bubble)
  double bubble_fraction = 0;
  double dp_exposed_s = 0;    // gradient reduction not hidden
  double optimizer_s = 0;
  double tp_exposed_s = 0;    // summed over the stage's layers and micro-batches (inside pipeline_s)
  std::vector<double> stage_compute_s;  // [stage] busy time of one iteration
  std::vector<int> peak_inflight;       // [stage] from the simulation
  SimResult sim;              // kept when asked for (traces)
};

// Bytes/s a data-parallel ring of `data` ranks, each tensor group `tensor` wide, achieves per
// rank (after the link efficiency), and its per-hop latency: NVLink when the group fits in a
// node, else the NICs of the node shared by the group's members there.
Link data_parallel_link(const Cluster& cl, int tensor, int data, const CostParams& cp);

// Parameters on the busiest rank of each stage (elements), for the DP and optimizer terms.
std::vector<double> stage_parameters(const ModelDescription& m, const PlanConfig& c);

// The whole prediction by simulating the schedule (keep_timeline: keep sim.timeline for a
// trace). Precondition: c is valid (sizes divide, layers_per_piece covers the model).
IterationTime iteration_time(const CostContext& ctx, const PlanConfig& c, bool keep_timeline);

}  // namespace strata
