// metrics.h — the per-iteration metrics stream (JSON Lines) and the console progress line.
//
// Rank 0 writes one JSON object per optimizer step to log.metrics with the keys fixed by
// docs/contracts.md: iter, loss, lr, grad_norm, step_ms, tokens_per_s, tflops_per_gpu, mfu, bubble,
// mem_peak_bytes, plus val_loss on evaluation iterations and skipped: true on a skipped step; a
// mixture of experts adds aux_loss and expert_load.
// Keys may be added, never renamed. A line that cannot be written (a full disk) is reported to
// the caller, which warns and ends the run with exit status 3 (launch/train/reporting.h).
//
// Thread-safety: one writer, used from the training thread of rank 0.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace strata {

struct IterationMetrics {
  int iter = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;  // hardware FLOPs (recompute included)
  std::optional<double> mfu;  // model FLOPs / device peak; null where the peak is unknown
  double bubble = 0;          // measured compute-idle fraction of the step
  int64_t mem_peak_bytes = 0;
  std::optional<double> val_loss;  // evaluation iterations only
  // A mixture of experts: coef × the load-balancing loss and the worst layer's expert load.
  std::optional<double> aux_loss, expert_load;
  bool skipped = false;  // a non-finite step that was not applied
  // log.sample_interval steps: the greedy sample's new tokens and their text ("" if none).
  std::optional<std::vector<int32_t>> sample_ids;
  std::string sample_text;
};

// A log file (log.metrics, log.trace) whose failed writes are reported, not dropped: on a full
// disk a run must not end with empty logs, status 0 and no word about it.
class LogFile {
 public:
  // Opens `path` for writing (appending when `append`). InputError(config_file, key, …) when it
  // cannot be opened.
  LogFile(const std::string& path, bool append, const std::string& config_file,
          const std::string& key);
  ~LogFile();
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

  // Writes `text` and flushes it to the system: "" when all of it was written, else why not in
  // the system's words ("No space left on device").
  std::string write(const std::string& text);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

class MetricsWriter {
 public:
  // Opens `path` for writing (append when `append`, e.g. after a resume). `config_file` names
  // the config in the error when the file cannot be opened. Throws InputError.
  MetricsWriter(const std::string& path, bool append, const std::string& config_file);
  // Writes the iteration's line: "" when written, else why not (LogFile::write).
  std::string write(const IterationMetrics& m);
  const std::string& path() const { return out_.path(); }

 private:
  LogFile out_;
};

// The JSON object of one iteration, as one line without the newline.
std::string metrics_json(const IterationMetrics& m);

}  // namespace strata
