// The planner's memory model against the allocator (issue 6): for small GPT configurations with
// different t, p, d, schedules, recompute, sequence parallelism and ZeRO-1, each rank's measured
// peak bytes (MemStats.total_peak, CPU fp32) are within 10% of the planner's prediction for its
// pipeline stage (predict_for_config → predicted.memory_bytes_per_stage[stage].total). Context
// parallelism at 1, 2 and 4, with tensor and sp, with pipeline and selective recompute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/plan/prediction.h"
#include "launch/train/trainer.h"
#include "mpi_test_util.h"
#include "partitioner/cluster.h"
#include "runtime/comm/comm.h"

namespace strata {
namespace {

// This machine as one node holding every rank (the CPU description of configs/clusters).
Cluster local_cluster() {
  nlohmann::json c = nlohmann::json::parse(R"({
    "name": "cpu-test", "nodes": 1, "gpus_per_node": 8, "peak_flops": {"fp32": 1e11},
    "memory_bytes": 17179869184, "hbm_bandwidth": 2e10,
    "intra_node": {"bandwidth": 1e10, "latency_s": 2e-6},
    "inter_node": {"bandwidth": 1.25e9, "latency_s": 2e-5}, "nics_per_node": 1})");
  return cluster_from_json(c, "<test cluster>");
}

TEST(MemoryModel, PredictedPeakPerStageWithinTenPercentOfMeasured) {
  const int world_size = world().size;
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.tensor=2", "parallel.pipeline=2", "parallel.virtual_stages=2",
       "parallel.schedule=interleaved"},
      {"parallel.pipeline=2", "parallel.schedule=gpipe"},
      {"parallel.pipeline=4", "parallel.schedule=1f1b", "train.recompute=full"},
      {"parallel.tensor=2", "parallel.sequence_parallel=true",
       "parallel.distributed_optimizer=true"},
      {"parallel.tensor=4", "train.recompute=selective"},
      {"parallel.pipeline=2", "parallel.schedule=zb-h1"},
      // Context parallelism: a rank's 1/c of every sequence, the ring's blocks on top (measured
      // context 1 +0.0%, context 2 +2.1%, context 4 +1.3%).
      {"parallel.context=1"},
      {"parallel.context=2"},
      {"parallel.context=4"},
      {"parallel.context=2", "parallel.tensor=2", "parallel.sequence_parallel=true"},
      {"parallel.context=2", "parallel.pipeline=2", "train.recompute=selective"},
  };
  for (const auto& layout : layouts) {
    std::vector<std::string> sets = {"model.preset=tiny",        "model.num_layers=4",
                                     "train.threads=1",          "train.iterations=2",
                                     "train.micro_batch_size=4", "train.global_batch_size=16",
                                     "train.eval_interval=0",    "log.interval=1000"};
    sets.insert(sets.end(), layout.begin(), layout.end());
    const Config cfg = load_config("", sets);
    const int tpp = cfg.layout.tensor * cfg.layout.context * cfg.layout.pipeline;
    if (world_size % tpp != 0) continue;
    RunContext ctx;
    ctx.verbose = false;
    const TrainResult r = run_training(cfg, ctx);
    const nlohmann::json plan = predict_for_config(cfg, world_size, local_cluster());
    const double predicted =
        plan.at("predicted").at("memory_bytes_per_stage").at(r.pipeline_rank).at("total");
    const double measured = static_cast<double>(r.memory.total_peak);
    const double err = (predicted - measured) / measured;
    std::string name;
    for (const auto& s : layout) name += s.substr(s.find('.') + 1) + " ";
    mpitest::Tally t;
    t.add(name, std::fabs(err) <= 0.10 ? 0 : 1);
    if (std::fabs(err) > 0.10)
      std::printf("  [rank %d] %s: predicted %.0f B, measured %.0f B (%+.1f%%)\n", world().rank,
                  name.c_str(), predicted, measured, 100 * err);
    if (world().rank == 0)
      std::printf("%s: rank 0 (stage %d) predicted %.0f B, measured %.0f B (%+.1f%%)\n",
                  name.c_str(), r.pipeline_rank, predicted, measured, 100 * err);
    t.expect_clean(name.c_str());
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  return strata::mpitest::run_all_tests(argc, argv);
}
