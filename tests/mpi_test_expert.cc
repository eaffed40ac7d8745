// Expert parallelism (parallel.expert; models/layers/moe.h) against the single-process run, on 4
// ranks, for the mixture named by STRATA_TEST_ARCH (mixtral, qwen3_moe): every layout with
// expert 2 and 4 reproduces the single-process losses, gradient norms and (this rank's experts of)
// the final parameters within 1e-5 relative (docs/contracts.md), dropless, with the load-balancing
// loss; composed with tensor and sequence parallelism, ZeRO-1, bf16, and every pipeline schedule
// (the balancing loss's statistics crossing the stages); checkpoints reshard across expert sizes,
// and resume bit for bit under the layout that saved them.
//
// AdamW's eps is 3e-6 here, not 1e-8: an expert group sums an expert's rows of several data
// ranks in one GEMM, so a near-zero gradient element (|g| ~ eps, an o_proj element of layer 0
// here) carries a rounding error of ~1e-12 absolute, which Adam's first steps turn into a
// parameter change of lr·Δg/(4·eps) = 2e-4 at eps 1e-8 (measured at expert 4: grad norm 1.1e-5
// off the single process after 8 steps, 5e-7 at expert 1); at 1e-6 the same runs agree to 3e-7
// with OpenBLAS's SkylakeX kernels, but with its Haswell kernels (OPENBLAS_CORETYPE=Haswell)
// under AddressSanitizer's code that element (layers.0.self_attn.o_proj.weight[3849]) still
// ends 1.1e-5 off at tensor 2 × expert 2, just past the 1.07e-5 the check allows (and the bf16
// runs end 1.2e-3 from expert 1, past 1e-3). At 3e-6 both archs pass with the Haswell, SkylakeX
// and Cooperlake kernels, sanitized or not (bf16: 1.8e-4 to 8.7e-4); at 1e-5 Qwen3-MoE's bf16
// expert 4 ends 1.03e-3 away. That is the conditioning of the update, not a layout difference.
//
// Each rank checks what it can see and the mismatch counts are summed over the world
// (mpi_test_util.h's Tally), so every rank reaches the same verdict.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "models/registry.h"
#include "mpi_test_util.h"
#include "runtime/comm/comm.h"

namespace strata {
namespace {

bool is_mixture() {
  return std::getenv("STRATA_TEST_ARCH") != nullptr &&
         load_config("", mpitest::arch_sets(4)).model.num_experts > 0;
}

Config make_config(std::vector<std::string> extra) {
  // 4 layers so that pipeline 2 with 2 chunks a stage has a layer per piece; 4 experts (the tiny
  // presets'), so that expert 4 leaves one a rank.
  std::vector<std::string> s = {"train.threads=1",          "train.iterations=8",
                                "train.micro_batch_size=2", "train.global_batch_size=16",
                                "train.eval_interval=0",    "optimizer.lr=3e-3",
                                "optimizer.warmup_iters=2", "optimizer.min_lr=3e-4",
                                "optimizer.eps=3e-6",       "data.synthetic.vocab_size=64",
                                "parallel.bucket_mb=0.05",  "log.interval=100000"};
  const std::vector<std::string> arch = mpitest::arch_sets(4);
  s.insert(s.end(), arch.begin(), arch.end());
  for (const char* k :
       {"model.num_layers=4", "model.seq_len=16", "model.vocab_size=128", "model.init_std=0.1"})
    s.push_back(k);
  s.insert(s.end(), extra.begin(), extra.end());
  return load_config("", s);
}

TrainResult train(std::vector<std::string> extra, bool single = false) {
  RunContext ctx;
  ctx.verbose = false;
  ctx.single_process = single;
  return run_training(make_config(std::move(extra)), ctx);
}

struct Layout {
  int t = 1, e = 1;
  bool sp = false, zero = false;
  int p = 1, v = 1;
  std::string schedule = "1f1b", precision = "fp32";
  int d() const { return world().size / (t * p); }
  std::vector<std::string> sets() const {
    return {"parallel.tensor=" + std::to_string(t),
            "parallel.expert=" + std::to_string(e),
            "parallel.pipeline=" + std::to_string(p),
            "parallel.virtual_stages=" + std::to_string(v),
            "parallel.schedule=" + schedule,
            "train.precision=" + precision,
            std::string("parallel.sequence_parallel=") + (sp ? "true" : "false"),
            std::string("parallel.distributed_optimizer=") + (zero ? "true" : "false")};
  }
  std::string name() const {
    return "t" + std::to_string(t) + " e" + std::to_string(e) + " p" + std::to_string(p) + " d" +
           std::to_string(d()) + (v > 1 ? " v" + std::to_string(v) : "") + " " + schedule +
           (sp ? " sp" : "") + (zero ? " zero1" : "") + (precision != "fp32" ? " bf16" : "");
  }
};

// This rank's shard (its tensor slice of its experts) of every final parameter against the
// single-process model's.
int64_t count_params_off(const TrainResult& r, const TrainResult& ref, const Layout& l) {
  const int me = world().rank;
  const int tp_rank = me % l.t, dp_rank = (me / l.t) % l.d();
  return mpitest::count_params_off(r, ref, make_config(l.sets()).model, l.t, tp_rank, l.sp, l.e,
                                   dp_rank % l.e);
}

void expect_layouts(const std::vector<Layout>& layouts, const TrainResult& ref, double rel,
                    bool params) {
  for (const Layout& l : layouts) {
    const TrainResult r = train(l.sets());
    mpitest::Tally tally;
    tally.add(l.name() + " losses and grad norms", mpitest::count_run_off(r, ref, rel));
    if (params) tally.add(l.name() + " final parameters", count_params_off(r, ref, l));
    if (world().rank == 0)
      std::printf("%s: final loss %.9f (single process %.9f), grad norm %.9f (%.9f)\n",
                  l.name().c_str(), r.losses.back(), ref.losses.back(), r.grad_norms.back(),
                  ref.grad_norms.back());
    tally.expect_clean(l.name().c_str());
  }
}

#define SKIP_UNLESS_MIXTURE_ON_4()                          \
  if (world().size != 4) GTEST_SKIP() << "runs on 4 ranks"; \
  if (!is_mixture()) GTEST_SKIP() << "STRATA_TEST_ARCH names no mixture of experts"

// With the load-balancing loss: expert 2 and 4 alone, with ZeRO-1, and with tensor 2 (and
// sequence parallelism) on the other factor.
TEST(Expert, EveryLayoutReproducesTheSingleProcessRun) {
  SKIP_UNLESS_MIXTURE_ON_4();
  const TrainResult ref = train({}, true);
  Layout e2, e4, e4z, t2e2, t2e2spz;
  e2.e = 2;
  e4.e = 4;
  e4z.e = 4;
  e4z.zero = true;
  t2e2.t = 2;
  t2e2.e = 2;
  t2e2spz = t2e2;
  t2e2spz.sp = true;
  t2e2spz.zero = true;
  expect_layouts({e2, e4, e4z, t2e2, t2e2spz}, ref, 1e-5, true);
}

// bf16: every layout rounds at its own places and a mixture's routing turns a rounding into a
// discrete choice, so bf16 layouts drift apart from the single process by more than dense ones
// (measured at data 4 without experts spread: 2.7e-4 in the loss, 3e-3 in the grad norm by step
// 5; tensor 2 with sp: 1.9e-3 and 2e-2). Expert parallelism adds only the rows' new order: each
// layout against itself at expert 1, losses within 1e-3 (measured ≤ 2.3e-4, the first 4 steps
// equal), deviations printed.
TEST(Expert, Bf16LayoutsMatchTheirLayoutWithoutExpertParallelism) {
  SKIP_UNLESS_MIXTURE_ON_4();
  Layout e4, t2e2;
  e4.e = 4;
  e4.precision = "bf16";
  t2e2.t = 2;
  t2e2.e = 2;
  t2e2.sp = true;
  t2e2.precision = "bf16";
  for (const Layout& l : {e4, t2e2}) {
    Layout dense = l;
    dense.e = 1;
    const TrainResult ref = train(dense.sets());
    const TrainResult r = train(l.sets());
    int64_t bad = r.losses.size() != ref.losses.size();
    double dev = 0;
    for (size_t i = 0; !bad && i < ref.losses.size(); ++i) {
      bad += !mpitest::close_rel(r.losses[i], ref.losses[i], 1e-3);
      dev = std::max(dev, std::fabs(r.losses[i] - ref.losses[i]) / std::fabs(ref.losses[i]));
    }
    mpitest::Tally tally;
    tally.add(l.name() + " bf16 losses", bad);
    if (world().rank == 0)
      std::printf("%s: max loss deviation %.2e from expert 1\n", l.name().c_str(), dev);
    tally.expect_clean(l.name().c_str());
  }
}

// Pipeline 2 × data 2 × expert 2 under every flushing schedule, and 2bw against the
// single-process 2bw run, with the balancing loss (its statistics cross the stages beside the
// activations: Model::boundary_stats).
TEST(Expert, EveryScheduleReproducesTheSingleProcessRun) {
  SKIP_UNLESS_MIXTURE_ON_4();
  std::vector<Layout> flushing;
  for (const char* s : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
    Layout l;
    l.p = 2;
    l.e = 2;
    l.schedule = s;
    l.v = l.schedule == "interleaved" ? 2 : 1;
    l.zero = l.schedule == "1f1b";
    flushing.push_back(l);
  }
  const TrainResult ref = train({}, true);
  for (const Layout& l : flushing) {
    const TrainResult r = train(l.sets());
    mpitest::Tally tally;
    tally.add(l.name() + " losses and grad norms", mpitest::count_run_off(r, ref, 1e-5));
    if (world().rank == 0)
      std::printf("%s: final loss %.9f (single process %.9f)\n", l.name().c_str(), r.losses.back(),
                  ref.losses.back());
    tally.expect_clean(l.name().c_str());
  }
  const TrainResult ref2bw = train({"parallel.schedule=2bw"}, true);
  Layout tw;
  tw.p = 2;
  tw.e = 2;
  tw.schedule = "2bw";
  const TrainResult r = train(tw.sets());
  mpitest::Tally tally;
  tally.add(tw.name() + " against the single-process 2bw", mpitest::count_run_off(r, ref2bw, 1e-5));
  tally.expect_clean("2bw");
}

// Saves at iteration 4 under `from` and resumes under `to` (mpitest::expect_resumed).
void reshard(const Layout& from, const Layout& to, bool exact, const TrainResult& ref) {
  mpitest::expect_resumed([](std::vector<std::string> sets) { return train(std::move(sets)); },
                          from.sets(), to.sets(), from.name() + " -> " + to.name(), 4, exact, ref,
                          "expert");
}

TEST(Expert, CheckpointsReshardAcrossExpertSizes) {
  SKIP_UNLESS_MIXTURE_ON_4();
  const TrainResult ref = train({}, true);
  Layout e2z, e4, t2e2, e1;
  e2z.e = 2;
  e2z.zero = true;
  e4.e = 4;
  t2e2.t = 2;
  t2e2.e = 2;
  reshard(e2z, e2z, true, ref);  // ZeRO-1's expert shards (over 2 ranks) included
  reshard(e2z, e4, false, ref);
  reshard(e4, t2e2, false, ref);
  reshard(t2e2, e1, false, ref);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  return strata::mpitest::run_all_tests(argc, argv);
}
