#include "runtime/engine/optimizer.h"

#include <algorithm>
#include <cmath>

#include "runtime/base/check.h"

namespace strata {

double learning_rate(const OptimizerConfig& o, int total_iterations, int it) {
  const int warmup = o.warmup_iters;
  const int decay_iters = o.decay_iters.value_or(total_iterations);
  if (warmup > 0 && it <= warmup) return o.lr * it / warmup;
  if (o.decay == "constant") return o.lr;
  if (o.decay == "inverse-square-root") {  // lr·√warmup / √it after the warm-up, down to min_lr
    if (it > decay_iters) return o.min_lr;
    return std::max(o.min_lr, o.lr * std::sqrt(std::max(warmup, 1)) / std::sqrt(std::max(it, 1)));
  }
  if (it >= decay_iters || decay_iters <= warmup) return o.min_lr;
  const double delta = o.lr - o.min_lr;
  if (o.decay == "wsd") {
    const int cooldown = o.wsd_decay_iters.value_or(0);
    const int start = decay_iters - cooldown;
    if (cooldown <= 0 || it <= start) return o.lr;
    const double r = static_cast<double>(it - start) / cooldown;
    double coeff = 2.0 * std::pow(0.5, r) - 1.0;  // exponential: 1 → 0
    if (o.wsd_decay_style == "linear") coeff = 1.0 - r;
    if (o.wsd_decay_style == "cosine") coeff = 0.5 * (1.0 + std::cos(M_PI * r));
    if (o.wsd_decay_style == "minus_sqrt") coeff = 1.0 - std::sqrt(r);
    return o.min_lr + coeff * delta;
  }
  const double ratio = static_cast<double>(it - warmup) / (decay_iters - warmup);
  if (o.decay == "linear") return o.lr - ratio * delta;
  return o.min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * delta;
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

AdamW::AdamW(Backend& backend, const OptimizerConfig& cfg, std::vector<OptSegment> segments)
    : be_(backend), cfg_(cfg), segments_(std::move(segments)) {
  int64_t n = 0;
  for (const OptSegment& s : segments_) n = std::max(n, s.state_offset + s.numel);
  m_ = be_.zeros({n}, MemCategory::kOptimizer);
  v_ = be_.zeros({n}, MemCategory::kOptimizer);
}

void AdamW::step(Tensor& params, const Tensor& grads, double lr, double grad_scale) {
  ++step_;
  std::vector<Backend::AdamWRange> ranges;
  ranges.reserve(segments_.size());
  for (const OptSegment& s : segments_) {
    if (s.numel == 0) continue;
    ranges.push_back({params.view(s.param_offset, {s.numel}), grads.view(s.state_offset, {s.numel}),
                      m_.view(s.state_offset, {s.numel}), v_.view(s.state_offset, {s.numel}),
                      s.decay});
  }
  Backend::AdamWHyper h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(cfg_.beta1), h.beta2 = static_cast<float>(cfg_.beta2);
  h.eps = static_cast<float>(cfg_.eps), h.weight_decay = static_cast<float>(cfg_.weight_decay);
  h.step = step_;
  h.grad_scale = static_cast<float>(grad_scale);
  be_.adamw_update_multi(ranges, h);
}

}  // namespace strata
