#include "launch/train/reporting.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "partitioner/planner.h"
#include "runtime/base/error.h"
#include "runtime/comm/process_groups.h"

namespace strata {

std::string si(double v) {
  char buf[32];
  if (v >= 1e12)
    std::snprintf(buf, sizeof buf, "%.2f T", v / 1e12);
  else if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f G", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1f k", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f ", v);
  return buf;
}

namespace {

// A resumed run continues the metrics file: it keeps the lines up to the checkpoint's iteration
// and drops those a killed run wrote after it (they are about to be recomputed). "" when done,
// else why the file could not be rewritten.
std::string keep_metrics_up_to(const std::string& path, int iteration,
                               const std::string& config_file) {
  std::ifstream in(path);
  if (!in) return "";
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("iter") && j["iter"].is_number_integer() &&
        j["iter"].get<int64_t>() <= iteration)
      kept += line + "\n";
  }
  in.close();
  return LogFile(path, false, config_file, "log.metrics").write(kept);
}

std::string trace_events_json(const std::vector<std::pair<double, PipelineEvent>>& events,
                              int rank) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& [offset, e] : events) {
    arr.push_back({{"name", instr_string({e.op, e.mb, e.chunk, -1})},
                   {"cat", to_string(e.op)},
                   {"ph", "X"},
                   {"pid", 0},
                   {"tid", rank},
                   {"ts", (offset + e.start_s) * 1e6},
                   {"dur", (e.end_s - e.start_s) * 1e6}});
  }
  return arr.dump();
}

}  // namespace

Reporter::Reporter(const RunLayout& run, const ModelDescription& desc, Backend& be, bool lead,
                   int start_iteration, TrainResult& result)
    : run_(run),
      be_(be),
      lead_(lead),
      res_(result),
      flops_(desc.flops_per_iteration(run.global, run.layout.recompute)),
      model_summary_(desc.summary()),
      parameters_(desc.parameters()) {
  const Config& cfg = *run_.cfg;
  if (cfg.log.metrics && run_.world->rank == 0) {
    if (start_iteration > 0) {
      const std::string why =
          keep_metrics_up_to(*cfg.log.metrics, start_iteration, cfg.source_file);
      if (!why.empty())
        log_failed("log.metrics", *cfg.log.metrics,
                   "rewriting its lines up to iteration " + std::to_string(start_iteration), why);
    }
    metrics_ =
        std::make_unique<MetricsWriter>(*cfg.log.metrics, start_iteration > 0, cfg.source_file);
  }
}

void Reporter::log_failed(const std::string& key, const std::string& path, const std::string& when,
                          const std::string& why) {
  const std::string log = key + " " + path;
  for (const std::string& l : res_.incomplete_logs)
    if (l == log) return;  // warned at its first failure
  res_.incomplete_logs.push_back(log);
  std::fprintf(stderr, "warning: %s: cannot write %s (%s): %s; the log is incomplete\n",
               key.c_str(), path.c_str(), when.c_str(), why.c_str());
  std::fflush(stderr);
}

void Reporter::banner(const DataSource& data, const std::string& comm, const ScheduleSpec& spec,
                      bool sharded_optimizer) const {
  if (!lead_) return;
  const Config& cfg = *run_.cfg;
  std::printf("strata train: %s\n", cfg.source_file.c_str());
  // Context and expert sizes where used: tensor × context × pipeline × data is the world.
  const std::string context =
      run_.layout.context > 1 ? " × context " + std::to_string(run_.layout.context) : "";
  const std::string expert =
      run_.layout.expert > 1 ? ", expert groups of " + std::to_string(run_.layout.expert) : "";
  std::printf("  backend  %s; %d rank(s): tensor %d%s × pipeline %d × data %d%s%s%s\n",
              be_.name().c_str(), run_.world->size, run_.layout.tensor, context.c_str(),
              run_.layout.pipeline, run_.layout.data, expert.c_str(),
              run_.layout.sequence_parallel ? ", sequence parallel" : "",
              sharded_optimizer ? ", distributed optimizer" : "");
  if (run_.world->size > 1) std::printf("  comm     %s\n", comm.c_str());
  if (run_.layout.pipeline > 1) {
    std::printf("  pipeline %s, %d micro-batches, %d chunk(s) per stage, layers per piece",
                to_string(spec.kind), run_.layout.num_microbatches, spec.chunks);
    for (int n : run_.layout.layers_per_piece) std::printf(" %d", n);
    std::printf("\n");
  }
  std::printf("  model    %s: %s parameters\n", model_summary_.c_str(),
              si(static_cast<double>(parameters_)).c_str());
  std::printf("  data     %s\n", data.describe().c_str());
  if (res_.loss_floor)
    std::printf("  floor    best achievable loss at seq %d: %.4f nats/token (entropy rate %.4f)\n",
                run_.seq_len, *res_.loss_floor, data.entropy_rate().value_or(0));
  std::printf(
      "  batch    %d sequences × %d tokens = %d micro-batches of %d × data %d; "
      "%d iterations\n",
      run_.global, run_.seq_len, run_.layout.num_microbatches, run_.layout.micro_batch_size,
      run_.layout.data, cfg.train.iterations);
  std::fflush(stdout);
}

void Reporter::step(const StepRecord& r, double step_s, double bubble,
                    std::optional<double> val_loss,
                    const std::optional<std::pair<std::vector<int32_t>, std::string>>& sample) {
  const Config& cfg = *run_.cfg;
  const int it = r.batch + 1, iters = cfg.train.iterations;
  res_.bubbles.push_back(bubble);
  res_.step_s.push_back(step_s);
  IterationMetrics mt;
  mt.iter = it;
  mt.loss = r.loss;
  mt.lr = r.lr;
  mt.grad_norm = r.norm;
  mt.step_ms = step_s * 1e3;
  mt.tokens_per_s = run_.tokens_per_iteration() / step_s;
  mt.tflops_per_gpu = flops_.hardware / step_s / run_.world->size / 1e12;
  if (const std::optional<double> peak = be_.peak_flops(cfg.train.precision))
    mt.mfu = flops_.model / step_s / run_.world->size / *peak;
  mt.bubble = bubble;
  mt.mem_peak_bytes = be_.allocator().stats().total_peak;
  mt.skipped = !r.finite;
  mt.val_loss = val_loss;
  mt.aux_loss = r.aux_loss;
  mt.expert_load = r.expert_load;
  if (val_loss) res_.val_losses.emplace_back(it, *val_loss);
  if (sample) {
    mt.sample_ids = sample->first;
    mt.sample_text = sample->second;
    res_.samples.emplace_back(it, sample->first);
  }
  res_.losses.push_back(r.loss);
  res_.grad_norms.push_back(r.norm);
  if (r.aux_loss) res_.aux_losses.push_back(*r.aux_loss);
  if (r.expert_load) res_.expert_loads.push_back(*r.expert_load);
  res_.step_wait_s.push_back(r.wait_s);
  res_.skipped.push_back(!r.finite);
  if (metrics_) {
    const std::string why = metrics_->write(mt);
    if (!why.empty())
      log_failed("log.metrics", metrics_->path(), "iteration " + std::to_string(it), why);
  }
  ++interval_steps_;
  interval_s_ += step_s;
  const auto now = std::chrono::steady_clock::now();
  const bool heartbeat = std::chrono::duration<double>(now - last_line_).count() >= kHeartbeatS;
  if (lead_ && (it % cfg.log.interval == 0 || it == 1 || it == iters || val_loss || heartbeat)) {
    // Step time: this step's and the mean since the last line; the rates are the mean's, the
    // FLOP/s those of one rank (the job's are world × that); ETA at the mean.
    const double mean_s = interval_s_ / interval_steps_;
    std::printf("iter %5d/%d | loss %.4f%s | lr %.2e | gnorm %.3f | %7.1f ms", it, iters, r.loss,
                r.finite ? "" : " (skipped)", mt.lr, r.norm, mt.step_ms);
    if (interval_steps_ > 1) std::printf(" (mean %.1f)", mean_s * 1e3);
    std::printf(" | %s tok/s | %sFLOP/s per rank", si(run_.tokens_per_iteration() / mean_s).c_str(),
                si(flops_.hardware / mean_s / run_.world->size).c_str());
    if (const std::optional<double> peak = be_.peak_flops(cfg.train.precision))
      std::printf(" | MFU %.1f%%", 100.0 * flops_.model / mean_s / run_.world->size / *peak);
    std::printf(" | mem %s", format_bytes(mt.mem_peak_bytes).c_str());
    if (const int64_t capacity = be_.device_memory_bytes(); capacity > 0)
      std::printf(" of %s", format_bytes(capacity).c_str());
    if (run_.layout.pipeline > 1)
      std::printf(" | bubble %.2f (theory %.2f)", bubble, res_.theoretical_bubble);
    if (mt.val_loss) std::printf(" | val %.4f", *mt.val_loss);
    if (mt.aux_loss) std::printf(" | aux %.4f | load %.2f", *mt.aux_loss, *mt.expert_load);
    const double elapsed = std::chrono::duration<double>(now - t_start_).count();
    std::printf(" | %s", clock_time(elapsed).c_str());
    if (it < iters) std::printf(", ETA %s", clock_time(mean_s * (iters - it)).c_str());
    std::printf("\n");
    // Slurm's output files and `| tee` get each line as it is printed: stdout is fully buffered
    // when it is not a terminal.
    std::fflush(stdout);
    interval_steps_ = 0;
    interval_s_ = 0;
    last_line_ = now;
  }
  if (lead_ && sample) {
    std::printf("sample %5d |", it);
    if (sample->second.empty())
      for (int32_t id : sample->first) std::printf(" %d", id);
    else
      std::printf(" %s", sample->second.c_str());
    std::printf("\n");
    std::fflush(stdout);
  }
}

std::string clock_time(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

void Reporter::keep_timeline(const PipelineExecutor& exec, const GradReducer& reducer,
                             std::chrono::steady_clock::time_point t0) {
  res_.bucket_start_s = reducer.bucket_start_s();
  double bwd_end = 0;
  for (const PipelineEvent& e : exec.events())
    if (e.op == Op::kBackward || e.op == Op::kBackwardInput) bwd_end = std::max(bwd_end, e.end_s);
  res_.backward_end_s = bwd_end;
  if (run_.cfg->log.trace)
    for (const PipelineEvent& e : exec.events())
      trace_.emplace_back(std::chrono::duration<double>(t0 - t_start_).count(), e);
}

void Reporter::write_trace(Communicator& host, bool last) {
  const Config& cfg = *run_.cfg;
  if (!cfg.log.trace) return;
  // Every rank's events since the last call, to rank 0, which appends them: the trace is written
  // as the run goes (bounded memory; a killed run keeps what came before), and the closing
  // brackets come with the last call.
  const std::vector<std::string> parts =
      all_gather_strings(host, trace_events_json(trace_, run_.world->rank));
  trace_.clear();
  if (run_.world->rank != 0) return;
  std::string text;
  if (!trace_out_) {
    trace_out_ = std::make_unique<LogFile>(*cfg.log.trace, false, cfg.source_file, "log.trace");
    text = "{\"traceEvents\": [";
    // Metadata first: the run (its layout, device, model size: what strata plan --measured
    // checks against the plan it draws above it) and each rank's track, named with its
    // tensor, pipeline, data and context coordinates (strata trace-svg's row labels).
    const ParallelLayout& l = run_.layout;
    std::vector<nlohmann::json> meta = {{{"name", "process_name"},
                                         {"ph", "M"},
                                         {"pid", 0},
                                         {"args",
                                          {{"name", "strata train " + cfg.source_file},
                                           {"layout", plan_config_json(l)},
                                           {"world_size", run_.world->size},
                                           {"device", to_string(run_.tensor_device())},
                                           {"backend", be_.name()},
                                           {"model", model_summary_},
                                           {"parameters", parameters_}}}}};
    const GroupLayout g = group_layout(l.tensor, l.pipeline, l.data, l.expert, l.context);
    for (int r = 0; r < run_.world->size; ++r) {
      const RankCoord c = g.coord(r);
      std::string name = "rank " + std::to_string(r) + ": tp " + std::to_string(c.tp) + " pp " +
                         std::to_string(c.pp) + " dp " + std::to_string(c.dp);
      if (l.context > 1) name += " cp " + std::to_string(c.cp);
      meta.push_back(
          {{"name", "thread_name"},
           {"ph", "M"},
           {"pid", 0},
           {"tid", r},
           {"args", {{"name", name}, {"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}, {"cp", c.cp}}}});
    }
    for (const nlohmann::json& e : meta) {
      text += (trace_events_ == 0 ? "\n" : ",\n") + e.dump();
      ++trace_events_;
    }
  }
  for (const std::string& part : parts) {
    const nlohmann::json arr = nlohmann::json::parse(part);
    for (const auto& e : arr) {
      text += (trace_events_ == 0 ? "\n" : ",\n") + e.dump();
      ++trace_events_;
    }
  }
  if (last) text += "\n], \"displayTimeUnit\": \"ms\"}\n";
  const std::string why = trace_out_->write(text);
  if (!why.empty()) log_failed("log.trace", trace_out_->path(), "the trace of the run", why);
  if (last) trace_out_.reset();
}

void Reporter::summary() const {
  const int iters = res_.stopped_by_signal ? res_.stopped_at : run_.cfg->train.iterations;
  if (lead_ && !res_.stopped_by_signal && iters <= res_.start_iteration) {
    // A finished run started again: its checkpoint is already at train.iterations.
    std::printf(
        "already complete: resumed at iteration %d of %d, nothing to train (raise "
        "train.iterations to train on)\n",
        res_.start_iteration, iters);
    std::fflush(stdout);
    return;
  }
  if (!lead_ || iters <= res_.start_iteration || res_.losses.empty()) return;
  std::printf("%s: %d iterations in %.1f s | final loss %.4f",
              res_.stopped_by_signal ? "stopped" : "done", iters, res_.wall_s, res_.losses.back());
  if (!res_.val_losses.empty()) std::printf(" | val %.4f", res_.val_losses.back().second);
  if (res_.loss_floor) {
    const double last =
        res_.val_losses.empty() ? res_.losses.back() : res_.val_losses.back().second;
    std::printf(" | floor %.4f (+%.4f nats)", *res_.loss_floor, last - *res_.loss_floor);
  }
  std::printf(" | %s tok/s | peak memory %s per rank\n", si(res_.tokens_per_s).c_str(),
              format_bytes(res_.memory.total_peak).c_str());
  std::fflush(stdout);
}

}  // namespace strata
