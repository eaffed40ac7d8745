// The planner's device and runtime descriptions (partitioner/efficiency.h, runtime_model.h):
// the GEMM curve and its correction against closed forms, the fit against the presets'
// parameters, attention interpolation, the cluster JSON's checks, Strata's runtime as
// runtime/base/behaviour.h states it priced as it is (blocking tensor parallelism, f32 gradients on
// the wire, the ZeRO gather after the step), and `strata profile --cluster-out` writing a
// cluster the planner reads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "launch/commands/plan.h"
#include "launch/commands/profile.h"
#include "launch/config/config_parse.h"
#include "models/registry.h"
#include "partitioner/planner.h"
#include "runtime/base/behaviour.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

// t = fixed + max(2MNK / flops, e·(MK + KN + MN) / bandwidth), by hand, and the batched form.
TEST(PlannerEfficiency, GemmCurveIsItsClosedForm) {
  GemmCurve c;
  c.flops = 100e12;
  c.fixed_s = 5e-6;
  c.bandwidth = 1e12;
  // Compute bound: 2·4096³ / 1e14 = 1.374 ms.
  EXPECT_NEAR(c.seconds(4096, 4096, 4096, 2), 5e-6 + 2.0 * 4096 * 4096 * 4096 / 100e12, 1e-12);
  // Memory bound (K = 16): 2·(4096·16 + 16·4096 + 4096²) / 1e12.
  EXPECT_NEAR(c.seconds(4096, 4096, 16, 2), 5e-6 + 2.0 * (2 * 4096 * 16 + 4096.0 * 4096) / 1e12,
              1e-12);
  // A batch of 8 in one kernel: one fixed time; half the compute rate: twice the compute.
  EXPECT_NEAR(c.seconds(1024, 1024, 1024, 2, 8, 0.5), 5e-6 + 8 * 2.0 * 1024 * 1024 * 1024 / 50e12,
              1e-12);
}

// Measured points pull the curve toward them near their shape and not far from it.
TEST(PlannerEfficiency, PointsCorrectTheCurveNearby) {
  GemmCurve c;
  c.flops = 100e12;
  c.fixed_s = 0;
  c.bandwidth = 1e15;
  c.points.push_back({1024, 1024, 1024, 50e12});  // half the curve's rate there
  const double curve = c.curve_seconds(1024, 1024, 1024, 2);
  // At the point: the measured time, up to the prior's weight (1 / (1 + 0.05)).
  EXPECT_NEAR(c.seconds(1024, 1024, 1024, 2) / curve, std::pow(2.0, 1 / 1.05), 1e-9);
  // Eight octaves away in every dimension: the curve alone.
  EXPECT_NEAR(c.seconds(262144, 262144, 4, 2) / c.curve_seconds(262144, 262144, 4, 2), 1.0, 1e-9);
}

// The presets' GEMM parameters are the least-squares fit of their own points
// (configs/clusters/efficiency_sources.py fits them with the same objective).
TEST(PlannerEfficiency, PresetCurvesAreTheFitOfTheirPoints) {
  const Cluster h100 = load_cluster("dgx-h100", configs_dir());
  ASSERT_TRUE(h100.efficiency_measured);
  const GemmCurve& g = h100.efficiency.gemm.at("bf16");
  ASSERT_GE(g.points.size(), 100u);
  const GemmCurve f = fit_gemm_curve(g.points, 2);
  EXPECT_NEAR(f.flops / g.flops, 1.0, 0.01);
  EXPECT_NEAR(f.fixed_s / g.fixed_s, 1.0, 0.02);
  EXPECT_NEAR(f.bandwidth / g.bandwidth, 1.0, 0.02);
  // Different GPUs, different curves: no constant of one reused on the other.
  const Cluster a100 = load_cluster("dgx-a100-80gb", configs_dir());
  EXPECT_NE(a100.efficiency.gemm.at("bf16").flops, g.flops);
  EXPECT_NE(a100.efficiency.sustained, h100.efficiency.sustained);
}

// Attention throughput: the table's entries where it has them, log-linear between, held at the
// edges.
TEST(PlannerEfficiency, AttentionTableInterpolates) {
  AttentionTable t;
  t.forward = {{1024, 64, 100}, {4096, 64, 400}, {1024, 128, 200}, {4096, 128, 800}};
  t.backward = t.forward;
  EXPECT_DOUBLE_EQ(t.flops(1024, 64, false), 100);
  EXPECT_NEAR(t.flops(2048, 64, false), 200, 1e-9);  // midway in log seq: geometric mean
  EXPECT_NEAR(t.flops(2048, 90.50966799, true), 282.84271247, 1e-6);  // and in log head size
  EXPECT_DOUBLE_EQ(t.flops(65536, 64, false), 400);                   // held at the edge
  EXPECT_DOUBLE_EQ(t.flops(512, 256, false), 200);
}

TEST(PlannerEfficiency, BadEfficiencyJsonNamesThePath) {
  nlohmann::json j = cluster_to_json(load_cluster("dgx-h100", configs_dir()));
  ASSERT_TRUE(j.contains("efficiency"));
  // Round trip: what cluster_to_json writes, cluster_from_json reads back the same.
  EXPECT_EQ(cluster_to_json(cluster_from_json(j, "c.json")), j);
  nlohmann::json bad = j;
  bad["efficiency"]["gemm"]["bf16"]["flops"] = -1;
  try {
    cluster_from_json(bad, "c.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "efficiency.gemm.bf16.flops");
  }
  bad = j;
  bad["efficiency"]["attention"]["bf16"]["forward"][0] = {4096, 128};
  try {
    cluster_from_json(bad, "c.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "efficiency.attention.bf16.forward[0]");
  }
  bad = j;
  bad["efficiency"]["sustained"] = 1.5;
  try {
    cluster_from_json(bad, "c.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "efficiency.sustained");
  }
}

// Strata's runtime as runtime/base/behaviour.h states it.
TEST(PlannerRuntime, StrataRuntimeIsWhatBehaviourSays) {
  const RuntimeModel gpu = strata_runtime(false, "bf16", 25);
  const RuntimeModel cpu = strata_runtime(true, "fp32", 25);
  EXPECT_EQ(gpu.tp_overlap, behaviour::kTensorParallelOverlap);
  EXPECT_EQ(gpu.dp_overlap, behaviour::kReduceBucketsDuringBackward);
  EXPECT_EQ(gpu.grad_wire_bytes, behaviour::kGradientWireBytes);
  EXPECT_EQ(gpu.param_wire_bytes, behaviour::kParamGatherWireBytes);
  EXPECT_EQ(gpu.param_gather_overlap, behaviour::kGatherParamsDuringForward);
  EXPECT_EQ(gpu.collectives_progress_alone, behaviour::kDeviceCollectivesProgressAlone);
  EXPECT_EQ(cpu.collectives_progress_alone, behaviour::kHostCollectivesProgressAlone);
  EXPECT_EQ(gpu.p2p_both_ends, behaviour::kDeviceGroupsWaitForSends);
  EXPECT_EQ(cpu.p2p_both_ends, behaviour::kHostSendsBlock);
  EXPECT_EQ(gpu.step_bytes_per_param, behaviour::kStepBytesPerParamBf16);
  EXPECT_EQ(cpu.step_bytes_per_param, behaviour::kStepBytesPerParamF32);
  EXPECT_DOUBLE_EQ(gpu.bucket_bytes, 25.0 * 1024 * 1024);
}

// Tensor-parallel collectives are blocking in Strata: the exposed time per layer is the whole
// ring time of its four all-reduces (two forward, two backward) of b·s·h bf16 elements.
TEST(PlannerRuntime, TensorParallelCollectivesArePricedBlocking) {
  const Config cfg = load_config("", {"model.preset=gpt3-1.3b"});
  const std::unique_ptr<ModelDescription> m = describe_model(cfg.model);
  const Cluster cl = load_cluster("dgx-h100", configs_dir());
  ParallelLayout c;
  c.tensor = 8;
  c.data = 1;
  c.micro_batch_size = 2;
  const CostContext ctx{m.get(), &cl, "bf16", nullptr, strata_runtime(false, "bf16")};
  const LayerTimes lt = layer_times(ctx, c);
  const double bytes = 2.0 * 2 * 2048 * 2048, t = 8;
  const double ring =
      2 * (t - 1) / t * bytes / (cl.intra_node.bandwidth * cl.intra_node.efficiency) +
      2 * (t - 1) * cl.intra_node.latency_s;
  EXPECT_NEAR(lt.tp_exposed_per_layer, 4 * ring, 1e-12);
  // Hidden behind the GEMMs by a runtime that pipelines them: less exposed.
  RuntimeModel overlapped = ctx.runtime;
  overlapped.tp_overlap = true;
  const CostContext ctx2{m.get(), &cl, "bf16", nullptr, overlapped};
  EXPECT_LT(layer_times(ctx2, c).tp_exposed_per_layer, 0.5 * lt.tp_exposed_per_layer);
}

// The data-parallel reduction moves f32 gradients and, with ZeRO-1, f32 parameters, and Strata
// waits for the gather after the step; on the CPU (MPI) the reduction is paid at ReduceGrads.
TEST(PlannerRuntime, DataParallelTrafficAndWhereItIsPaid) {
  const RuntimeModel rt = strata_runtime(false, "bf16");
  const Link l{100e9, 0, 1.0};
  const DataParallelTimes ar = data_parallel_times(rt, 1e9, 4, false, l);
  EXPECT_NEAR(ar.reduce, 2 * 3.0 / 4 * 4 * 1e9 / 100e9, 1e-12);
  EXPECT_EQ(ar.gather, 0);
  const DataParallelTimes zero = data_parallel_times(rt, 1e9, 4, true, l);
  EXPECT_NEAR(zero.reduce, 3.0 / 4 * 4 * 1e9 / 100e9, 1e-12);
  EXPECT_NEAR(zero.gather, 3.0 / 4 * 4 * 1e9 / 100e9, 1e-12);

  // A plan: the gather after the step is exposed whole (Strata), hidden in part by a runtime
  // that overlaps it with the next forward.
  const Config cfg = load_config("", {"model.preset=gpt3-1.3b"});
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.cluster = load_cluster("dgx-h100", configs_dir());
  req.cluster.nodes = 2;
  req.global_batch_size = 64;
  ParallelLayout c;
  c.tensor = 1;
  c.pipeline = 1;
  c.data = 16;
  c.micro_batch_size = 4;
  c.distributed_optimizer = true;
  const PlanResult strata = evaluate_plan(req, c);
  RuntimeModel hidden = runtime_for(req);
  hidden.param_gather_overlap = true;
  req.runtime = hidden;
  const PlanResult overlapped = evaluate_plan(req, c);
  EXPECT_LT(overlapped.time.iteration_s, strata.time.iteration_s);
  EXPECT_LT(overlapped.time.dp_exposed_s, strata.time.dp_exposed_s);
}

// strata profile --cluster-out on the CPU writes a cluster whose curves the planner reads.
TEST(PlannerProfileCluster, CpuProfileWritesALoadableCluster) {
  const std::string cfg_path = ::testing::TempDir() + "/profile_cfg.json";
  std::ofstream(cfg_path) << R"({"model": {"preset": "tiny", "num_layers": 2, "hidden_size": 64,
      "num_heads": 2, "ffn_hidden_size": 256, "seq_len": 32, "vocab_size": 64},
      "train": {"micro_batch_size": 2, "global_batch_size": 4, "threads": 1}, "device": "cpu"})";
  const std::string out = ::testing::TempDir() + "/cpu-profiled.json";
  ::testing::internal::CaptureStdout();
  ASSERT_EQ(cmd_profile({"--config", cfg_path, "--cluster-out", out, "--repeat", "1"}), 0);
  ::testing::internal::GetCapturedStdout();
  const Cluster c = load_cluster(out, configs_dir());
  EXPECT_TRUE(c.cpu);
  EXPECT_TRUE(c.efficiency_measured);
  const GemmCurve* g = c.efficiency.gemm_for("fp32");
  ASSERT_NE(g, nullptr);
  EXPECT_FALSE(g->generic);
  EXPECT_GT(g->flops, 0);
  EXPECT_GE(g->points.size(), 20u);
  ASSERT_NE(c.efficiency.attention_for("fp32"), nullptr);
  EXPECT_GT(c.efficiency.memory_bandwidth, 0);
  EXPECT_GT(c.efficiency.optimizer_rate(), 0);
  // The planner plans on it.
  ::testing::internal::CaptureStdout();
  const int status = cmd_plan({"--model", cfg_path, "--cluster", out, "--precision", "fp32",
                               "--global-batch-size", "4", "--top", "1"});
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(status, 0);
  EXPECT_NE(printed.find("iter_s"), std::string::npos) << printed;
}

}  // namespace
}  // namespace strata
