// planner.h — the search behind `strata plan`: every (t, c, p, d, e, v, b, schedule, recompute,
// sequence parallel, distributed optimizer) the cluster and the batch allow, each costed by
// cost_model.h and sized by memory_model.h; the best plans first, and a reason for every
// family (t, c, p, schedule) that produced none of them.
//
// Search: for each candidate a closed-form estimate (even layer split balanced for the
// embedding and head, Megatron's closed-form bubble and in-flight counts) ranks and prunes;
// the best few are then re-evaluated exactly: the layer split by dynamic programming on the
// per-layer times (first piece carries the embedding, last the head), the schedule simulated
// with those per-stage, per-chunk times, memory with the simulated in-flight counts. Plans
// over memory after that are rejected too. Tensor groups are consecutive ranks inside a node
// (docs/contracts.md's rank order); t larger than a node is refused. Context sizes c (ring
// attention, each rank S/c tokens of every sequence) are searched where 2c cuts the sequence into
// even chunks of at least 512 tokens; with c > 1 only e = 1 (they do not compose yet).
//
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "partitioner/cluster.h"
#include "partitioner/cost_model.h"
#include "partitioner/layer_split.h"
#include "partitioner/memory_model.h"

namespace strata {

struct PlanRequest {
  std::shared_ptr<const ModelDescription> model;
  std::string model_name;  // for the header: a preset's name, "custom" for a model of a file
  Cluster cluster;
  int global_batch_size = 1;
  std::string precision = "bf16";
  PinnedLayout fixes;  // pinned fields (strata plan --fix); the others are searched
  int top_k = 5;
  MemoryOptions memory;
  // The runtime the plans are for; unset: Strata's own on the cluster's device
  // (strata_runtime(cluster.cpu, precision, memory.bucket_mb)).
  std::optional<RuntimeModel> runtime;
  const Profile* profile = nullptr;
};

// req.runtime, or Strata's runtime for req's cluster, precision and buckets.
RuntimeModel runtime_for(const PlanRequest& req);

struct PlanResult {
  ParallelLayout config;
  IterationTime time;
  std::vector<MemoryBreakdown> memory;  // [stage]
  int peak_stage = 0;                   // the stage with the most memory
  double peak_memory = 0;               // bytes on it
  double tflops_per_gpu = 0;            // hardware FLOPs (recompute included)
  double mfu = 0;                       // model FLOPs / peak
  std::string placement;
};

struct Rejection {
  nlohmann::json config;  // a family (tensor, context, pipeline, schedule), a plan of the exact
                          // pass (its whole layout), or {} when the pins leave no family at all
  std::string reason;     // this family's (plan's) own reason
  // A family's reason as it shares it with the others of its group (the same text for all of
  // them, their sizes or the range of their figures filled in); "" for a plan's.
  std::string group;
};

struct PlanOutput {
  std::vector<PlanResult> plans;  // best first
  // The families grouped by reason: the sizes' reasons first, then over memory, then slower;
  // a group's families consecutive. Then (or first) the exact pass's rejected plans.
  std::vector<Rejection> rejected;
  int64_t candidates = 0;  // points of the space costed
  double search_s = 0;
  // When nothing fits: bottom_line()'s lines (filled by the caller that asks for them).
  std::vector<std::string> bottom_line;
};

// Runs the search. No plan (everything rejected) is not an error: plans is empty and
// `rejected` says why; candidates == 0 when the pins (or the batch) left nothing to cost.
PlanOutput search_plans(const PlanRequest& req);

// When nothing fits req: the smallest changes that make a plan fit, each verified by a search
// (its best plan named): each pin released alone ("fits with recompute full instead of the
// pinned none: ..."), then the fewest more nodes of the same cluster with the pins kept
// ("needs at least 3 nodes of dgx-h100: ..."), trying up to `max_extra_nodes` more; a line
// saying so when neither fits. Empty when req has a plan.
std::vector<std::string> bottom_line(const PlanRequest& req, int max_extra_nodes = 32);

// Evaluates one fully given configuration exactly (layers_per_piece empty: the DP split).
// Throws InputError("<plan>", field, ...) when the sizes do not fit together.
PlanResult evaluate_plan(const PlanRequest& req, ParallelLayout c);

// Why the sizes of c cannot work ("" when they can): divisibility, schedule limits.
std::string plan_invalid_reason(const ModelDescription& m, const Cluster& cl, int global_batch,
                                const ParallelLayout& c);
// Why c's sizes alone cannot work ("" when they can): tensor × context × pipeline × data against
// the cluster, the context, a tensor group inside a node, the heads over it, the experts, and no
// more pipeline · virtual pieces than layers. The first part of plan_invalid_reason.
std::string sizes_invalid_reason(const ModelDescription& m, const Cluster& cl,
                                 const ParallelLayout& c);
// Why c's pinned layer split does not fit its pieces ("" when it does, or none is given).
std::string split_invalid_reason(const ModelDescription& m, const ParallelLayout& c);
// Why c's context size cannot work for m ("" when it can): 2c must cut the sequence evenly
// (rank i holds chunks i and 2c−1−i), expert parallelism must be 1 beside it, and with sequence
// parallelism t must divide a context rank's S/c tokens.
std::string context_invalid_reason(const ModelDescription& m, const ParallelLayout& c);
// Why c's expert size cannot work for m ("" when it can): expert e spreads each MoE layer's
// experts over e data ranks, so it must divide both num_experts and data; a dense model takes 1.
std::string expert_invalid_reason(const ModelDescription& m, const ParallelLayout& c);

nlohmann::json plan_config_json(const ParallelLayout& c);
nlohmann::json plan_result_json(const PlanResult& r);
// The whole `strata plan --json` document (docs/contracts.md's plan format).
nlohmann::json plan_output_json(const PlanRequest& req, const PlanOutput& out);

}  // namespace strata
