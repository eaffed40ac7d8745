// bench_pipeline — pipeline schedules against their theory on this machine's cores.
//
// Run under mpirun with 2 ranks (one thread each). Rank 0 first trains alone on one core (the
// single-process step time T1), then both ranks train the same batch as a 2-stage pipeline with
// m = 8 micro-batches under each schedule. The ideal step time of a schedule is
// T1 / p × (1 + its theoretical bubble ratio); the benchmark prints measured / ideal and the
// measured bubble (compute-idle share of the step) beside the theoretical one. Then PipeDream-2BW
// beside 1f1b at m = 4 and 8 (tied embeddings, clipping on): 2bw's step time over 1f1b's against
// the theory m / (m + p − 1) and the planner's prediction for the same two runs (this machine as
// a cluster: partitioner/, predict_for_config). Never fails on time.
//
// usage: mpirun -np 2 build/bench/bench_pipeline [iterations]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/plan/prediction.h"
#include "launch/train/trainer.h"
#include "partitioner/cluster.h"
#include "runtime/comm/comm.h"
#include "schedules/simulator.h"

namespace {

strata::Config config(int iters, std::vector<std::string> extra) {
  // GPT with 8 layers, hidden 256, 8 heads, seq 128, vocabulary 256, 8 micro-batches of 2.
  std::vector<std::string> s = {"model.preset=tiny",
                                "model.num_layers=8",
                                "model.hidden_size=256",
                                "model.num_heads=8",
                                "model.ffn_hidden_size=1024",
                                "model.seq_len=128",
                                "model.vocab_size=256",
                                "train.threads=1",
                                "train.micro_batch_size=2",
                                "train.global_batch_size=16",
                                "train.eval_interval=0",
                                "train.iterations=" + std::to_string(iters),
                                "data.synthetic.vocab_size=256",
                                "data.synthetic.order=1",
                                "log.interval=100000"};
  s.insert(s.end(), extra.begin(), extra.end());
  return strata::load_config("", s);
}

// Median step time of the run, skipping the first (warm-up) iteration.
double median_step_s(const strata::TrainResult& r) {
  std::vector<double> v(r.step_s.begin() + (r.step_s.size() > 1 ? 1 : 0), r.step_s.end());
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  const World w = init_world(&argc, &argv);
  const int iters = argc > 1 ? std::atoi(argv[1]) : 6;
  auto host = make_world_communicator(w.size > 1 ? CommBackend::kMPI : CommBackend::kLocal, 600);
  RunContext quiet;
  quiet.verbose = false;
  double t1 = 0;
  if (w.rank == 0) {
    RunContext solo = quiet;
    solo.single_process = true;
    t1 = median_step_s(run_training(config(iters, {}), solo));
  }
  host->barrier();
  if (w.size != 2) {
    if (w.rank == 0) std::printf("bench_pipeline: run with mpirun -np 2 (world is %d)\n", w.size);
    host.reset();
    finalize_world();
    return 0;
  }
  if (w.rank == 0) {
    std::printf(
        "bench_pipeline: GPT 8 layers, hidden 256, seq 128, 8 micro-batches of 2, "
        "p = 2, 1 thread per rank\n");
    std::printf("  single process, 1 core: %.1f ms per step\n", t1 * 1e3);
    std::printf("  %-12s %10s %10s %9s %9s %9s\n", "schedule", "step ms", "ideal ms", "ratio",
                "bubble", "theory");
  }
  struct S {
    const char* name;
    std::vector<std::string> sets;
    ScheduleSpec spec;
  };
  const std::vector<S> schedules = {
      {"gpipe", {"parallel.schedule=gpipe"}, {ScheduleKind::kGPipe, 2, 8, 1, 1}},
      {"1f1b", {"parallel.schedule=1f1b"}, {ScheduleKind::kOneFOneB, 2, 8, 1, 1}},
      {"interleaved",
       {"parallel.schedule=interleaved", "parallel.virtual_stages=2"},
       {ScheduleKind::kInterleaved, 2, 8, 2, 1}},
      {"zb-h1", {"parallel.schedule=zb-h1"}, {ScheduleKind::kZeroBubbleH1, 2, 8, 1, 1}},
  };
  for (const S& s : schedules) {
    std::vector<std::string> sets = s.sets;
    sets.push_back("parallel.pipeline=2");
    const TrainResult r = run_training(config(iters, sets), quiet);
    const double step = median_step_s(r);
    const double ideal = t1 / 2 * (1 + theoretical_bubble_ratio(s.spec));
    double bubble = 0;
    for (size_t i = 1; i < r.bubbles.size(); ++i) bubble += r.bubbles[i];
    bubble /= std::max<size_t>(1, r.bubbles.size() - 1);
    if (w.rank == 0)
      std::printf("  %-12s %10.1f %10.1f %9.3f %9.3f %9.3f\n", s.name, step * 1e3, ideal * 1e3,
                  step / ideal, bubble, theoretical_bubble_fraction(s.spec));
  }
  // 2bw against 1f1b: no flush, so a batch costs m (F + B) instead of (m + p − 1) (F + B).
  const Cluster cpu = load_cluster("cpu-local", configs_dir());
  if (w.rank == 0)
    std::printf(
        "\n  2bw against 1f1b (tied embeddings, optimizer.grad_clip 1.0), %d iterations;\n"
        "  wait: mean time a stage waited at the step for the other's sums (slowest rank)\n"
        "  %-4s %10s %10s %9s %9s %9s %11s %11s\n",
        iters, "m", "1f1b ms", "2bw ms", "ratio", "theory", "planner", "1f1b wait", "2bw wait");
  for (int m : {4, 8}) {
    double step[2] = {0, 0}, predicted[2] = {0, 0}, wait[2] = {0, 0};
    const char* kinds[2] = {"1f1b", "2bw"};
    for (int k = 0; k < 2; ++k) {
      const Config cfg = config(
          iters, {std::string("parallel.schedule=") + kinds[k], "parallel.pipeline=2",
                  "optimizer.grad_clip=1.0", "train.global_batch_size=" + std::to_string(2 * m)});
      const TrainResult r = run_training(cfg, quiet);
      step[k] = median_step_s(r);
      predicted[k] = predict_for_config(cfg, 2, cpu).at("predicted").at("iteration_s");
      float mean = 0;
      for (size_t i = 1; i < r.step_wait_s.size(); ++i)
        mean += static_cast<float>(r.step_wait_s[i] / (r.step_wait_s.size() - 1));
      host->all_reduce(&mean, 1, DType::kF32, ReduceOp::kMax);
      wait[k] = mean;
    }
    if (w.rank == 0)
      std::printf("  %-4d %10.1f %10.1f %9.3f %9.3f %9.3f %9.1f ms %8.1f ms\n", m, step[0] * 1e3,
                  step[1] * 1e3, step[1] / step[0], static_cast<double>(m) / (m + 1),
                  predicted[1] / predicted[0], wait[0] * 1e3, wait[1] * 1e3);
  }
  host.reset();
  finalize_world();
  return 0;
}
