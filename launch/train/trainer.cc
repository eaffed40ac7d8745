#include "launch/train/trainer.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "launch/config/config_parse.h"
#include "launch/train/checkpointing.h"
#include "launch/train/pipeline_stage.h"
#include "launch/train/reporting.h"
#include "launch/train/run_layout.h"
#include "launch/train/sampling.h"
#include "launch/train/stop_request.h"
#include "models/registry.h"
#include "runtime/backend/backend.h"
#include "runtime/base/error.h"
#include "runtime/base/operation.h"
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
      throw InputError(cfg.source_file, "checkpoint.dir",
                       "expected a directory checkpoints can be written to, got \"" + *ck.dir +
                           "\": " + why + config_path_note(*ck.dir));
  }
  for (const auto& [key, path] :
       {std::pair{"log.metrics", cfg.log.metrics}, std::pair{"log.trace", cfg.log.trace}}) {
    if (!path) continue;
    const std::string why = output_file_problem(*path);
    if (!why.empty())
      throw InputError(cfg.source_file, key,
                       "expected a file path that can be written, got \"" + *path + "\": " + why +
                           config_path_note(*path));
  }
}

// The config's data at the run's batch shape, refused when its tokens do not fit the model's
// vocabulary.
std::unique_ptr<DataSource> open_data(const RunLayout& run) {
  const Config& cfg = *run.cfg;
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
  return data;
}

// run.train_spec(), or InputError at parallel.schedule saying why it cannot be scheduled.
ScheduleSpec schedulable(const RunLayout& run) {
  const ScheduleSpec spec = run.train_spec();
  if (const std::string why = schedule_invalid_reason(spec); !why.empty())
    throw InputError(run.cfg->source_file, "parallel.schedule", why);
  return spec;
}

// One training run over the backend, groups and data the caller started: this stage's model,
// its optimizer and pipeline stage, checkpoints, reports and samples, built in the order each
// needs the one before; then the loop of instruction lists.
//
// A list covers the batches from one stop to the next. A flushing schedule drains the pipeline
// after every batch, so each batch is a list; 2bw never does (schedules/schedule.h:
// flushes_every_batch), so its list runs on until a checkpoint is due or the run ends, and its
// steps are reported when the list has run. Evaluation needs the pipeline drained on the newest
// weights: every eval_interval steps for a flushing schedule, once after the last step for 2bw.
class Training {
 public:
  Training(const RunLayout& run, const RunContext& ctx, Backend& be, ProcessGroups& groups,
           const DataSource& data);
  TrainResult run();

 private:
  // Where the list that starts after `from` steps ends: the next batch, or (2bw) the next save
  // or the end of the run.
  int list_end(int from) const;
  // Runs the training batches [from, to) as one instruction list and reports their steps.
  void run_list(int from, int to);
  // One step of the list just run: skipped-step accounting, evaluation, the report.
  void finish_step(const StepRecord& r, double step_s, double bubble);
  bool eval_due(int it) const;
  double evaluate();
  // After the list that ended with step `it`: the checkpoint when due, then the signals every
  // rank agreed on; true when the run stops here.
  bool save_or_stop(int it);
  // The result's totals, the trace and the summary once the loop has ended.
  TrainResult finish();

  const RunLayout& run_;
  const Config& cfg_;
  const bool lead_;
  Backend& be_;
  ProcessGroups& groups_;
  const DataSource& data_;
  // This stage's pieces of the model, built by its architecture; gradients reduced over the
  // data group as they become final; the optimizer over what this rank updates.
  const std::unique_ptr<ModelDescription> desc_;
  const std::unique_ptr<Model> model_;
  ParamStore& params_;
  GradReducer reducer_;
  AdamW opt_;
  ModelStage stage_;
  PipelineExecutor exec_;
  // The run's schedule (2bw: every batch; its lists are stretches of it), refused (InputError)
  // before any list is built when it cannot be scheduled.
  const ScheduleSpec spec_;
  std::vector<Instr> eval_list_;
  std::vector<Instr> list_;  // the last training list, kept while lists keep their length
  int list_batches_ = 0;
  // Resume from a checkpoint, or start from model.init_from.
  Checkpointing checkpoints_;
  const RunStart start_;
  NonfiniteGuard guard_;
  TrainResult res_;
  Reporter report_;
  // log.sample_interval: greedy samples over the model's key/value caches (sampling.h).
  TrainingSampler sampler_;
  // SIGTERM / SIGUSR1: save and stop after the list every rank agrees on (stop_request.h).
  StopRequest stop_;
  Clock::time_point t_start_;  // the run's clock: the stage's records and the trace count from it
  double train_time_ = 0;      // seconds the lists took, evaluation and saves excluded
  size_t reported_ = 0;        // the stage's records reported so far
};

Training::Training(const RunLayout& run, const RunContext& ctx, Backend& be, ProcessGroups& groups,
                   const DataSource& data)
    : run_(run),
      cfg_(*run.cfg),
      lead_(run.world->rank == 0 && ctx.verbose),
      be_(be),
      groups_(groups),
      data_(data),
      desc_(describe_model(cfg_.model)),
      model_(build_model(cfg_.model, run.model_options(groups.pp_rank, groups), be)),
      params_(model_->params()),
      reducer_(be, groups.dp.get(), params_.grads(), param_spans(params_), cfg_.comm.bucket_mb,
               run.layout.distributed_optimizer, groups.edp.get()),
      opt_(be, cfg_.optimizer, reducer_.optimizer_segments()),
      stage_(run, *model_, be, data, groups, reducer_, opt_),
      exec_(*groups.pp, be, groups.pp_rank, run.layout.pipeline, run.layout.virtual_stages),
      spec_(schedulable(run)),
      eval_list_(build_forward_only(groups.pp_rank, run.layout.pipeline, run.layout.virtual_stages,
                                    run.layout.num_microbatches)),
      checkpoints_(run, *desc_, groups, *model_, opt_, reducer_, be, lead_),
      start_(checkpoints_.restore()),
      guard_(cfg_.train.skip_nonfinite, start_.nonfinite_in_a_row),
      report_(run, *desc_, be, lead_, start_.iteration, res_),
      sampler_(cfg_, *model_, be, groups.pp.get()),
      stop_(*groups.host) {
  params_.set_grad_ready_hook([this](int a, int b) { reducer_.mark_ready(a, b); });
}

TrainResult Training::run() {
  res_.pipeline_rank = groups_.pp_rank;
  res_.layers_per_piece = run_.layout.layers_per_piece;
  res_.pieces = model_->pieces();
  res_.loss_floor = data_.loss_floor(run_.seq_len);
  // The schedule's idle share of the step with equal op times (schedules/simulator.h).
  res_.theoretical_bubble = theoretical_bubble_fraction(spec_);
  report_.banner(data_, to_string(run_.transport(be_.device())), spec_, reducer_.sharded());
  // A list that runs past a sampled step has moved its weights on by the time the step is
  // reported: the sampler keeps a copy of them as the stage writes them.
  if (!run_.flushes() && cfg_.log.sample_interval > 0)
    stage_.set_on_step([this](int it, const Tensor& w) { sampler_.keep(it, w); });
  if (start_.iteration > 0) stage_.resume(start_.iteration, start_.previous_params);

  t_start_ = Clock::now();
  stage_.set_clock(t_start_);
  report_.set_start(t_start_);
  // A stop asked for during start-up or the resume: nothing was trained, so nothing new to save.
  if (const int sig = stop_.agree_before_first_step()) {
    res_.stopped_by_signal = sig;
    res_.stopped_at = start_.iteration;
    if (lead_)
      std::printf(
          "stopped by %s before the first step: nothing trained, nothing new to save%s\n",
          signal_name(sig),
          start_.iteration > 0 ? " (the checkpoint it resumed from still resumes the run)" : "");
    std::fflush(stdout);
    return finish();
  }
  for (int from = start_.iteration; from < cfg_.train.iterations;) {
    const int to = list_end(from);
    with_memory_named({"training iteration " + std::to_string(from + 1) +
                           (to > from + 1 ? " to " + std::to_string(to) : ""),
                       "", ""},
                      [&] { run_list(from, to); });
    if (save_or_stop(to)) break;
    from = to;
  }
  return finish();
}

int Training::list_end(int from) const {
  if (run_.flushes()) return from + 1;
  return checkpoints_.next_save(from, cfg_.train.iterations);
}

void Training::run_list(int from, int to) {
  maybe_kill_at(from + 1, *run_.world);
  if (to - from != list_batches_) {
    ScheduleSpec part = spec_;
    part.batches = list_batches_ = to - from;
    list_ = build_schedule(part, groups_.pp_rank);
  }
  const auto t0 = Clock::now();
  be_.allocator().reset_peak();
  params_.zero_grads();
  reducer_.begin_iteration();
  // The data index is the optimizer step (0-based) and the slot in the global batch, so any
  // split of the batch into micro-batches, stages or ranks sees the same sequences.
  stage_.begin(Split::kTrain, static_cast<uint64_t>(from), true);
  stage_.reset_list();
  exec_.run(list_, stage_);
  be_.synchronize();
  const double list_s = seconds_since(t0);
  train_time_ += list_s;
  report_.keep_timeline(exec_, reducer_, t0);
  // The trace goes to its file after every list (a gather over the host group, only with
  // log.trace), not all at the end: memory stays one list's events, and a run that dies keeps
  // the events before.
  report_.write_trace(*groups_.host, false);
  const double bubble = std::max(0.0, 1.0 - exec_.compute_s() / list_s);
  // Evaluation, samples, checkpoints and the final parameters use the newest weights.
  stage_.use_newest_weights();
  // Each step's time runs from the end of the one before (the first: from the list's start) to
  // when its update finished (the last: to the list's end), in seconds from the list's start.
  const double list_start = std::chrono::duration<double>(t0 - t_start_).count();
  double previous = 0;
  const std::vector<StepRecord>& records = stage_.records();
  for (; reported_ < records.size(); ++reported_) {
    const StepRecord& r = records[reported_];
    const double end = reported_ + 1 == records.size() ? list_s : r.at_s - list_start;
    finish_step(r, end - previous, bubble);
    previous = end;
  }
}

void Training::finish_step(const StepRecord& r, double step_s, double bubble) {
  guard_.check(r);
  const int it = r.batch + 1;
  const std::optional<double> val = eval_due(it) ? std::optional<double>(evaluate()) : std::nullopt;
  report_.step(r, step_s, bubble, val, sampler_.sample(it));
}

// Every eval_interval steps and after the last; a schedule that does not flush: once, after the
// last step (its lists end where checkpoints fall, not where evaluations do).
bool Training::eval_due(int it) const {
  const int every = cfg_.train.eval_interval;
  return every > 0 && (it == cfg_.train.iterations || (run_.flushes() && it % every == 0));
}

double Training::evaluate() {
  double sum = 0, tokens = 0;
  for (int k = 0; k < cfg_.train.eval_iters; ++k) {
    stage_.begin(Split::kVal, static_cast<uint64_t>(k), false);
    exec_.run(eval_list_, stage_);
    sum += stage_.loss_sum();
    tokens += stage_.loss_tokens();
  }
  return sum_over(be_, groups_.dp.get(), sum_over(be_, groups_.pp.get(), sum)) / tokens;
}

bool Training::save_or_stop(int it) {
  const bool due = checkpoints_.due(it);
  if (due) checkpoints_.save(it, guard_.in_a_row(), stage_.previous_params());
  // Background saves publish once every rank has written (2bw: one list later).
  const StopRequest::Agreement agreed = stop_.poll(checkpoints_.pending(), checkpoints_.writing());
  checkpoints_.publish_saved(agreed.saved, it);
  const int sig = agreed.signal;
  if (sig == 0) return false;
  res_.stopped_by_signal = sig;
  res_.stopped_at = it;
  if (cfg_.checkpoint.dir && !due)
    checkpoints_.save(it, guard_.in_a_row(), stage_.previous_params());
  checkpoints_.finish(it);  // a background save is published before the job stops
  if (lead_)
    std::printf("stopped by %s after iteration %d: %s\n", signal_name(sig), it,
                cfg_.checkpoint.dir ? "the checkpoint of that iteration resumes the run"
                                    : "no checkpoint.dir, nothing saved");
  std::fflush(stdout);
  return true;
}

TrainResult Training::finish() {
  const int iters = cfg_.train.iterations;
  const int last = res_.stopped_by_signal ? res_.stopped_at : iters;
  checkpoints_.finish(last);
  res_.save_stall_s = checkpoints_.stall_s();
  res_.save_write_s = checkpoints_.write_s();
  res_.save_published_at = checkpoints_.published_at();
  res_.wall_s = seconds_since(t_start_);
  res_.start_iteration = start_.iteration;
  const int done = last - start_.iteration;
  res_.tokens_per_s = train_time_ > 0 ? run_.tokens_per_iteration() * done / train_time_ : 0;
  res_.memory = be_.allocator().stats();
  res_.final_params.resize(static_cast<size_t>(params_.numel()));
  be_.download(res_.final_params.data(), params_.params());
  report_.write_trace(*groups_.host, true);
  report_.summary();
  return std::move(res_);
}

}  // namespace

TrainResult run_training(const Config& cfg, const RunContext& ctx) {
  // The run's shape once; the backend, refused before anything is allocated when the
  // predicted peak does not fit; the groups; the outputs checked before anything trains.
  const RunLayout run = make_run_layout(cfg, ctx.single_process);
  std::unique_ptr<Backend> backend =
      make_backend(cfg.device, run.threads, cfg.train.attention_backend);
  check_fits_in_memory(run, backend->device_memory_bytes());
  ProcessGroups groups = run.groups(*backend);
  decide_on_rank0(*groups.host, [&cfg]() -> std::string {
    check_output_paths(cfg);
    return "";
  });
  // An allocation failing here is the config's sizes against this process's memory (the check
  // above passed on the prediction): bad input naming them; in the loop it is a failure.
  const std::unique_ptr<DataSource> data = with_memory_named(
      {"opening the data", cfg.source_file, "data"}, [&] { return open_data(run); });
  std::optional<Training> training;
  with_memory_named(
      {"building the model, its gradients and optimizer state", cfg.source_file, "model"},
      [&] { training.emplace(run, ctx, *backend, groups, *data); });
  return training->run();
}

}  // namespace strata
