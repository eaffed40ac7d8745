#include "runtime/metrics.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace strata {

namespace {
// JSON has no NaN or Infinity: a non-finite figure is written as null.
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nullptr; }
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
  if (m.sample_ids) j["sample"] = {{"ids", *m.sample_ids}, {"text", m.sample_text}};
  if (m.skipped) j["skipped"] = true;
  // A sample's text may hold bytes that are not UTF-8 (a byte model mid-character): replaced
  // with U+FFFD, never a failed line.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

MetricsWriter::MetricsWriter(const std::string& path, bool append,
                             const std::string& config_file)
    : out_(path, append ? std::ios::app : std::ios::trunc) {
  if (!out_) throw InputError(config_file, "log.metrics", "a writable file path, got \"" + path + "\"");
}

void MetricsWriter::write(const IterationMetrics& m) {
  out_ << metrics_json(m) << '\n';
  out_.flush();  // a crashed run keeps every completed iteration's line
}

}  // namespace strata
