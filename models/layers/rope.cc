#include "models/layers/rope.h"

#include <cmath>

namespace strata {

std::vector<double> rope_inverse_frequencies(int head_size, double theta,
                                             const std::optional<RopeScaling>& scaling) {
  const int half = head_size / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv[static_cast<size_t>(i)] = 1.0 / std::pow(theta, 2.0 * i / head_size);
  if (!scaling) return inv;
  // Llama 3.1: long wavelengths (beyond the original context / low_freq_factor) slowed down by
  // `factor`, short ones (below the original context / high_freq_factor) kept, a smooth blend
  // between (Hugging Face's _compute_llama3_parameters).
  const RopeScaling& r = *scaling;
  const double context = r.original_max_position_embeddings;
  const double low_wavelen = context / r.low_freq_factor;
  const double high_wavelen = context / r.high_freq_factor;
  const double two_pi = 2.0 * std::acos(-1.0);
  for (double& f : inv) {
    const double wavelen = two_pi / f;
    if (wavelen > low_wavelen) {
      f /= r.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      f = (1 - smooth) * f / r.factor + smooth * f;
    }
  }
  return inv;
}

RotaryEmbedding::RotaryEmbedding(Backend& backend, int64_t max_positions, int head_size,
                                 double theta, const std::optional<RopeScaling>& scaling,
                                 const std::vector<int64_t>& positions) {
  const std::vector<double> inv = rope_inverse_frequencies(head_size, theta, scaling);
  const int half = head_size / 2;
  const int64_t rows = positions.empty() ? max_positions : static_cast<int64_t>(positions.size());
  std::vector<float> host(static_cast<size_t>(rows * head_size));
  for (int64_t s = 0; s < rows; ++s) {
    float* row = host.data() + s * head_size;
    const double at =
        static_cast<double>(positions.empty() ? s : positions[static_cast<size_t>(s)]);
    for (int i = 0; i < half; ++i) {
      const double angle = at * inv[static_cast<size_t>(i)];
      row[i] = static_cast<float>(std::cos(angle));
      row[half + i] = static_cast<float>(std::sin(angle));
    }
  }
  table = backend.empty({rows, head_size}, MemCategory::kBuffers);
  backend.upload(table, host.data());
}

void RotaryEmbedding::forward(const LayerEnv& env, Tensor& qkv, int heads, int kv_heads) const {
  env.be.rope_forward(qkv, table, heads, kv_heads);
}

void RotaryEmbedding::forward_at(const LayerEnv& env, Tensor& qkv, int heads, int kv_heads,
                                 int64_t pos0) const {
  const int64_t HS = table.size(1);  // rows from pos0
  env.be.rope_forward(qkv, table.view(pos0 * HS, {table.size(0) - pos0, HS}), heads, kv_heads);
}

void RotaryEmbedding::backward(const LayerEnv& env, Tensor& dqkv, int heads, int kv_heads) const {
  env.be.rope_backward(dqkv, table, heads, kv_heads);
}

}  // namespace strata
