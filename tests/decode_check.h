// decode_check.h — a model's greedy decoding over its key/value caches against its own training
// forward: the argmax of every decoded position must be the forward's argmax at that position
// (for the layers' decode paths: QK-norm, the mixture's router per new token, …).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "models/model.h"
#include "models/transformer/lm_head.h"
#include "runtime/backend/backend.h"

namespace strata {

// Decodes `steps` tokens greedily after `prompt` (one sequence), then runs the whole sequence
// through the training forward and checks each position's argmax over the first `vocab` logits.
inline void expect_decoding_follows_forward(Model& model, Backend& be, int vocab,
                                            std::vector<int32_t> prompt, int steps) {
  const int P = static_cast<int>(prompt.size());
  std::unique_ptr<GenerationState> st = model.start_generation(1, P + steps);
  std::vector<int32_t> seq = prompt, step = prompt;
  for (int n = 0; n < steps; ++n) {
    const std::vector<float> logits = model.decode(*st, step, static_cast<int>(step.size()));
    step = {static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + vocab) -
                                 logits.begin())};
    seq.push_back(step[0]);
  }
  const int S = static_cast<int>(seq.size()) - 1;
  Tensor tokens = be.empty({1, S}, MemCategory::kActivations, DType::kI32);
  Tensor targets = be.empty({1, S}, MemCategory::kActivations, DType::kI32);
  for (int i = 0; i < S; ++i) {
    tokens.i32()[i] = seq[static_cast<size_t>(i)];
    targets.i32()[i] = 0;
  }
  LossSum l;
  PieceActsPtr acts = model.forward(ModelBatch{tokens, targets}, &l);
  const Tensor& logits = lm_logits(*acts);
  for (int i = P - 1; i < S; ++i) {
    const float* row = logits.f32() + int64_t{i} * logits.size(1);
    EXPECT_EQ(std::max_element(row, row + vocab) - row, seq[static_cast<size_t>(i) + 1])
        << "position " << i;
  }
}

}  // namespace strata
