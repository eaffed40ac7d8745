#include "launch/train/trainer.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "launch/train/checkpointing.h"
#include "launch/train/model_stage.h"
#include "launch/train/reporting.h"
#include "launch/train/run_layout.h"
#include "launch/train/sampling.h"
#include "launch/train/stop_request.h"
#include "models/registry.h"
#include "runtime/backend/backend.h"
#include "runtime/base/error.h"
#include "runtime/data/data_source.h"
#include "runtime/engine/grad_reducer.h"
#include "runtime/engine/optimizer.h"
#include "runtime/engine/pipeline.h"
#include "runtime/io/input_file.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Test hook (documented in docs/checkpoints.md): STRATA_TEST_KILL_AT_ITER=<K> makes world rank 1
// (rank 0 in a one-rank job) SIGKILL itself as iteration K starts, as a node failure would.
void maybe_kill_at(int it, const World& w) {
  const char* s = std::getenv("STRATA_TEST_KILL_AT_ITER");
  if (s && std::atoi(s) == it && w.rank == (w.size > 1 ? 1 : 0)) ::raise(SIGKILL);
}

// train.skip_nonfinite: a step whose loss or gradient is not finite is skipped (the stage did
// not apply it); five in a row end the run.
class NonfiniteGuard {
 public:
  NonfiniteGuard(bool skip, int in_a_row) : skip_(skip), in_a_row_(in_a_row) {}
  void check(const StepRecord& r) {
    const int it = r.batch + 1;
    if (r.finite) {
      in_a_row_ = 0;
      return;
    }
    if (!skip_)
      throw std::runtime_error("non-finite loss or gradient at iteration " + std::to_string(it) +
                               " (train.skip_nonfinite is false)");
    if (++in_a_row_ >= 5)
      throw std::runtime_error("5 non-finite steps in a row (last at iteration " +
                               std::to_string(it) +
                               "): the run is diverging; lower optimizer.lr or check the data");
  }
  int in_a_row() const { return in_a_row_; }

 private:
  bool skip_;
  int in_a_row_;
};

// The run's outputs, checked before anything trains so that a bad path costs seconds, not the
// run: checkpoint.dir a directory files can be created in (made now when checkpoints will be
// saved), log.metrics and log.trace files that can be written. Rank 0 writes them all but the
// shards, which go into the directory rank 0 makes.
void check_output_paths(const Config& cfg) {
  const CheckpointConfig& ck = cfg.checkpoint;
  if (ck.dir) {
    std::error_code ec;
    const bool saves = ck.interval > 0;
    const std::string why = saves || std::filesystem::exists(*ck.dir, ec)
                                ? output_directory_problem(*ck.dir)
                                : std::string();
    if (!why.empty())
      throw InputError(
          cfg.source_file, "checkpoint.dir",
          "expected a directory checkpoints can be written to, got \"" + *ck.dir + "\": " + why);
  }
  for (const auto& [key, path] :
       {std::pair{"log.metrics", cfg.log.metrics}, std::pair{"log.trace", cfg.log.trace}}) {
    if (!path) continue;
    const std::string why = output_file_problem(*path);
    if (!why.empty())
      throw InputError(cfg.source_file, key,
                       "expected a file path that can be written, got \"" + *path + "\": " + why);
  }
}

}  // namespace

TrainResult run_training(const Config& cfg, const RunContext& ctx) {
  // The run's shape, the backend and the groups.
  const RunLayout run = make_run_layout(cfg, ctx.single_process);
  std::unique_ptr<Backend> backend =
      make_backend(cfg.device, run.threads, cfg.train.attention_backend);
  Backend& be = *backend;
  check_fits_in_memory(run, be.device_memory_bytes());
  ProcessGroups groups = run.groups(be);
  decide_on_rank0(*groups.host, [&cfg]() -> std::string {
    check_output_paths(cfg);
    return "";
  });
  SamplingShape sampling;
  sampling.seq_len = run.seq_len;
  sampling.global_batch = run.global;
  sampling.model_vocab = cfg.model.vocab_size;
  sampling.masked_lm = architecture(cfg.model.arch).masked_lm;
  std::unique_ptr<DataSource> data =
      make_data_source(cfg.data, cfg.train.seed, sampling, cfg.source_file);
  if (data->vocab_size() > cfg.model.vocab_size) {
    throw InputError(cfg.source_file, "model.vocab_size",
                     "at least the data's vocabulary " + std::to_string(data->vocab_size()) +
                         ", got " + std::to_string(cfg.model.vocab_size));
  }
  const bool lead = run.world->rank == 0 && ctx.verbose;
  const int p = run.layout.pipeline, v = run.layout.virtual_stages, m = run.layout.num_microbatches;

  // This stage's pieces of the model, built by its architecture; gradients reduced over the
  // data group as they become final; the optimizer over what this rank updates.
  const std::unique_ptr<ModelDescription> desc = describe_model(cfg.model);
  const std::unique_ptr<Model> model =
      build_model(cfg.model, run.model_options(groups.pp_rank, groups.tp.get()), be);
  ParamStore& params = model->params();
  GradReducer reducer(be, groups.dp.get(), params.grads(), param_spans(params), cfg.comm.bucket_mb,
                      run.layout.distributed_optimizer);
  AdamW opt(be, cfg.optimizer, reducer.optimizer_segments());
  params.set_grad_ready_hook([&](int a, int b) { reducer.mark_ready(a, b); });
  ModelStage stage(run, *model, be, *data, groups, reducer, opt);
  PipelineExecutor exec(*groups.pp, be, groups.pp_rank, p, v);

  // The instruction lists: training (2bw: the whole run, which never flushes) and evaluation.
  const ScheduleSpec spec = run.train_spec();
  if (const std::string why = schedule_invalid_reason(spec); !why.empty())
    throw InputError(cfg.source_file, "parallel.schedule", why);
  const std::vector<Instr> train_list =
      !run.flushes() ? std::vector<Instr>() : build_schedule(spec, groups.pp_rank);
  const std::vector<Instr> eval_list = build_forward_only(groups.pp_rank, p, v, m);

  // Resume from a checkpoint, or start from model.init_from.
  Checkpointing checkpoints(run, *desc, groups, *model, opt, reducer, be, lead);
  const RunStart start = checkpoints.restore();
  NonfiniteGuard guard(cfg.train.skip_nonfinite, start.nonfinite_in_a_row);

  TrainResult res;
  res.pipeline_rank = groups.pp_rank;
  res.layers_per_piece = run.layout.layers_per_piece;
  res.pieces = model->pieces();
  res.loss_floor = data->loss_floor(run.seq_len);
  // The schedule's idle share of the step with equal op times (schedules/simulator.h).
  res.theoretical_bubble = theoretical_bubble_fraction(spec);
  Reporter report(run, *desc, be, lead, start.iteration, res);
  report.banner(*data, to_string(run.transport(be.device())), spec, reducer.sharded());

  const int iters = cfg.train.iterations;
  auto evaluate = [&]() {
    double sum = 0, tokens = 0;
    for (int k = 0; k < cfg.train.eval_iters; ++k) {
      stage.begin(Split::kVal, static_cast<uint64_t>(k), false);
      exec.run(eval_list, stage);
      sum += stage.loss_sum();
      tokens += stage.loss_tokens();
    }
    return sum_over(be, groups.dp.get(), sum_over(be, groups.pp.get(), sum)) / tokens;
  };
  // Every eval_interval steps and after the last; 2bw never flushes: once, after the last step.
  auto eval_due = [&](int it) {
    return cfg.train.eval_interval > 0 &&
           (it == iters || (run.flushes() && it % cfg.train.eval_interval == 0));
  };
  // log.sample_interval: greedy samples over the model's key/value caches (sampling.h); 2bw
  // keeps each sampled step's weights to sample from once its list has run.
  TrainingSampler sampler(cfg, *model, be, groups.pp.get());
  if (!run.flushes() && cfg.log.sample_interval > 0)
    stage.set_on_step([&](int it, const Tensor& w) { sampler.keep(it, w); });
  auto finish_step = [&](const StepRecord& r, double step_s, double bubble) {
    guard.check(r);
    const int it = r.batch + 1;
    const std::optional<double> val =
        eval_due(it) ? std::optional<double>(evaluate()) : std::nullopt;
    report.step(r, step_s, bubble, val, sampler.sample(it));
  };

  // SIGTERM / SIGUSR1: save and stop after the iteration every rank agrees on (stop_request.h).
  StopRequest stop(*groups.host);
  auto stopped = [&](int sig, int it, const std::function<void()>& save, bool saved) {
    res.stopped_by_signal = sig;
    res.stopped_at = it;
    if (cfg.checkpoint.dir && !saved) save();
    checkpoints.finish(it);  // a background save is published before the job stops
    if (lead)
      std::printf("stopped by %s after iteration %d: %s\n", signal_name(sig), it,
                  cfg.checkpoint.dir ? "the checkpoint of that iteration resumes the run"
                                     : "no checkpoint.dir, nothing saved");
    std::fflush(stdout);
  };
  double train_time = 0;
  const auto t_start = Clock::now();
  stage.set_clock(t_start);
  report.set_start(t_start);
  if (!run.flushes()) {
    if (start.iteration > 0) stage.resume(start.iteration, start.previous_params);
    // The pipeline never flushes between batches, except where a checkpoint is due: one
    // instruction list per stretch of batches up to the next save (or the end of the run),
    // reported when it has run.
    double previous = 0;
    size_t reported = 0;
    for (int from = start.iteration; from < iters;) {
      const int every = cfg.checkpoint.dir ? cfg.checkpoint.interval : 0;
      const int to = every > 0 ? std::min(iters, (from / every + 1) * every) : iters;
      maybe_kill_at(from + 1, *run.world);
      ScheduleSpec part = spec;
      part.batches = to - from;
      const std::vector<Instr> list = build_schedule(part, groups.pp_rank);
      const auto t0 = Clock::now();
      be.allocator().reset_peak();
      params.zero_grads();
      reducer.begin_iteration();
      stage.begin(Split::kTrain, static_cast<uint64_t>(from), true);
      stage.reset_list();
      exec.run(list, stage);
      be.synchronize();
      const double list_s = seconds_since(t0);
      train_time += list_s;
      report.keep_timeline(exec, reducer, t0);
      const double bubble = std::max(0.0, 1.0 - exec.compute_s() / list_s);
      // Evaluation, samples, checkpoints and the final parameters use the newest version.
      params.use_params(stage.newest_params());
      for (; reported < stage.records().size(); ++reported) {
        const StepRecord& r = stage.records()[reported];
        finish_step(r, r.at_s - previous, bubble);
        previous = r.at_s;
      }
      if (checkpoints.due(to)) checkpoints.save(to, guard.in_a_row(), stage.previous_params());
      // Background saves publish once every rank has written (2bw: one stretch later).
      const StopRequest::Agreement agreed = stop.poll(checkpoints.pending(), checkpoints.writing());
      checkpoints.publish_saved(agreed.saved, to);
      if (const int sig = agreed.signal) {
        stopped(
            sig, to, [&] { checkpoints.save(to, guard.in_a_row(), stage.previous_params()); },
            checkpoints.due(to));
        break;
      }
      from = to;
    }
  } else {
    for (int it = start.iteration + 1; it <= iters; ++it) {
      maybe_kill_at(it, *run.world);
      const auto t0 = Clock::now();
      be.allocator().reset_peak();
      params.zero_grads();
      reducer.begin_iteration();
      // The data index is the optimizer step (0-based) and the slot in the global batch, so
      // any split of the batch into micro-batches, stages or ranks sees the same sequences.
      stage.begin(Split::kTrain, static_cast<uint64_t>(it - 1), true);
      stage.reset_list();
      exec.run(train_list, stage);
      be.synchronize();
      const double step_s = seconds_since(t0);
      train_time += step_s;
      report.keep_timeline(exec, reducer, t0);
      finish_step(stage.records().back(), step_s, std::max(0.0, 1.0 - exec.compute_s() / step_s));
      if (checkpoints.due(it)) checkpoints.save(it, guard.in_a_row());
      const StopRequest::Agreement agreed = stop.poll(checkpoints.pending(), checkpoints.writing());
      checkpoints.publish_saved(agreed.saved, it);
      if (const int sig = agreed.signal) {
        stopped(
            sig, it, [&] { checkpoints.save(it, guard.in_a_row()); }, checkpoints.due(it));
        break;
      }
    }
  }
  checkpoints.finish(res.stopped_by_signal ? res.stopped_at : iters);
  res.save_stall_s = checkpoints.stall_s();
  res.save_write_s = checkpoints.write_s();
  res.save_published_at = checkpoints.published_at();
  res.wall_s = seconds_since(t_start);
  res.start_iteration = start.iteration;
  const int done = (res.stopped_by_signal ? res.stopped_at : iters) - start.iteration;
  res.tokens_per_s = train_time > 0 ? run.tokens_per_iteration() * done / train_time : 0;
  res.memory = be.allocator().stats();
  res.final_params.resize(static_cast<size_t>(params.numel()));
  be.download(res.final_params.data(), params.params());

  report.write_trace(*groups.host);
  report.summary();
  return res;
}

}  // namespace strata
