#include "launch/train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "runtime/base/error.h"

namespace strata {

namespace {
// JSON has no NaN or Infinity: a non-finite figure is written as null.
nlohmann::json number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nullptr;
}
}  // namespace

std::string metrics_json(const IterationMetrics& m) {
  nlohmann::ordered_json j;
  j["iter"] = m.iter;
  j["loss"] = number(m.loss);
  j["lr"] = m.lr;
  j["grad_norm"] = number(m.grad_norm);
  j["step_ms"] = m.step_ms;
  j["tokens_per_s"] = m.tokens_per_s;
  j["tflops_per_gpu"] = m.tflops_per_gpu;
  j["mfu"] = m.mfu ? number(*m.mfu) : nullptr;
  j["bubble"] = m.bubble;
  j["mem_peak_bytes"] = m.mem_peak_bytes;
  if (m.val_loss) j["val_loss"] = number(*m.val_loss);
  if (m.aux_loss) j["aux_loss"] = number(*m.aux_loss);
  if (m.expert_load) j["expert_load"] = number(*m.expert_load);
  if (m.sample_ids) j["sample"] = {{"ids", *m.sample_ids}, {"text", m.sample_text}};
  if (m.skipped) j["skipped"] = true;
  // A sample's text may hold bytes that are not UTF-8 (a byte model mid-character): replaced
  // with U+FFFD, never a failed line.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

LogFile::LogFile(const std::string& path, bool append, const std::string& config_file,
                 const std::string& key)
    : path_(path), f_(std::fopen(path.c_str(), append ? "a" : "w")) {
  if (!f_) throw InputError(config_file, key, "a writable file path, got \"" + path + "\"");
}

LogFile::~LogFile() {
  std::fclose(f_);
}

std::string LogFile::write(const std::string& text) {
  errno = 0;
  const size_t n = std::fwrite(text.data(), 1, text.size(), f_);
  const bool ok = std::fflush(f_) == 0 && n == text.size();
  if (ok) return "";
  const std::string why = errno != 0 ? std::strerror(errno) : "a short write";
  std::clearerr(f_);
  return why;
}

MetricsWriter::MetricsWriter(const std::string& path, bool append, const std::string& config_file)
    : out_(path, append, config_file, "log.metrics") {}

std::string MetricsWriter::write(const IterationMetrics& m) {
  // Flushed per line: a crashed run keeps every completed iteration's line.
  return out_.write(metrics_json(m) + "\n");
}

}  // namespace strata
