// Checkpoints across layouts (issue 8), on 4 ranks: a checkpoint saved under one (t, p, d, v,
// schedule, distributed optimizer) resumes under another and the losses continue as the
// single-process run's within 1e-5 relative (the tolerance of every layout equivalence in
// docs/contracts.md: the layouts sum in different orders); resuming under the layout that saved it
// is bit-identical to the uninterrupted run, ZeRO-1 shards included. The expected losses come from
// the single-process run every rank trains itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "mpi_test_util.h"
#include "runtime/comm/comm.h"

namespace strata {
namespace {
namespace fs = std::filesystem;

constexpr int kIters = 8, kSaveAt = 4;

std::vector<std::string> base_sets() {
  // 8 layers so that p·v = 8 pieces exist; 4 heads so t = 2 splits them.
  return {"model.preset=tiny",         "model.num_layers=8",    "model.hidden_size=32",
          "model.ffn_hidden_size=128", "model.seq_len=16",      "model.vocab_size=64",
          "train.threads=1",           "train.iterations=8",    "train.micro_batch_size=1",
          "train.global_batch_size=8", "train.eval_interval=0", "optimizer.lr=2e-2",
          "optimizer.warmup_iters=2",  "optimizer.min_lr=2e-3", "log.interval=100000"};
}

TrainResult train(std::vector<std::string> extra, bool single = false) {
  std::vector<std::string> s = base_sets();
  const std::vector<std::string> arch = mpitest::arch_sets(8);  // head size 4, 4 kv heads
  s.insert(s.end(), arch.begin(), arch.end());
  s.insert(s.end(), extra.begin(), extra.end());
  RunContext ctx;
  ctx.verbose = false;
  ctx.single_process = single;
  return run_training(load_config("", s), ctx);
}

const TrainResult& reference() {
  static const TrainResult r = train({}, true);
  return r;
}

// PipeDream-2BW's own single-process run (its updates are not the flushing schedules').
const TrainResult& reference_2bw() {
  static const TrainResult r = train({"parallel.schedule=2bw"}, true);
  return r;
}

std::string job_dir(const std::string& name) {
  return mpitest::job_dir("ckpt", name);
}

struct Layout {
  int t, p, d, v;
  std::string schedule;
  bool zero;
  std::vector<std::string> sets() const {
    return {"parallel.tensor=" + std::to_string(t), "parallel.pipeline=" + std::to_string(p),
            "parallel.virtual_stages=" + std::to_string(v), "parallel.schedule=" + schedule,
            std::string("parallel.distributed_optimizer=") + (zero ? "true" : "false")};
  }
  std::string name() const {
    return "(t" + std::to_string(t) + " p" + std::to_string(p) + " d" + std::to_string(d) +
           (v > 1 ? " v" + std::to_string(v) : "") + " " + schedule + (zero ? " zero" : "") + ")";
  }
};

// Saves at iteration 4 under `from`, resumes under `to`; exact: compare bit for bit with the
// uninterrupted `from` run (same layout), else within 1e-5 of the single process. background:
// the saves are checkpoint.async's (published once every rank has written its shard).
void reshard(const Layout& from, const Layout& to, bool exact, bool background = false) {
  if (world().size != 4) GTEST_SKIP() << "runs on 4 ranks";
  const std::string dir = job_dir("reshard");
  std::vector<std::string> a = from.sets();
  a.insert(a.end(), {"checkpoint.dir=" + dir, "checkpoint.interval=" + std::to_string(kSaveAt),
                     std::string("checkpoint.async=") + (background ? "true" : "false")});
  const TrainResult full = train(a);
  std::vector<std::string> b = to.sets();
  b.push_back("checkpoint.resume=" + dir + "/iter_" + std::to_string(kSaveAt));
  const TrainResult r = train(b);

  const TrainResult& ref = from.schedule == "2bw" ? reference_2bw() : reference();
  mpitest::Tally tally;
  int64_t bad =
      r.start_iteration != kSaveAt || r.losses.size() != static_cast<size_t>(kIters - kSaveAt);
  for (size_t i = 0; !bad && i < r.losses.size(); ++i) {
    const size_t k = static_cast<size_t>(kSaveAt) + i;
    bad += exact ? r.losses[i] != full.losses[k]
                 : !mpitest::close_rel(r.losses[i], ref.losses[k], 1e-5);
    bad += !mpitest::close_rel(full.losses[k], ref.losses[k], 1e-5);
  }
  const std::string name = from.name() + " -> " + to.name();
  tally.add(name, bad);
  if (world().rank == 0)
    std::printf(
        "%s: loss %.6f at iteration 1; final: resumed %.9f, uninterrupted %.9f, single "
        "process %.9f\n",
        name.c_str(), ref.losses.front(), r.losses.empty() ? 0.0 : r.losses.back(),
        full.losses.back(), ref.losses.back());
  tally.expect_clean(name.c_str());
  mpitest::verdict_comm()->barrier();
  if (world().rank == 0) fs::remove_all(dir);
}

// model.init_from on a checkpoint saved at tensor 2 × pipeline 2: fine-tuning from it at data 4
// (ZeRO-1) gives the single process's losses from the same checkpoint, within 1e-5.
TEST(CheckpointReshard, InitFromACheckpointOfAnotherLayout) {
  if (world().size != 4) GTEST_SKIP() << "runs on 4 ranks";
  const std::string dir = job_dir("init_from");
  std::vector<std::string> a = Layout{2, 2, 1, 1, "1f1b", false}.sets();
  a.insert(a.end(), {"checkpoint.dir=" + dir, "checkpoint.interval=" + std::to_string(kSaveAt)});
  train(a);
  const std::vector<std::string> tune = {
      "model.init_from=" + dir + "/iter_" + std::to_string(kSaveAt), "train.iterations=4"};
  std::vector<std::string> b = Layout{1, 1, 4, 1, "1f1b", true}.sets();
  b.insert(b.end(), tune.begin(), tune.end());
  const TrainResult r = train(b);
  const TrainResult ref = train(tune, true);
  mpitest::Tally tally;
  int64_t bad = r.start_iteration != 0 || r.losses.size() != 4 || ref.losses.size() != 4;
  for (size_t i = 0; !bad && i < r.losses.size(); ++i)
    bad += !mpitest::close_rel(r.losses[i], ref.losses[i], 1e-5);
  tally.add("init_from (t2 p2) at (d4 zero)", bad);
  if (world().rank == 0 && !r.losses.empty() && !ref.losses.empty())
    std::printf("init_from: final loss %.9f at d4, single process %.9f\n", r.losses.back(),
                ref.losses.back());
  tally.expect_clean("init_from");
  mpitest::verdict_comm()->barrier();
  if (world().rank == 0) fs::remove_all(dir);
}

TEST(CheckpointReshard, T2P2D1ToT1P2D2) {
  reshard({2, 2, 1, 1, "1f1b", false}, {1, 2, 2, 1, "gpipe", true}, false);
}

TEST(CheckpointReshard, P4InterleavedToT2D2) {
  reshard({1, 4, 1, 2, "interleaved", false}, {2, 1, 2, 1, "1f1b", false}, false);
}

TEST(CheckpointReshard, SameLayoutIsBitIdentical) {
  reshard({2, 2, 1, 1, "1f1b", false}, {2, 2, 1, 1, "1f1b", false}, true);
}

TEST(CheckpointReshard, ZeroShardsResumeBitIdentical) {
  reshard({1, 1, 4, 1, "1f1b", true}, {1, 1, 4, 1, "1f1b", true}, true);
}

// PipeDream-2BW saves both weight versions (W(k) and W(k−1), on which batch k runs), the
// optimizer state and its position: resumed under its own layout it continues bit for bit, under
// another within 1e-5 of the single-process 2bw run.
TEST(CheckpointReshard, TwoBWResumesBitIdentical) {
  reshard({1, 2, 2, 1, "2bw", true}, {1, 2, 2, 1, "2bw", true}, true);
}

TEST(CheckpointReshard, TwoBWT2P2ToP4) {
  reshard({2, 2, 1, 1, "2bw", false}, {1, 4, 1, 1, "2bw", false}, false);
}

// Background saves (checkpoint.async): every rank writes its shard on a thread while training
// goes on, and all publish the checkpoint at the same iteration once every shard is written; the
// checkpoint resumes bit for bit, ZeRO-1 shards and 2bw's two weight versions included, and
// under another layout within 1e-5.
TEST(CheckpointReshard, BackgroundSavesResumeBitIdentical) {
  reshard({2, 2, 1, 1, "1f1b", false}, {2, 2, 1, 1, "1f1b", false}, true, true);
  reshard({1, 1, 4, 1, "1f1b", true}, {1, 1, 4, 1, "1f1b", true}, true, true);
  reshard({1, 2, 2, 1, "2bw", true}, {1, 2, 2, 1, "2bw", true}, true, true);
  reshard({1, 1, 4, 1, "1f1b", true}, {2, 2, 1, 1, "1f1b", false}, false, true);
}

// The pipeline drains at each 2bw checkpoint (one list per stretch between saves): timing only,
// the updates are those of the run without checkpoints, bit for bit.
TEST(CheckpointReshard, TwoBWCheckpointsLeaveTheRunAsItWas) {
  if (world().size != 4) GTEST_SKIP() << "runs on 4 ranks";
  const std::string dir = job_dir("2bw_plain");
  const std::vector<std::string> layout = Layout{2, 2, 1, 1, "2bw", false}.sets();
  std::vector<std::string> saving = layout;
  saving.insert(saving.end(), {"checkpoint.dir=" + dir, "checkpoint.interval=3"});
  const TrainResult plain = train(layout), saved = train(saving);
  mpitest::Tally tally;
  tally.add("2bw losses with checkpoints every 3", saved.losses != plain.losses);
  tally.add("2bw parameters with checkpoints every 3", saved.final_params != plain.final_params);
  tally.expect_clean("2bw checkpoints");
  mpitest::verdict_comm()->barrier();
  if (world().rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  return strata::mpitest::run_all_tests(argc, argv);
}
