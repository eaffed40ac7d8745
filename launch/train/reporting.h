// reporting.h — what a training run tells its user: the start-up banner, one console line and
// one metrics object (docs/contracts.md's keys) per optimizer step, the Chrome trace of the run
// (Perfetto) and the closing summary. Console output comes from world rank 0 only. A log that
// cannot be written (a full disk) is a warning at its first failure and makes the run's exit
// status 3 (TrainResult::incomplete_logs).
//
// Thread-safety: driven from the training thread; write_trace() is collective over the host
// group.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launch/train/metrics.h"
#include "launch/train/pipeline_stage.h"
#include "launch/train/run_layout.h"
#include "launch/train/trainer.h"
#include "models/description.h"
#include "runtime/backend/backend.h"
#include "runtime/data/data_source.h"
#include "runtime/engine/grad_reducer.h"
#include "runtime/engine/pipeline.h"

namespace strata {

// "12.3 M": a figure with an SI prefix, for console lines.
std::string si(double v);

class Reporter {
 public:
  // lead: this rank prints (world rank 0 of a verbose run). start_iteration: a resumed run
  // continues the metrics file after the checkpoint's iteration.
  Reporter(const RunLayout& run, const ModelDescription& desc, Backend& be, bool lead,
           int start_iteration, TrainResult& result);

  // The run's clock: the trace's time 0.
  void set_start(std::chrono::steady_clock::time_point t) { t_start_ = t; }
  void banner(const DataSource& data, const std::string& comm, const ScheduleSpec& spec,
              bool sharded_optimizer) const;
  // One optimizer step: the result's per-step figures, the metrics object and the console
  // line (every log.interval steps, the first, the last and on evaluations).
  // sample: log.sample_interval's greedy sample of this step (new ids and their text), if any.
  void step(const StepRecord& r, double step_s, double bubble, std::optional<double> val_loss,
            const std::optional<std::pair<std::vector<int32_t>, std::string>>& sample = {});
  // The timeline of the executor's last run(), started at t0 (data-parallel overlap figures
  // into the result; the events into the trace when log.trace is set).
  void keep_timeline(const PipelineExecutor& exec, const GradReducer& reducer,
                     std::chrono::steady_clock::time_point t0);
  // One Chrome trace for the job, every rank's events on its own track (tid = world rank);
  // rank 0 writes log.trace, appending the events kept since the previous call (the file is
  // written as the run goes; `last` closes it). Collective over `host`.
  void write_trace(Communicator& host, bool last);
  void summary() const;

 private:
  // A write of log `key` (at `path`, while `when`) failed for `why`: a warning line at its first
  // failure, and the log joins the result's incomplete_logs (exit status 3, launch/cli.cc).
  void log_failed(const std::string& key, const std::string& path, const std::string& when,
                  const std::string& why);

  const RunLayout& run_;
  Backend& be_;
  bool lead_;
  TrainResult& res_;
  FlopCount flops_;
  std::string model_summary_;
  int64_t parameters_ = 0;
  std::unique_ptr<MetricsWriter> metrics_;
  std::chrono::steady_clock::time_point t_start_ = std::chrono::steady_clock::now();
  std::vector<std::pair<double, PipelineEvent>> trace_;  // (start of its run, event), unwritten
  std::unique_ptr<LogFile> trace_out_;                   // rank 0: log.trace, open until the last
  int64_t trace_events_ = 0;                             // rank 0: events written so far
  // The console line's averages: steps and their seconds since the last line printed, and when
  // it was printed (a line comes at least every kHeartbeatS seconds, whatever log.interval).
  int interval_steps_ = 0;
  double interval_s_ = 0;
  std::chrono::steady_clock::time_point last_line_ = std::chrono::steady_clock::now();
};

// The longest the console stays silent while steps complete: a line is printed after a step that
// ends this long after the previous line, although log.interval has not come.
inline constexpr double kHeartbeatS = 30.0;

// "1:02:03" (hours), "2:03" (minutes): a duration for console lines.
std::string clock_time(double seconds);

}  // namespace strata
