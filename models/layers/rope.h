// rope.h — rotary position embeddings (Su et al., RoFormer), as Llama applies them to the
// queries and keys of every attention layer.
//
// Convention: Hugging Face's (rotate_half): the pairs rotated together are (x[i], x[i + HS/2]),
// i < HS/2, not Meta's interleaved (x[2i], x[2i+1]); Hugging Face's conversion of Meta's weights
// permutes the q/k projection rows so that the two agree, and Strata takes Hugging Face's rows as
// they are. Angle of pair i at position s: s · inv_freq[i], inv_freq[i] = theta^(−2i/HS), with
// Llama 3.1's rope_scaling (RopeScaling in runtime/base/config.h) applied to inv_freq when given.
//
// The model builds one table of cos and sin per position (RotaryEmbedding) and every attention
// layer rotates its q/k in place with it (Backend::rope_forward); the backward rotates the
// gradient back (the rotation's transpose).
//
// Thread-safety: as the model.
#pragma once

#include <optional>
#include <vector>

#include "models/layers/parallel.h"
#include "runtime/base/config.h"

namespace strata {

// inv_freq (HS/2) for head size HS, computed in double.
std::vector<double> rope_inverse_frequencies(int head_size, double theta,
                                             const std::optional<RopeScaling>& scaling);

class RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  // The (max_positions, HS) f32 table on `backend`: row s = [cos(s·inv_freq) | sin(s·inv_freq)].
  // With `positions` (context parallelism: the positions of a rank's rows), row s is that of
  // position positions[s] instead, one row per entry.
  RotaryEmbedding(Backend& backend, int64_t max_positions, int head_size, double theta,
                  const std::optional<RopeScaling>& scaling,
                  const std::vector<int64_t>& positions = {});

  // qkv (B, S, (heads + 2·kv_heads)·HS) in place: queries and keys rotated by position.
  void forward(const LayerEnv& env, Tensor& qkv, int heads, int kv_heads) const;
  // Generation: T new positions from pos0 (qkv (B, T, …)) rotated in place.
  void forward_at(const LayerEnv& env, Tensor& qkv, int heads, int kv_heads, int64_t pos0) const;
  // dqkv of the same layout in place: the gradient of the rotation's input.
  void backward(const LayerEnv& env, Tensor& dqkv, int heads, int kv_heads) const;

  Tensor table;  // (max_positions, HS) f32
};

}  // namespace strata
