// bench_checkpoint_async — what a checkpoint save costs the training, synchronous against
// background (checkpoint.async), measured side by side in one run.
//
// The same training twice, one process: a GPT of 12 layers × 512 (~42 M parameters with the
// padded vocabulary of 8192: a checkpoint of params + m + v of ~0.5 GB), micro-batch 1 of 128
// tokens, a checkpoint every 2 of 12 iterations (6 saves). For each save: the stall, the time it
// held the training thread (the copy to host memory, the write and its fsync unless it is a
// background save, and publishing: the all-gather of checksums, metadata.json, the rename), and
// the shard's write time (in the background or not); the median step (a background write shares
// the cores with the steps it overlaps) and the whole run's wall time. The disk is this
// machine's; save figures are medians over the saves. Never fails on time.
//
// usage: bench_checkpoint_async [dir] [iterations]   (default /tmp/strata_bench_async, 12)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "runtime/comm/comm.h"

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  const World w = init_world(&argc, &argv);
  (void)w;
  const std::string dir = argc > 1 ? argv[1] : "/tmp/strata_bench_async";
  const int iters = argc > 2 ? std::atoi(argv[2]) : 12;
  struct Result {
    TrainResult r;
    const char* name;
  };
  std::vector<Result> results;
  for (const bool background : {false, true}) {
    std::filesystem::remove_all(dir);
    const Config cfg =
        load_config("", {"model.num_layers=12", "model.hidden_size=512", "model.num_heads=8",
                         "model.ffn_hidden_size=2048", "model.seq_len=128", "model.vocab_size=8192",
                         "data.synthetic.vocab_size=64", "train.micro_batch_size=1",
                         "train.global_batch_size=1", "train.iterations=" + std::to_string(iters),
                         "train.eval_interval=0", "log.interval=100000", "checkpoint.dir=" + dir,
                         "checkpoint.interval=2", "checkpoint.keep=2",
                         std::string("checkpoint.async=") + (background ? "true" : "false")});
    RunContext ctx;
    ctx.verbose = false;
    results.push_back({run_training(cfg, ctx), background ? "background" : "synchronous"});
  }
  std::filesystem::remove_all(dir);
  const auto& a = results[0].r;
  std::printf("GPT 12 × 512, %zu saves of %d iterations each; medians over the saves\n",
              a.save_stall_s.size(), 2);
  std::printf("%-12s | stall per save ms | shard write ms | step ms | run s | losses equal\n",
              "save");
  for (const Result& res : results)
    std::printf("%-12s | %17.1f | %14.1f | %7.1f | %5.2f | %s\n", res.name,
                1e3 * median(res.r.save_stall_s), 1e3 * median(res.r.save_write_s),
                1e3 * median(res.r.step_s), res.r.wall_s, res.r.losses == a.losses ? "yes" : "NO");
  const double ratio = median(results[1].r.save_stall_s) / median(a.save_stall_s);
  std::printf("background stall / synchronous stall: %.3f\n", ratio);
  finalize_world();
  return 0;
}
