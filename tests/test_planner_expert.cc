// Expert parallelism in the planner (parallel.expert = e): the mixture's all-to-alls as the layer
// describes them and as the cost model prices them (against the closed form on a made-up
// cluster with round figures), the link an expert group takes, the experts' parameters and
// optimizer state per rank, their gradients' reduction over the expert-data-parallel group,
// expert 1 priced as the parent commit priced every layout, and the search over e with its
// refusals.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "launch/config/config_parse.h"
#include "launch/plan/prediction.h"
#include "launch/train/dry_run.h"
#include "launch/train/trainer.h"
#include "models/layers/moe.h"
#include "models/registry.h"
#include "partitioner/planner.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

// Two nodes of 8 GPUs with round link figures: NVLink 100 GB/s at efficiency 0.5 and 10 µs,
// NICs of 10 GB/s (one per GPU) at efficiency 1 and 20 µs.
Cluster round_cluster(int nodes = 2) {
  const nlohmann::json j = {
      {"name", "round"},
      {"nodes", nodes},
      {"gpus_per_node", 8},
      {"peak_flops", {{"bf16", 1e15}}},
      {"memory_bytes", 80e9},
      {"hbm_bandwidth", 3e12},
      {"intra_node", {{"bandwidth", 100e9}, {"latency_s", 1e-5}, {"efficiency", 0.5}}},
      {"inter_node", {{"bandwidth", 10e9}, {"latency_s", 2e-5}, {"efficiency", 1.0}}},
      {"nics_per_node", 8}};
  return cluster_from_json(j, "<test>");
}

std::unique_ptr<ModelDescription> describe(const std::vector<std::string>& sets) {
  return describe_model(load_config("", sets).model);
}

// A small mixture: 8 experts of width 128, top 2, hidden 64, seq 32, 2 layers.
std::vector<std::string> small_moe() {
  return {"model.preset=mixtral-tiny", "model.num_experts=8", "model.moe_intermediate_size=128",
          "model.seq_len=32"};
}

ParallelLayout layout(int t, int e, int d, int b) {
  ParallelLayout c;
  c.tensor = t;
  c.expert = e;
  c.data = d;
  c.micro_batch_size = b;
  c.num_microbatches = 1;
  c.layers_per_piece = {2};
  return c;
}

// The layer reports the dispatch's counts, the dispatch and the combine forward, their two
// gradients backward, each on the expert group with this rank's N·k rows of C; none at e = 1;
// the tensor group's collectives around them as before.
TEST(PlannerExpert, MixtureReportsItsAllToAlls) {
  MoeSpec m;
  m.experts = 8;
  m.top_k = 2;
  m.hidden = 96;
  const int64_t C = 64;
  const double rows_c = 2.0 * 32 * 2 * 64;  // b · S · k · C
  const PartWork one = MixtureOfExperts::work(C, m, WorkShape(2, 32, RankShape{1, false, 1}));
  EXPECT_TRUE(one.collectives_fwd.empty());
  EXPECT_TRUE(one.collectives_bwd.empty());
  const PartWork four = MixtureOfExperts::work(C, m, WorkShape(2, 32, RankShape{1, false, 4}));
  ASSERT_EQ(four.collectives_fwd.size(), 3u);
  ASSERT_EQ(four.collectives_bwd.size(), 2u);
  const double fwd[] = {8, rows_c, rows_c};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(four.collectives_fwd[i].group, CommGroup::kExpert);
    EXPECT_EQ(four.collectives_fwd[i].kind, CollectiveKind::kAllToAll);
    EXPECT_EQ(four.collectives_fwd[i].elements, fwd[i]);
  }
  for (const Collective& c : four.collectives_bwd) {
    EXPECT_EQ(c.group, CommGroup::kExpert);
    EXPECT_EQ(c.kind, CollectiveKind::kAllToAll);
    EXPECT_EQ(c.elements, rows_c);
  }
  // The GEMMs are the same at e = 1 and e = 4 (N·k rows a rank on average).
  ASSERT_EQ(one.gemms.size(), four.gemms.size());
  for (size_t i = 0; i < one.gemms.size(); ++i) EXPECT_EQ(one.gemms[i].m, four.gemms[i].m);
  // With tensor 2 and sequence parallelism each tensor rank carries the whole gathered
  // micro-batch's rows: the gather, the three all-to-alls, the reduce-scatter.
  const PartWork tp = MixtureOfExperts::work(C, m, WorkShape(2, 32, RankShape{2, true, 4}));
  ASSERT_EQ(tp.collectives_fwd.size(), 5u);
  EXPECT_EQ(tp.collectives_fwd[0].kind, CollectiveKind::kAllGather);
  EXPECT_EQ(tp.collectives_fwd[2].elements, rows_c);
  EXPECT_EQ(tp.collectives_fwd[4].kind, CollectiveKind::kReduceScatter);
}

// Intra-node when the group's t·c·e consecutive ranks lie in one node, else the NICs.
TEST(PlannerExpert, GroupLinkFollowsItsSpan) {
  const Cluster cl = round_cluster();
  EXPECT_EQ(expert_link(cl, 1, 1, 8).bandwidth, 100e9);  // 8 consecutive ranks: one node
  EXPECT_EQ(expert_link(cl, 2, 1, 4).bandwidth, 100e9);  // 4 ranks 2 apart: one node
  EXPECT_EQ(expert_link(cl, 2, 1, 8).bandwidth, 10e9);   // 8 ranks 2 apart span two nodes
  EXPECT_EQ(expert_link(cl, 2, 1, 3).bandwidth, 10e9);   // spans of 6: every other one crosses
  EXPECT_EQ(expert_link(cl, 2, 1, 8).latency_s, 2e-5);
  EXPECT_EQ(all_to_all_s(8e6, 1, cl.intra_node), 0);
  // (n−1)/n of the bytes over bandwidth · efficiency, a latency per peer.
  EXPECT_DOUBLE_EQ(all_to_all_s(8e6, 4, cl.intra_node), 0.75 * 8e6 / 50e9 + 3 * 1e-5);
}

// The layer's time grows by the all-to-alls' closed form, forward and backward, and by the
// sort into expert order and back (elementwise passes over the rows, priced in the backward at
// twice the forward's, as every elementwise pass); across nodes they take the NICs.
TEST(PlannerExpert, AllToAllTimeIsTheClosedForm) {
  const std::unique_ptr<ModelDescription> m = describe(small_moe());
  const Cluster cl = round_cluster();
  const CostContext ctx{m.get(), &cl, "bf16", nullptr, strata_runtime(false, "bf16")};
  const double rows_bytes = 4.0 * 32 * 2 * 64 * 2;  // b · S · k · C, bf16
  const double counts_bytes = 8 * 2;                // E counts (as activation elements)
  struct Case {
    int t, e;
    double rate, latency;  // the expected link
  };
  for (const Case& k : {Case{1, 4, 50e9, 1e-5}, Case{2, 8, 10e9, 2e-5}}) {
    const double share = (k.e - 1.0) / k.e, peers = k.e - 1;
    const double one = share * rows_bytes / k.rate + peers * k.latency;
    const double counts = share * counts_bytes / k.rate + peers * k.latency;
    const LayerTimes base = layer_times(ctx, layout(k.t, 1, 8, 4));
    const LayerTimes ep = layer_times(ctx, layout(k.t, k.e, 8, 4));
    EXPECT_DOUBLE_EQ(ep.ep_fwd, counts + 2 * one) << "t " << k.t << " e " << k.e;
    EXPECT_DOUBLE_EQ(ep.ep_bwd, 2 * one);
    const double sort_fwd = ep.layer_fwd - base.layer_fwd - ep.ep_fwd;
    const double sort_bwd = ep.layer_bwd - base.layer_bwd - ep.ep_bwd;
    EXPECT_GT(sort_fwd, 0);
    EXPECT_LT(sort_fwd, 1e-3 * ep.layer_fwd);
    EXPECT_NEAR(sort_bwd, 2 * sort_fwd, 1e-15);
    EXPECT_EQ(base.ep_fwd, 0);
    // Full recompute runs the forward's all-to-alls again in the backward.
    ParallelLayout full = layout(k.t, k.e, 8, 4);
    full.recompute = Recompute::kFull;
    EXPECT_DOUBLE_EQ(layer_times(ctx, full).ep_bwd, counts + 4 * one);
  }
}

// A rank holds E/e experts: the description's expert count is the layout's own (the MoE layer
// declared into a ParamLayout of expert size e), the parameters and gradients of a stage shrink
// by (1 − 1/e) of the experts, and ZeRO-1 shards the experts' state over d/e ranks.
TEST(PlannerExpert, ExpertParametersPerRank) {
  const Config cfg = load_config("", small_moe());
  const std::unique_ptr<ModelDescription> m = describe_model(cfg.model);
  const int64_t E = 8, F = 128, C = 64;
  for (int t : {1, 2}) {
    EXPECT_EQ(m->layer_expert_parameters(t, 0), E * 3 * F * C / t);
    for (int e : {1, 2, 4, 8}) {
      ParamLayout l(t, 0, e, 0);
      MoeSpec spec;
      spec.experts = static_cast<int>(E);
      spec.top_k = 2;
      spec.hidden = F;
      MixtureOfExperts moe(l, spec, {"router", "gate_up", "down"}, C, 0.02, 0.02);
      // The router (E, C) stays whole on every rank.
      EXPECT_EQ(l.numel(), E * C + m->layer_expert_parameters(t, 0) / e) << "t " << t << " e " << e;
      const RankParameters n = rank_parameters(*m, t, e, 0, 1, 0, 2);
      EXPECT_EQ(n.expert, 2 * m->layer_expert_parameters(t, 0) / e);
      EXPECT_EQ(n.total(), piece_parameters(*m, t, 0, 1, 0, 2) - n.expert * (e - 1));
    }
  }
  MemoryOptions o;
  const int64_t X = 2 * m->layer_expert_parameters(1, 0);  // both layers' experts, e = 1
  for (bool zero : {false, true}) {
    ParallelLayout one = layout(1, 1, 8, 4), four = layout(1, 4, 8, 4);
    one.distributed_optimizer = four.distributed_optimizer = zero;
    const MemoryBreakdown a = stage_memory(*m, one, o, {1}).front();
    const MemoryBreakdown b = stage_memory(*m, four, o, {1}).front();
    EXPECT_DOUBLE_EQ(a.parameters - b.parameters, 0.75 * X * 2);  // bf16 weights
    EXPECT_DOUBLE_EQ(a.gradients - b.gradients, 0.75 * X * 4);    // f32 gradients
    // Without ZeRO a rank keeps its E/e experts' state; with it, the experts' state is sharded
    // over d/e ranks: e · (E/e) / d, as much as over d without expert parallelism.
    EXPECT_DOUBLE_EQ(a.optimizer - b.optimizer, zero ? 0.0 : 0.75 * X * 12);
    EXPECT_DOUBLE_EQ(optimizer_shard(four, rank_parameters(*m, 1, 4, 0, 1, 0, 2)),
                     zero ? (rank_parameters(*m, 1, 1, 0, 1, 0, 2).dense + X) / 8.0
                          : static_cast<double>(rank_parameters(*m, 1, 4, 0, 1, 0, 2).total()));
  }
}

// The experts' gradients are summed over d/e ranks, t·c·e apart, on that group's link; the
// rest over the d data ranks; at e = 1 all over d as before.
TEST(PlannerExpert, ExpertGradientsReduceOverTheExpertDataGroup) {
  const Cluster cl = round_cluster(4);  // 32 GPUs
  const RuntimeModel rt = strata_runtime(false, "bf16");
  ParallelLayout c = layout(2, 4, 16, 1);
  const RankParameters n{1000000, 4000000};
  // Data group: 16 ranks 2 apart over 4 nodes, 4 members a node sharing 4 NICs: 40 GB/s.
  // Expert-data group: 4 ranks 8 apart, one a node: one NIC, 10 GB/s.
  const double lat = 2e-5;
  const double dense = 2 * 15.0 / 16 * 4 * 1e6 / 40e9 + 2 * 15 * lat;
  const double experts = 2 * 3.0 / 4 * 4 * 4e6 / 10e9 + 2 * 3 * lat;
  EXPECT_DOUBLE_EQ(stage_reduction_times(cl, rt, c, n).reduce, dense + experts);
  c.distributed_optimizer = true;
  const DataParallelTimes z = stage_reduction_times(cl, rt, c, n);
  EXPECT_DOUBLE_EQ(z.reduce, dense / 2 + experts / 2);
  EXPECT_DOUBLE_EQ(z.gather, dense / 2 + experts / 2);  // f32 parameters, as the gradients
  c.expert = 1;
  c.distributed_optimizer = false;
  EXPECT_EQ(stage_reduction_times(cl, rt, c, n).reduce,
            data_parallel_times(rt, 5e6, 16, false, data_parallel_link(cl, 2, 16)).reduce);
}

// Expert 1 is priced exactly as before expert parallelism was (figures of `strata plan --json`
// from the parent commit, 79bc47d, for the same layouts): a mixture and two dense models.
TEST(PlannerExpert, ExpertOnePricedAsBefore) {
  struct Case {
    const char* preset;
    const char* cluster;
    int nodes, batch;
    const char* precision;
    int t, p, d, v, b;
    ScheduleKind schedule;
    bool sp, zero;
    double iteration_s, total_bytes;
  };
  const Case cases[] = {
      {"mixtral-8x7b", "dgx-h100", 4, 256, "bf16", 8, 1, 4, 1, 2, ScheduleKind::kOneFOneB, true,
       true, 8.450144909483924, 72472041472.0},
      {"gpt3-13b", "dgx-h100", 4, 128, "bf16", 8, 4, 1, 5, 8, ScheduleKind::kInterleaved, true,
       false, 2.3187663788398503, 25505771008.0},
      {"qwen3-moe-tiny", "dgx-h100", 1, 64, "fp32", 1, 1, 8, 1, 8, ScheduleKind::kOneFOneB, false,
       true, 0.00044088257825121023, 10681280.0},
  };
  for (const Case& k : cases) {
    PlanRequest req;
    req.model = describe({std::string("model.preset=") + k.preset});
    req.cluster = load_cluster(k.cluster, configs_dir());
    req.cluster.nodes = k.nodes;
    req.global_batch_size = k.batch;
    req.precision = k.precision;
    req.memory = memory_options(k.precision, MemoryOptions{}.bucket_mb, 1,
                                std::string(k.precision) == "fp32");
    ParallelLayout c;
    c.tensor = k.t;
    c.pipeline = k.p;
    c.data = k.d;
    c.virtual_stages = k.v;
    c.micro_batch_size = k.b;
    c.schedule = k.schedule;
    c.sequence_parallel = k.sp;
    c.distributed_optimizer = k.zero;
    const PlanResult r = evaluate_plan(req, c);
    EXPECT_EQ(r.time.iteration_s, k.iteration_s) << k.preset;
    EXPECT_EQ(r.peak_memory, k.total_bytes) << k.preset;
    EXPECT_EQ(r.time.ep_exposed_s, 0) << k.preset;
  }
}

PlanRequest mixtral_request(int nodes) {
  PlanRequest req;
  req.model = describe({"model.preset=mixtral-8x7b"});
  req.cluster = load_cluster("dgx-h100", configs_dir());
  req.cluster.nodes = nodes;
  req.global_batch_size = 256;
  req.memory = memory_options("bf16", MemoryOptions{}.bucket_mb, 1, false);
  req.top_k = 32;
  return req;
}

// The search tries every e dividing both d and the experts (Mixtral: 8 experts, d = 16 at
// t = 2, p = 1 on 4 nodes), finds that only spreading them fits, and pins e when asked.
TEST(PlannerExpert, SearchTriesEveryDividingExpertSize) {
  PlanRequest req = mixtral_request(4);
  req.fixes.tensor = 2;  // d = 16: e in {1, 2, 4, 8}
  req.fixes.pipeline = 1;
  req.fixes.context = 1;  // beside c > 1 only e = 1 is searched (tests/test_planner_context.cc)
  const PlanOutput out = search_plans(req);
  ASSERT_FALSE(out.plans.empty());
  std::set<int> seen;
  for (const PlanResult& r : out.plans) {
    EXPECT_EQ(r.config.data % r.config.expert, 0);
    EXPECT_EQ(8 % r.config.expert, 0);
    seen.insert(r.config.expert);
  }
  EXPECT_GT(out.plans.front().config.expert, 1);
  EXPECT_GE(seen.size(), 2u);
  // Without expert parallelism every expert on each of t = 2 ranks of one stage does not fit.
  req.fixes.expert = 1;
  const PlanOutput one = search_plans(req);
  EXPECT_EQ(out.candidates, 4 * one.candidates);
  EXPECT_TRUE(one.plans.empty());
  req.fixes.expert = 8;
  const PlanOutput eight = search_plans(req);
  ASSERT_FALSE(eight.plans.empty());
  for (const PlanResult& r : eight.plans) EXPECT_EQ(r.config.expert, 8);
  EXPECT_EQ(plan_config_json(eight.plans.front().config)["expert"], 8);
  // A dense model searches only e = 1.
  PlanRequest dense = mixtral_request(4);
  dense.model = describe({"model.preset=gpt2-124m"});
  dense.fixes.tensor = 2;
  dense.fixes.pipeline = 1;
  for (const PlanResult& r : search_plans(dense).plans) EXPECT_EQ(r.config.expert, 1);
}

// A size that does not fit is refused naming both numbers, by the search and by evaluate_plan.
TEST(PlannerExpert, RefusalsNameTheExpertConstraint) {
  const std::unique_ptr<ModelDescription> mixtral = describe({"model.preset=mixtral-8x7b"});
  const std::unique_ptr<ModelDescription> gpt = describe({"model.preset=gpt2-124m"});
  ParallelLayout c = layout(1, 3, 6, 1);
  EXPECT_EQ(expert_invalid_reason(*mixtral, c), "expert 3 does not divide num_experts 8");
  c = layout(1, 4, 2, 1);
  EXPECT_EQ(expert_invalid_reason(*mixtral, c), "expert 4 does not divide data 2");
  c = layout(1, 2, 8, 1);
  EXPECT_EQ(expert_invalid_reason(*mixtral, c), "");
  EXPECT_EQ(expert_invalid_reason(*gpt, c),
            "expert 2 for a model without experts (a dense MLP: expert must be 1)");

  PlanRequest req = mixtral_request(4);
  req.fixes.expert = 3;
  const PlanOutput three = search_plans(req);
  EXPECT_TRUE(three.plans.empty());
  bool named = false;
  for (const Rejection& r : three.rejected)
    named = named || r.reason == "expert 3 does not divide num_experts 8";
  EXPECT_TRUE(named);

  req.fixes.expert = 4;
  req.fixes.tensor = 8;
  req.fixes.data = 2;  // pipeline 2
  const PlanOutput four = search_plans(req);
  EXPECT_TRUE(four.plans.empty());
  ASSERT_FALSE(four.rejected.empty());
  EXPECT_EQ(four.rejected.front().reason, "expert 4 does not divide data 2");

  ParallelLayout bad;
  bad.tensor = 8;
  bad.data = 4;
  bad.expert = 3;
  try {
    evaluate_plan(mixtral_request(4), bad);
    ADD_FAILURE() << "expert 3 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("expert 3 does not divide num_experts 8"),
              std::string::npos)
        << e.what();
  }
}

// The dry run says how many experts a rank holds.
TEST(PlannerExpert, DryRunPrintsExpertsPerRank) {
  const Config cfg = load_config("", {"model.preset=mixtral-tiny", "train.iterations=0",
                                      "train.eval_interval=0", "train.threads=1"});
  RunContext ctx;
  ctx.verbose = false;
  ctx.single_process = true;
  std::ostringstream os;
  print_dry_run(cfg, ctx, os);
  EXPECT_NE(os.str().find("experts per rank: 4 of 4 (expert 1)\n"), std::string::npos) << os.str();
}

}  // namespace
}  // namespace strata
