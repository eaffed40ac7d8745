// Planner tests: the self-description's parameter counts against the model's layout, memory
// predictions against the CPU allocator's measured peak, the search's guarantees, and the DP layer
// split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <tuple>

#include "launch/commands/plan.h"
#include "launch/config/config_parse.h"
#include "launch/config/layout_fields.h"
#include "launch/plan/plan_file.h"
#include "launch/plan/prediction.h"
#include "launch/train/trainer.h"
#include "models/registry.h"
#include "partitioner/planner.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

Cluster h100(int nodes) {
  Cluster c = load_cluster("dgx-h100", configs_dir());
  c.nodes = nodes;
  return c;
}

// The self-description's parameter counts (what the planner uses) against the layout of the
// pieces a stage really holds, per tensor rank and per pipeline piece.
TEST(PlannerMemory, ParametersMatchModelLayout) {
  for (const char* preset :
       {"tiny", "gpt2-124m", "llama-tiny", "llama-3.2-1b", "bert-tiny", "bert-large"}) {
    for (bool tie : {true, false}) {
      if (!tie && std::string(preset).rfind("bert", 0) == 0) continue;  // BERT's decoder is tied
      const Config cfg =
          load_config("", {std::string("model.preset=") + preset,
                           std::string("model.tie_embeddings=") + (tie ? "true" : "false")});
      const std::unique_ptr<ModelDescription> spec = describe_model(cfg.model);
      const int L = cfg.model.num_layers;
      int64_t real = 0;  // the whole model without vocabulary padding
      const ParamLayout whole = model_layout(cfg.model, 1, 0, false, whole_model(L));
      for (const ParamInfo& p : whole.infos())
        real += p.rows_initialised >= 0 ? p.rows_initialised * p.full_shape[1] : p.numel;
      EXPECT_EQ(spec->parameters(), real);
      for (int t : {1, 2, 4}) {
        if (!spec->tensor_split_reason(t, false).empty()) continue;  // llama-tiny: 2 kv heads
        for (int pieces : {1, 2}) {
          const std::vector<int> layers = split_layers_even(L, pieces);
          int first = 0;
          for (int k = 0; k < pieces; ++k) {
            ModelPiece pc{first, layers[static_cast<size_t>(k)], k == 0, k == pieces - 1};
            first += pc.num_layers;
            int64_t n = 0;
            const ParamLayout piece = model_layout(cfg.model, t, 0, false, {pc});
            for (const ParamInfo& p : piece.infos()) n += p.numel;
            EXPECT_EQ(piece_parameters(*spec, t, k, pieces, pc.first_layer, pc.num_layers), n)
                << preset << " tie " << tie << " t " << t << " piece " << k << "/" << pieces;
          }
        }
      }
    }
  }
}

// Predicted per-rank peak within 10% of the CPU allocator's measured peak (fp32, world 1).
TEST(PlannerMemory, PredictedPeakMatchesMeasuredOnCpu) {
  Cluster cpu = h100(1);
  struct Case {
    int micro;
    const char* recompute;
  };
  for (const char* preset : {"tiny", "llama-tiny", "bert-tiny"})
    for (const Case& k : {Case{2, "none"}, Case{4, "none"}, Case{4, "selective"}, Case{4, "full"},
                          Case{8, "full"}}) {
      const Config cfg =
          load_config("", {std::string("model.preset=") + preset, "model.num_layers=4",
                           "train.iterations=2", "train.eval_interval=0", "train.threads=1",
                           "train.micro_batch_size=" + std::to_string(k.micro),
                           "train.global_batch_size=" + std::to_string(2 * k.micro),
                           std::string("train.recompute=") + k.recompute});
      RunContext ctx;
      ctx.verbose = false;
      const TrainResult r = run_training(cfg, ctx);
      const nlohmann::json pred = predict_for_config(cfg, 1, cpu);
      const double predicted = pred["predicted"]["memory_bytes_per_gpu"]["total"].get<double>();
      const double measured = static_cast<double>(r.memory.total_peak);
      std::printf("%s b=%d recompute=%-9s predicted %.0f measured %.0f (%+.1f%%)\n", preset,
                  k.micro, k.recompute, predicted, measured, (predicted / measured - 1) * 100);
      EXPECT_NEAR(predicted / measured, 1.0, 0.10)
          << preset << " b=" << k.micro << " " << k.recompute;
    }
}

TEST(PlannerSearch, NeverReturnsAPlanOverMemory) {
  for (const auto& [preset, nodes, batch] :
       {std::tuple<const char*, int, int>{"gpt3-13b", 1, 64}, {"gpt3-175b", 64, 1536}}) {
    const Config cfg = load_config("", {std::string("model.preset=") + preset});
    PlanRequest req;
    req.model = describe_model(cfg.model);
    req.cluster = load_cluster("dgx-a100-80gb", configs_dir());
    req.cluster.nodes = nodes;
    req.global_batch_size = batch;
    req.memory.reserve_bytes = 1 << 30;
    req.top_k = 10;
    const PlanOutput out = search_plans(req);
    ASSERT_FALSE(out.plans.empty()) << preset;
    for (const PlanResult& p : out.plans) {
      for (const MemoryBreakdown& m : p.memory)
        EXPECT_LE(m.total(), req.cluster.memory_bytes) << preset;
    }
    EXPECT_FALSE(out.rejected.empty());
    for (const Rejection& r : out.rejected) EXPECT_FALSE(r.reason.empty());
  }
}

// A model far smaller than a GPU on one NVLink node: no reason to split it (tensor and
// pipeline parallelism only add communication and bubble), nothing to recompute, and the
// largest micro-batch keeps the GEMMs biggest (synchronous 1F1B, as Megatron runs it).
TEST(PlannerSearch, HandCheckableSmallCase) {
  const Config cfg = load_config("", {"model.preset=gpt2-124m"});
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.cluster = h100(1);
  req.global_batch_size = 64;
  req.fixes.schedule = ScheduleKind::kOneFOneB;
  const PlanOutput out = search_plans(req);
  ASSERT_FALSE(out.plans.empty());
  const ParallelLayout& c = out.plans.front().config;
  EXPECT_EQ(c.tensor, 1);
  EXPECT_EQ(c.pipeline, 1);
  EXPECT_EQ(c.data, 8);
  EXPECT_EQ(c.recompute, Recompute::kNone);
  EXPECT_EQ(c.micro_batch_size, 8);
}

// Any micro-batch size that divides a data rank's share of the batch is searched, not only the
// powers of two: --fix micro_batch_size=14 with 112 sequences on 8 ranks gives plans of 14; a
// size that does not divide is refused with that reason, not "no micro-batch size fits".
TEST(PlannerSearch, EveryDividingMicroBatchSize) {
  const Config cfg = load_config("", {"model.preset=gpt2-124m"});
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.cluster = h100(1);
  req.global_batch_size = 112;
  req.fixes.micro_batch_size = 14;
  PlanOutput out = search_plans(req);
  ASSERT_FALSE(out.plans.empty());
  for (const PlanResult& r : out.plans) {
    EXPECT_EQ(r.config.micro_batch_size, 14);
    EXPECT_EQ(112 % (14 * r.config.data), 0);
  }
  req.fixes.micro_batch_size = 5;
  out = search_plans(req);
  EXPECT_TRUE(out.plans.empty());
  ASSERT_FALSE(out.rejected.empty());
  const std::string why = out.rejected.front().reason;
  EXPECT_NE(why.find("micro_batch_size 5 does not divide the global batch 112"), std::string::npos)
      << why;
}

// A pinned layer split (--fix layers_per_stage) is the split both passes price; one that does not
// cut the model into p·v pieces is the reason its families have no plan.
TEST(PlannerSearch, PinnedLayerSplit) {
  const Config cfg = load_config("", {"model.preset=gpt2-124m"});
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.cluster = h100(1);
  req.global_batch_size = 64;
  req.fixes.pipeline = 2;
  req.fixes.layers_per_piece = std::vector<int>{8, 4};
  PlanOutput out = search_plans(req);
  ASSERT_FALSE(out.plans.empty());
  for (const PlanResult& r : out.plans)
    EXPECT_EQ(r.config.layers_per_piece, (std::vector<int>{8, 4}));
  req.fixes.layers_per_piece = std::vector<int>{8, 3};
  out = search_plans(req);
  EXPECT_TRUE(out.plans.empty());
  ASSERT_FALSE(out.rejected.empty());
  for (const Rejection& r : out.rejected)
    EXPECT_NE(r.reason.find("layers_per_stage has 2 pieces of 11 layers"), std::string::npos)
        << r.reason;
}

// The rejected families of a search: each (tensor, context, pipeline, schedule) once, the families
// of one reason together (their `group` the same text, consecutive).
void expect_grouped_once(const PlanOutput& out) {
  std::set<std::string> families, closed_groups;
  std::string open_group;
  for (const Rejection& r : out.rejected) {
    if (r.config.contains("micro_batch_size")) continue;  // a plan of the exact pass
    EXPECT_TRUE(families.insert(r.config.dump()).second) << "listed twice: " << r.config.dump();
    EXPECT_FALSE(r.group.empty()) << r.config.dump();
    if (r.group != open_group) {
      EXPECT_EQ(closed_groups.count(r.group), 0u) << "group split: " << r.group;
      if (!open_group.empty()) closed_groups.insert(open_group);
      open_group = r.group;
    }
  }
}

// Llama 3.1 405B (126 layers) on one DGX H100 node: nothing fits. The interleaved families with
// 4 or 8 stages are refused because 126 layers do not cut into 4·v or 8·v equal chunks (not "no
// micro-batch size fits", which they were told before), once each, grouped; the others are over
// memory. The bottom line, found by searching more nodes, is the fewest nodes that fit.
TEST(PlannerRefusals, Llama405bOnOneNodeSaysWhyAndHowManyNodes) {
  const Config cfg = load_config("", {"model.preset=llama-3.1-405b"});
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.cluster = h100(1);
  req.global_batch_size = 64;
  const PlanOutput out = search_plans(req);
  ASSERT_TRUE(out.plans.empty());
  EXPECT_GT(out.candidates, 0);
  expect_grouped_once(out);
  int chunks = 0;
  for (const Rejection& r : out.rejected) {
    EXPECT_EQ(r.reason.find("no micro-batch size"), std::string::npos) << r.reason;
    if (r.config.value("schedule", "") == "interleaved" && r.config.value("pipeline", 0) >= 4) {
      ++chunks;
      EXPECT_EQ(r.reason, "126 layers do not split into " +
                              std::to_string(r.config.value("pipeline", 0)) +
                              "·v equal chunks for any v ≥ 2 (the interleaved schedule's pieces)");
      EXPECT_EQ(r.group,
                "126 layers do not split into p·v equal chunks for any v ≥ 2 (interleaved, p in "
                "{4, 8})");
    } else if (r.config.value("schedule", "") == "interleaved") {
      EXPECT_NE(r.reason.find("over memory"), std::string::npos) << r.reason;  // p = 2: v = 3
    }
  }
  // Every (t, c, p) with p ≥ 4 on 8 GPUs: (t, c, p) = (1, 1, 4), (1, 1, 8), (1, 2, 4), (2, 1, 4).
  EXPECT_EQ(chunks, 4);
  const std::vector<std::string> bottom = bottom_line(req, 16);
  ASSERT_EQ(bottom.size(), 1u);
  EXPECT_EQ(bottom[0].rfind("needs at least ", 0), 0u) << bottom[0];
  // The count it names fits, and the one below does not (every count between was searched).
  const int n = std::stoi(bottom[0].substr(std::string("needs at least ").size()));
  EXPECT_GT(n, 1);
  EXPECT_NE(bottom[0].find(" nodes of dgx-h100 (8 GPUs each; nothing fits on 1"), std::string::npos)
      << bottom[0];
  PlanRequest at = req;
  at.cluster.nodes = n;
  EXPECT_FALSE(search_plans(at).plans.empty());
  at.cluster.nodes = n - 1;
  EXPECT_TRUE(search_plans(at).plans.empty());
}

// Pins that leave nothing to cost say which pin excluded what: a tensor size the search does
// not try, more stages than layers, sizes whose product is not the cluster's, and every field
// pinned to a layout whose batch does not split.
TEST(PlannerRefusals, PinsThatLeaveNothingToTrySayWhich) {
  const Config cfg = load_config("", {"model.preset=gpt2-124m"});
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.cluster = h100(1);
  req.global_batch_size = 64;
  auto only_reason = [&req](const std::string& expected) {
    const PlanOutput out = search_plans(req);
    EXPECT_EQ(out.candidates, 0);
    EXPECT_TRUE(out.plans.empty());
    ASSERT_EQ(out.rejected.size(), 1u);
    EXPECT_EQ(out.rejected[0].reason, expected);
  };
  req.fixes.tensor = 3;
  only_reason(
      "tensor 3 is not a size the search tries (powers of two up to a node's 8 GPUs: 1, "
      "2, 4, 8)");
  req.fixes.tensor.reset();
  req.fixes.pipeline = 13;
  only_reason("pipeline 13 is more stages than the model's 12 layers");
  req.fixes.pipeline = 3;
  only_reason("no tensor × context × pipeline × data equal to the cluster's 8 GPUs has pipeline 3");
  // Everything pinned: one family, refused for its batch.
  req.fixes = parse_layout_fixes(
      "tensor=2,pipeline=2,data=2,schedule=1f1b,virtual_stages=1,micro_batch_size=3,"
      "recompute=none,sequence_parallel=false,distributed_optimizer=false,context=1");
  only_reason(
      "micro_batch_size 3 does not divide the global batch 64 over data 2 (64 / (b · 2) "
      "must be a whole number of micro-batches)");
  // Sequence parallelism pinned without a tensor group.
  req.fixes = parse_layout_fixes("tensor=1,sequence_parallel=true");
  const PlanOutput sp = search_plans(req);
  EXPECT_EQ(sp.candidates, 0);
  expect_grouped_once(sp);
  for (const Rejection& r : sp.rejected) EXPECT_EQ(r.group, "sequence_parallel needs tensor > 1");
}

// Everything pinned to a layout that fits: its family is the plan's, nothing is rejected.
TEST(PlannerRefusals, PinnedLayoutThatFitsRejectsNothing) {
  const Config cfg = load_config("", {"model.preset=gpt2-124m"});
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.cluster = h100(1);
  req.global_batch_size = 64;
  req.fixes = parse_layout_fixes(
      "tensor=2,pipeline=2,data=2,schedule=1f1b,virtual_stages=1,micro_batch_size=4,"
      "recompute=none,sequence_parallel=false,distributed_optimizer=false,context=1");
  const PlanOutput out = search_plans(req);
  ASSERT_EQ(out.plans.size(), 1u);
  for (const Rejection& r : out.rejected)
    EXPECT_TRUE(r.config.contains("micro_batch_size")) << r.config.dump() << ": " << r.reason;
  EXPECT_TRUE(bottom_line(req).empty());
}

// Pins that make nothing fit: the bottom line names each release that fits, found by searching
// with that pin released (recompute: pinned to none b = 64 is 54 GiB over, with full it fits; a
// smaller micro-batch), then the nodes that fit with the pins kept.
TEST(PlannerRefusals, BottomLineReleasesAPin) {
  const Config cfg = load_config("", {"model.preset=gpt3-13b"});
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.cluster = h100(1);
  req.global_batch_size = 64;
  req.fixes = parse_layout_fixes("tensor=8,pipeline=1,recompute=none,micro_batch_size=64");
  const PlanOutput out = search_plans(req);
  ASSERT_TRUE(out.plans.empty());
  expect_grouped_once(out);
  const std::vector<std::string> bottom = bottom_line(req, 1);
  ASSERT_EQ(bottom.size(), 3u);
  EXPECT_EQ(bottom[0].rfind("fits with recompute full instead of the pinned none: t=8 p=1 d=1 v=1 "
                            "b=64 1f1b, recompute full",
                            0),
            0u)
      << bottom[0];
  EXPECT_EQ(bottom[1].rfind("fits with micro_batch_size ", 0), 0u) << bottom[1];
  EXPECT_NE(bottom[1].find(" instead of the pinned 64: t=8 p=1 d=1"), std::string::npos)
      << bottom[1];
  EXPECT_EQ(bottom[2].rfind("needs at least 2 nodes of dgx-h100 with the pins kept", 0), 0u)
      << bottom[2];
  // Each line's plan is real: the released search finds it.
  PlanRequest full = req;
  full.fixes.recompute = Recompute::kFull;
  ASSERT_FALSE(search_plans(full).plans.empty());
  EXPECT_EQ(search_plans(full).plans.front().config.micro_batch_size, 64);
}

TEST(PlannerSearch, TrillionParametersOn3072Gpus) {
  PlanRequest req;
  ModelConfig m;
  m.num_layers = 128;
  m.hidden_size = 25600;
  m.num_heads = 160;
  m.ffn_hidden_size = 4 * 25600;
  m.seq_len = 2048;
  m.vocab_size = 51200;
  req.model = describe_model(m);
  req.model_name = "1T";
  req.cluster = load_cluster("dgx-a100-80gb", configs_dir());
  req.cluster.nodes = 384;
  req.global_batch_size = 3072;
  req.memory.reserve_bytes = 1 << 30;
  const PlanOutput out = search_plans(req);
  std::printf("1T parameters (%.3g), 3072 GPUs: %lld configurations in %.3f s\n",
              static_cast<double>(req.model->parameters()), static_cast<long long>(out.candidates),
              out.search_s);
  // The search time is printed, not asserted (a timed test fails under load); the planner's
  // bench (bench_planner_calibration) prints the slowest search beside its figures.
  ASSERT_FALSE(out.plans.empty());
}

// Identical layers plus an embedding on the first and a head on the last piece: the DP split
// gives the end pieces fewer layers and beats the even split on the slowest piece.
TEST(PlannerSplit, DpBalancesEmbeddingAndHeadBetterThanEven) {
  const int L = 24, pieces = 4;
  const std::vector<double> cost(L, 1.0);
  const double emb = 1.5, head = 3.0;
  auto max_piece = [&](const std::vector<int>& n) {
    double mx = 0;
    for (int k = 0; k < pieces; ++k) {
      mx = std::max(
          mx, n[static_cast<size_t>(k)] * 1.0 + (k == 0 ? emb : 0) + (k == pieces - 1 ? head : 0));
    }
    return mx;
  };
  const std::vector<int> dp = split_layers_dp(cost, pieces, emb, head);
  const std::vector<int> even = split_layers_even(L, pieces);
  int sum = 0;
  for (int n : dp) sum += n;
  EXPECT_EQ(sum, L);
  EXPECT_LT(max_piece(dp), max_piece(even));
  EXPECT_LE(max_piece(dp), 7.5);  // (24 + 4.5) / 4 = 7.125 rounds up to whole layers
  // And with the real cost model: the planner's stage times for gpt3-13b with p = 4.
  const Config cfg = load_config("", {"model.preset=gpt3-13b"});
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.cluster = h100(4);
  req.global_batch_size = 128;
  ParallelLayout c;
  c.tensor = 8;
  c.pipeline = 4;
  c.data = 1;
  c.micro_batch_size = 1;
  const PlanResult balanced = evaluate_plan(req, c);
  c.layers_per_piece = split_layers_even(req.model->num_layers(), 4);
  const PlanResult naive = evaluate_plan(req, c);
  auto busiest = [](const PlanResult& r) {
    return *std::max_element(r.time.stage_compute_s.begin(), r.time.stage_compute_s.end());
  };
  EXPECT_LE(busiest(balanced), busiest(naive));
  EXPECT_LE(balanced.time.iteration_s, naive.time.iteration_s);
}

TEST(PlannerPlan, ApplyPlanSetsTheLayout) {
  const Config cfg = load_config("", {"model.preset=tiny", "train.global_batch_size=8"});
  const nlohmann::json plan = {{"plans",
                                {{{"tensor", 2},
                                  {"pipeline", 2},
                                  {"data", 1},
                                  {"virtual_stages", 1},
                                  {"micro_batch_size", 2},
                                  {"num_microbatches", 4},
                                  {"schedule", "1f1b"},
                                  {"recompute", "full"},
                                  {"sequence_parallel", true},
                                  {"distributed_optimizer", false},
                                  {"layers_per_stage", {{1}, {1}}}}}}};
  const Config out = apply_plan(cfg, plan, "plan.json");
  EXPECT_EQ(out.layout.tensor, 2);
  EXPECT_EQ(out.layout.pipeline, 2);
  EXPECT_EQ(out.layout.micro_batch_size, 2);
  EXPECT_EQ(out.train.global_batch_size, 8);
  EXPECT_EQ(out.layout.recompute, Recompute::kFull);
  nlohmann::json bad = plan;
  bad["plans"][0]["tensor"] = "two";
  try {
    apply_plan(cfg, bad, "plan.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "plan.json");
    EXPECT_EQ(e.where(), "plans[0].tensor");
  }
}

// Issue 28: a plan made for another model or another global batch was applied anyway (a
// layers_per_stage summing to 5 trained 5 layers of a 4-layer config, and a plan for 4 layers
// trained 4 of a config of 8): a plan must match the config, or is refused naming the field
// and both values.
TEST(PlannerPlan, ApplyPlanRefusesAPlanForAnotherModelOrBatch) {
  const Config cfg =
      load_config("", {"model.preset=tiny", "model.num_layers=4", "train.global_batch_size=8"});
  const nlohmann::json entry = {{"tensor", 1},
                                {"pipeline", 2},
                                {"data", 1},
                                {"virtual_stages", 1},
                                {"micro_batch_size", 2},
                                {"num_microbatches", 4},
                                {"schedule", "1f1b"},
                                {"recompute", "none"},
                                {"sequence_parallel", false},
                                {"distributed_optimizer", false},
                                {"layers_per_stage", {{2}, {2}}}};
  nlohmann::json model = {{"arch", "gpt"},    {"num_layers", 4},        {"hidden_size", 64},
                          {"num_heads", 4},   {"ffn_hidden_size", 256}, {"seq_len", 64},
                          {"vocab_size", 64}, {"tie_embeddings", true}, {"parameters", 1}};
  const nlohmann::json plan = {
      {"model", model}, {"global_batch_size", 8}, {"plans", nlohmann::json::array({entry})}};
  const Config ok = apply_plan(cfg, plan, "plan.json");
  EXPECT_EQ(ok.layout.layers_per_piece, (std::vector<int>{2, 2}));
  EXPECT_EQ(ok.train.global_batch_size, 8);

  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* where;
    std::vector<std::string> words;  // the field's values, the config's and the plan's
  };
  const Case cases[] = {
      {"layers summing to 5",
       [](nlohmann::json& p) {
         p["plans"][0]["layers_per_stage"] = {{3}, {2}};
       },
       "plans[0].layers_per_stage",
       {"model.num_layers 4", "got 5"}},
      {"a plan for 8 layers",
       [](nlohmann::json& p) { p["model"]["num_layers"] = 8; },
       "model.num_layers",
       {"model.num_layers 4", "got 8"}},
      {"another hidden size",
       [](nlohmann::json& p) { p["model"]["hidden_size"] = 128; },
       "model.hidden_size",
       {"model.hidden_size 64", "got 128"}},
      {"another global batch",
       [](nlohmann::json& p) { p["global_batch_size"] = 16; },
       "global_batch_size",
       {"train.global_batch_size 8", "got 16"}},
      {"micro-batches for another batch",
       [](nlohmann::json& p) { p["plans"][0]["num_microbatches"] = 8; },
       "plans[0].num_microbatches",
       {"2 × num_microbatches 8 × data 1", "global_batch_size 8", "got 16"}},
      {"a micro-batch size for another batch",
       [](nlohmann::json& p) { p["plans"][0]["micro_batch_size"] = 1; },
       "plans[0].num_microbatches",
       {"micro_batch_size 1", "got 4"}},
      {"a size beyond int",
       [](nlohmann::json& p) { p["plans"][0]["tensor"] = 4294967297LL; },
       "plans[0].tensor",
       {"at most 2147483647"}},
      {"chunks without the interleaved schedule",
       [](nlohmann::json& p) {
         p["plans"][0]["virtual_stages"] = 2;
         p["plans"][0]["layers_per_stage"] = {{1, 1}, {1, 1}};
       },
       "parallel.virtual_stages",
       {"needs schedule \"interleaved\""}},
  };
  for (const Case& c : cases) {
    nlohmann::json bad = plan;
    c.edit(bad);
    try {
      apply_plan(cfg, bad, "plan.json");
      ADD_FAILURE() << c.name << ": expected InputError";
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), "plan.json") << c.name;
      EXPECT_EQ(e.where(), c.where) << c.name << ": " << e.what();
      for (const std::string& w : c.words)
        EXPECT_NE(e.expected().find(w), std::string::npos) << c.name << ": " << e.what();
    }
  }
}

TEST(PlannerPlan, CommandWritesThePlanSchema) {
  const std::string out = ::testing::TempDir() + "/plan.json";
  ASSERT_EQ(cmd_plan({"--model", "gpt3-1.3b", "--cluster", "dgx-a100-80gb", "--global-batch-size",
                      "64", "--top", "2", "--json", out, "--fix", "pipeline=2"}),
            0);
  std::ifstream f(out);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_FALSE(j["plans"].empty());
  const nlohmann::json& p = j["plans"][0];
  EXPECT_EQ(p["pipeline"], 2);
  for (const char* k : {"iteration_s", "tflops_per_gpu", "mfu", "bubble_fraction"}) {
    EXPECT_TRUE(p["predicted"].contains(k)) << k;
  }
  EXPECT_TRUE(p["predicted"]["memory_bytes_per_gpu"].contains("total"));
  EXPECT_TRUE(j.contains("rejected"));
}

// --model FILE is labelled with the file (and the preset it names), not the default preset.
TEST(PlannerPlan, ModelFileIsLabelledWithTheFile) {
  const std::string file = ::testing::TempDir() + "/plan_model.json";
  std::ofstream(file) << R"({"arch": "gpt", "num_layers": 4, "hidden_size": 256, "num_heads": 4,
                            "ffn_hidden_size": 1024, "seq_len": 256, "vocab_size": 1000})";
  ::testing::internal::CaptureStdout();
  const int status = cmd_plan(
      {"--model", file, "--cluster", "dgx-a100-80gb", "--global-batch-size", "64", "--top", "1"});
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(status, 0);
  EXPECT_EQ(out.rfind("model: " + file + " (", 0), 0u) << out.substr(0, 200);
  EXPECT_EQ(out.find("gpt2-124m"), std::string::npos) << out.substr(0, 200);
}

// A profile measured for another model shape is refused with the key that differs.
TEST(PlannerProfile, MismatchedProfileNamesTheKey) {
  const Config cfg = load_config("", {"model.preset=gpt2-124m"});
  const std::unique_ptr<ModelDescription> desc = describe_model(cfg.model);
  const ModelDescription& m = *desc;
  Profile p;
  p.precision = "bf16";
  p.seq_len = m.seq_len();
  p.hidden_size = m.hidden_size();
  p.entries.push_back(ProfileEntry{});
  EXPECT_NO_THROW(check_profile_matches(p, m, "bf16", "prof.json"));
  for (const char* key : {"seq_len", "hidden_size", "precision"}) {
    Profile q = p;
    if (std::string(key) == "seq_len") q.seq_len = m.seq_len() / 2;
    if (std::string(key) == "hidden_size") q.hidden_size = m.hidden_size() * 2;
    if (std::string(key) == "precision") q.precision = "fp32";
    try {
      check_profile_matches(q, m, "bf16", "prof.json");
      ADD_FAILURE() << "expected InputError for " << key;
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), "prof.json");
      EXPECT_EQ(e.where(), key);
    }
  }
}

// A profile of one unsharded rank (t = 1) predicts a t = 2 plan as half the layer's compute
// plus the modelled exposed all-reduces; a t = 2 entry is used as measured.
TEST(PlannerProfile, UnshardedProfileIsRescaledForTensorParallelPlans) {
  const Config cfg = load_config("", {"model.preset=gpt2-124m"});
  const std::unique_ptr<ModelDescription> m = describe_model(cfg.model);
  const Cluster cl = h100(1);
  Profile prof;
  ProfileEntry e;
  e.micro_batch_size = 4;
  e.layer_forward_s = 1e-3;
  e.layer_backward_s = 2e-3;
  prof.entries.push_back(e);
  ParallelLayout c;
  c.tensor = 2;
  c.data = 4;
  c.micro_batch_size = 4;
  CostContext analytic{m.get(), &cl, "bf16", nullptr, strata_runtime(false, "bf16")};
  CostContext measured{m.get(), &cl, "bf16", &prof, strata_runtime(false, "bf16")};
  const LayerTimes a = layer_times(analytic, c);
  const LayerTimes t1 = layer_times(measured, c);
  ASSERT_GT(a.tp_exposed_per_layer, 0);
  EXPECT_DOUBLE_EQ(t1.layer_fwd + t1.layer_bwd, 1.5e-3 + a.tp_exposed_per_layer);
  prof.entries[0].tensor = 2;
  const LayerTimes t2 = layer_times(measured, c);
  EXPECT_DOUBLE_EQ(t2.layer_fwd, 1e-3);
  EXPECT_DOUBLE_EQ(t2.layer_bwd, 2e-3);
}

TEST(PlannerCluster, BadClusterJsonNamesThePath) {
  nlohmann::json j = cluster_to_json(h100(1));
  j["intra_node"]["bandwidth"] = "fast";
  try {
    cluster_from_json(j, "c.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "intra_node.bandwidth");
  }
}

}  // namespace
}  // namespace strata
