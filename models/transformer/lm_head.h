// lm_head.h — a decoder's head (GPT-2's and Llama's): the final norm, the vocab-parallel LM head
// (the token table when tied, its own (Vp, C) weight when not), and Megatron's vocab-parallel
// cross-entropy over the next tokens.
//
//   logits (B·S, Vp/t) = norm(y) · Wᵀ        loss = Σ cross-entropy(logits, targets)
//
// Parameters, after the last layer's: `norm_name`.weight[, .bias], then `lm_head_name`.weight
// when untied (padded rows stay 0, as the table's), or on a stage without the embedding the copy
// of the tied table. With sequence parallelism the LM head gathers its input (a column-parallel
// layer), so the logits cover the whole sequence on every rank.
//
// Thread-safety: as the model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/layers/cross_entropy.h"
#include "models/layers/linear.h"
#include "models/layers/norm.h"
#include "models/transformer/head.h"

namespace strata {

// The head of a decoder: its final norm (`norm`, named `norm_name`), the LM head (tied to the
// token table, or its own weight `lm_head_name`) and the loss. Its self-description: the norm, the
// (b·s, V/t) logits GEMM with its input's gather (sp) and its input gradient's reduction, the fp32
// loss over the logits (its statistics, target and gradient: three passes) and its three
// reductions over the group (row max, Σexp, target logit); it keeps the norm's output and
// statistics, the logits and their row statistics, and its backward holds d(logits) beside them,
// d(norm) over the full sequence and the residual gradient.
std::shared_ptr<const HeadSpec> lm_head_spec(NormSpec norm, std::string norm_name, bool tie,
                                             std::string lm_head_name);

// The logits (B·S, Vp/t) of a last-piece forward of a model with an LM head (valid until its
// backward consumes them).
const Tensor& lm_logits(const PieceActs& acts);

}  // namespace strata
