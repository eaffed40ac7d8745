// One source of truth for the pipeline layer split (partitioner/layer_split.h): what `strata
// train --dry-run` prints ("layers per piece 3 3 3 3", the training banner's words), what the
// planner's prediction of the config (the start-up memory check) uses, and the pieces each rank's
// model really holds in training are the same split — for even, uneven, explicit and interleaved
// layouts. The first case is the one that diverged: GPT-2 124M sizes on pipeline 4 with a global
// batch of 8, where the dry run predicted memory for [3, 4, 4, 1] while training ran [3, 3, 3, 3].
//
// Runs on 4 ranks (tensor 1, pipeline 4 or pipeline 2 × virtual 2, or tensor 2 × pipeline 2).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "mpi_test_util.h"
#include "runtime/comm/comm.h"

namespace strata {
namespace {

// The split the dry run printed: the numbers after "layers per piece" (empty when none).
std::vector<int> printed_split(const std::string& text) {
  std::vector<int> split;
  const std::string key = "layers per piece";
  const size_t at = text.find(key);
  if (at == std::string::npos) return split;
  std::istringstream line(text.substr(at + key.size(), text.find('\n', at) - at - key.size()));
  for (int n; line >> n;) split.push_back(n);
  return split;
}

// The planner's layers_per_stage ([stage][chunk]) in piece order (piece = chunk·p + stage).
std::vector<int> predicted_split(const nlohmann::json& plan, int p, int v) {
  std::vector<int> split(static_cast<size_t>(p * v), -1);
  for (int s = 0; s < p; ++s)
    for (int c = 0; c < v; ++c)
      split[static_cast<size_t>(c * p + s)] = plan.at("layers_per_stage").at(s).at(c).get<int>();
  return split;
}

std::string text_of(const std::vector<int>& split) {
  std::string s;
  for (int n : split) s += " " + std::to_string(n);
  return "[" + s + " ]";
}

TEST(LayerSplit, DryRunPredictionAndTrainingUseTheSameSplit) {
  ASSERT_EQ(world().size, 4) << "run under mpirun -np 4";
  struct Case {
    const char* name;
    std::vector<std::string> sets;
    std::vector<int> want;  // [piece] the even split, or the explicit one
  };
  const std::vector<std::string> tiny = {"model.preset=tiny", "model.vocab_size=512",
                                         "train.micro_batch_size=2", "train.global_batch_size=8"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> s = tiny;
    s.insert(s.end(), extra.begin(), extra.end());
    return s;
  };
  const std::vector<Case> cases = {
      {"gpt2-124m, pipeline 4 (the issue's example)",
       {"model.preset=gpt2-124m", "model.seq_len=64", "parallel.pipeline=4",
        "train.micro_batch_size=1", "train.global_batch_size=8"},
       {3, 3, 3, 3}},
      {"10 layers over 4 stages",
       with({"model.num_layers=10", "parallel.pipeline=4"}),
       {3, 3, 2, 2}},
      {"explicit uneven",
       with({"model.num_layers=10", "parallel.pipeline=4", "parallel.layers_per_stage=[1,4,3,2]"}),
       {1, 4, 3, 2}},
      {"interleaved, 7 layers over 2 x 2",
       with({"model.num_layers=7", "parallel.pipeline=2", "parallel.virtual_stages=2",
             "parallel.schedule=interleaved", "parallel.tensor=2"}),
       {2, 2, 2, 1}},
      {"interleaved, explicit",
       with({"model.num_layers=7", "parallel.pipeline=2", "parallel.virtual_stages=2",
             "parallel.schedule=interleaved", "parallel.tensor=2",
             "parallel.layers_per_stage=[3,1,1,2]"}),
       {3, 1, 1, 2}},
  };
  for (const Case& k : cases) {
    std::vector<std::string> sets = k.sets;
    for (const char* s : {"train.threads=1", "train.iterations=0", "train.eval_interval=0"})
      sets.push_back(s);
    const Config cfg = load_config("", sets);
    const int p = cfg.layout.pipeline, v = cfg.layout.virtual_stages;
    RunContext ctx;
    ctx.verbose = false;
    mpitest::Tally tally;

    // --dry-run (rank 0 prints) and the planner's prediction of the config (every rank).
    std::ostringstream dry;
    print_dry_run(cfg, ctx, dry);
    const std::vector<int> predicted = predicted_split(planner_prediction(cfg, 4), p, v);
    tally.add(std::string(k.name) + ": prediction " + text_of(predicted), predicted != k.want);
    if (world().rank == 0) {
      const std::vector<int> printed = printed_split(dry.str());
      tally.add(std::string(k.name) + ": dry run printed " + text_of(printed), printed != k.want);
    }

    // Training (no iteration: the model is built, its pieces are what this rank holds).
    const TrainResult r = run_training(cfg, ctx);
    tally.add(std::string(k.name) + ": training split " + text_of(r.layers_per_piece),
              r.layers_per_piece != k.want);
    int first = 0;
    std::vector<int> starts;
    for (int n : k.want) starts.push_back((first += n) - n);
    bool held_ok = static_cast<int>(r.pieces.size()) == v;
    for (int c = 0; held_ok && c < v; ++c) {
      const size_t piece = static_cast<size_t>(c * p + r.pipeline_rank);
      const ModelPiece& mp = r.pieces[static_cast<size_t>(c)];
      held_ok = mp.first_layer == starts[piece] && mp.num_layers == k.want[piece] &&
                mp.embedding == (piece == 0) && mp.head == (piece + 1 == k.want.size());
    }
    tally.add(std::string(k.name) + ": pieces held by stage " + std::to_string(r.pipeline_rank),
              !held_ok);
    if (world().rank == 0) std::printf("%s: %s\n", k.name, text_of(k.want).c_str());
    tally.expect_clean(k.name);
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  return strata::mpitest::run_all_tests(argc, argv);
}
