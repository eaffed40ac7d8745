// head.h — the slot at the top of a transformer (models/transformer/transformer.h): what turns
// the last block's output into a loss. A decoder's is the LM head (lm_head.h: final norm,
// vocab-parallel logits, cross-entropy); BERT's the pre-training heads (models/bert/).
//
// A head is a HeadSpec (what it is: how to declare it on a rank, and its self-description for
// the planner, read without building anything) and the ModelHead it declares on the rank that
// holds the last piece (its layers, forward, backward, gradient reports, and for a head that
// generates, the logits of the newest positions).
//
// Tied embeddings: a head that computes with the token table (ties_embedding) gets it in
// HeadContext::table when this rank holds the embedding too; on a pipeline whose first stage is
// another rank it declares the last stage's own copy (declare_tied_table), same name, so the
// same initial values; the stage sums the two gradients every step, so they stay equal.
//
// Thread-safety: as the model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/layers/embedding.h"
#include "models/layers/parallel.h"
#include "models/layers/work.h"
#include "models/model.h"

namespace strata {

// What a head is declared with.
struct HeadContext {
  VocabShard vocab;        // the vocabulary as this rank holds it
  int64_t C = 0;           // hidden size
  double init_std = 0.02;  // weights N(0, init_std)
  ParamRef table;          // the token table when this rank holds the embedding, else invalid
  std::string table_name;  // its name
};

// ctx.table, or (when this rank does not hold the embedding) the last stage's own copy of the
// token table, declared here.
ParamRef declare_tied_table(ParamLayout& layout, const HeadContext& ctx);

// What a head's forward keeps for its backward (each head derives its own).
class HeadActs {
 public:
  virtual ~HeadActs() = default;
};

class ModelHead {
 public:
  virtual ~ModelHead() = default;
  // y (B, Sl, C): the last block's output. *loss: the micro-batch's LossSum.
  virtual std::unique_ptr<HeadActs> forward(const LayerEnv& env, const Tensor& y,
                                            const ModelBatch& batch, LossSum* loss) const = 0;
  // The gradient of y from the loss scaled by grad_scale (acts consumed; the largest tensors
  // released as soon as they are used).
  virtual Tensor backward(const LayerEnv& env, BackwardPass& pass, HeadActs& acts, const Tensor& y,
                          const ModelBatch& batch, float grad_scale) const = 0;
  // Reports its parameters' gradients final (ParamStore::report_ready).
  virtual void report_ready(ParamStore& store) const = 0;
  // Generation: each sequence's last new position of x (B, T, C) over the whole vocabulary,
  // (B, V) f32 on the host, the same on every rank of the group. Heads that do not generate
  // refuse (HeadSpec::generates).
  virtual void decode_logits(const LayerEnv& env, const Tensor& x,
                             std::vector<float>* logits) const;
};

class HeadSpec {
 public:
  virtual ~HeadSpec() = default;
  // Computes with the token table (a copy on the last stage when the first is another rank).
  virtual bool ties_embedding() const = 0;
  // Whether the model generates text (a decoder's LM head) or not (an encoder's).
  virtual bool generates() const = 0;
  // Declares its parameters into `layout` (the flat order: they follow the last layer's).
  virtual std::unique_ptr<ModelHead> declare(ParamLayout& layout, const HeadContext& ctx) const = 0;

  // ---- self-description: one micro-batch of shape s, hidden C, vocabulary V padded to Vp ----
  virtual PartWork work(int64_t C, int64_t Vp, const WorkShape& s) const = 0;
  virtual ActivationElems activations(int64_t C, int64_t Vp, const WorkShape& s) const = 0;
  // Forward FLOPs (Megatron-LM's counting) per token and per sequence.
  virtual double flops_per_token(int64_t C, int V) const = 0;
  virtual double flops_per_sequence(int64_t C) const { return 0; }
};

}  // namespace strata
