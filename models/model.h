// model.h — the one interface between a model and everything that trains, saves, profiles or
// plans it.
//
// The trainer's pipeline stage, the checkpointer, Hugging Face import/export, `strata profile`
// and the planner see a model only through this header and models/description.h; they never name
// an architecture's parameters or layers. An architecture is a folder under models/ (models/gpt/)
// that implements Model from the reusable tensor-parallel layers of models/layers/ and registers
// itself in models/registry.cc (docs/architecture.md: how to add one).
//
// A rank holds pieces of the model (ModelPiece): contiguous runs of transformer layers, the
// first piece with the embedding, the last with the head and the loss. A pipeline stage holds one
// piece, or v with interleaving (piece k = chunk·p + stage). Activations travel between pieces as
// (B, S_local, C) tensors (boundary_shape): S_local = S/t with sequence parallelism.
//
// Gradients: backward passes ACCUMULATE into the parameter gradients (micro-batches sum). The
// loss of a micro-batch is the sum of its token losses (LossSum, with the count of tokens that
// counted); the caller scales the backward by 1 / (tokens of the global batch), so the summed
// gradient is that of the global mean loss.
//
// Thread-safety: one model per rank, driven from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/layers/params.h"
#include "runtime/backend/backend.h"
#include "runtime/base/recompute.h"
#include "runtime/comm/comm.h"
#include "runtime/memory/tensor.h"

namespace strata {

// A contiguous piece of the model: layers [first_layer, first_layer + num_layers), plus the
// embedding when it is the first piece and the head (final norm, LM head, loss) when it is the
// last.
struct ModelPiece {
  int first_layer = 0;
  int num_layers = 0;
  bool embedding = false;
  bool head = false;
};

// One micro-batch on the model's device.
struct ModelBatch {
  ModelBatch() = default;
  ModelBatch(Tensor tokens_, Tensor targets_, Tensor loss_mask_ = Tensor())
      : tokens(std::move(tokens_)),
        targets(std::move(targets_)),
        loss_mask(std::move(loss_mask_)) {}

  Tensor tokens;     // (B, S) i32, read by the embedding
  Tensor targets;    // (B, S) i32, read by the loss
  Tensor loss_mask;  // (B, S) f32: 1 where a position counts in the loss; undefined: all count
  // Masked language modelling (an encoder's batch, runtime/data/data_source.h's SampleBatch),
  // undefined for a decoder:
  Tensor token_types;      // (B, S) i32: 0 for [CLS] A [SEP], 1 for B [SEP] (0 on padding)
  Tensor key_lengths;      // (B) i32: the real tokens of each sequence; the rest is padding
  Tensor sentence_labels;  // (B) i32: the sentence task's label of each sequence
  // What one sequence's sentence loss weighs in the LossSum, whose count is the masked tokens:
  // the tokens that count in the global batch per sequence of it, so that the loss of an
  // iteration is the token loss averaged over its tokens plus the sentence loss averaged over
  // its sequences (BERT's). The pipeline stage sets it from the data (DataSource::loss_tokens).
  double sentence_loss_weight = 1;
};

// Σ of the token losses of a micro-batch and how many tokens they are.
struct LossSum {
  double sum = 0;
  double count = 0;
  // A mixture of experts (on the piece that holds its MoE layers): the load-balancing term of
  // the micro-batch, times its coefficient (added to the objective, not to `sum`), and the
  // worst layer's max / mean assignments per expert.
  double aux = 0;
  double expert_load = 0;
};

// What a piece's forward keeps for its backward (each architecture derives its own).
class PieceActs {
 public:
  virtual ~PieceActs() = default;
};
using PieceActsPtr = std::unique_ptr<PieceActs>;

// How this rank instantiates the model.
struct ModelOptions {
  int tensor = 1;                        // tensor-parallel size t
  int tensor_rank = 0;                   // this rank's place in the tensor group
  Communicator* tensor_group = nullptr;  // null when t = 1
  // Expert parallelism (a mixture of experts): the size e of the expert group, this rank's place
  // in it, and the group (null when e = 1). A rank holds experts [rank·E/e, (rank+1)·E/e).
  int expert = 1;
  int expert_rank = 0;
  Communicator* expert_group = nullptr;
  // Context parallelism: the size c of the context group, this rank's place in it and the group
  // (null when c = 1). The rank holds chunks context_rank and 2c−1−context_rank of the 2c chunks
  // of every sequence (its batches hold only those positions: seq_len / c of them) and runs
  // ring attention over the group.
  int context = 1;
  int context_rank = 0;
  Communicator* context_group = nullptr;
  bool sequence_parallel = false;
  // Mixed precision: activations, their gradients and a compute copy of the weights are bf16;
  // the fp32 parameters stay the master copy and gradients stay fp32.
  bool bf16 = false;
  Recompute recompute = Recompute::kNone;
  std::vector<ModelPiece> pieces;  // what this rank holds; empty: the whole model
  uint64_t seed = 0;               // train.seed: initialisation
};

// What generation keeps between steps for a batch of sequences (a model's key/value caches).
class GenerationState {
 public:
  virtual ~GenerationState() = default;
  int batch = 0;
  int64_t length = 0;    // positions filled
  int64_t capacity = 0;  // positions the caches hold
  int64_t width = 0;     // of what passes between pieces: (batch, T, width) activations
  int64_t vocab = 0;     // logits per sequence
};

class Model {
 public:
  virtual ~Model() = default;

  // This rank's parameters, their layout and gradients (flat buffers).
  virtual ParamStore& params() = 0;
  virtual const ParamStore& params() const = 0;
  virtual const std::vector<ModelPiece>& pieces() const = 0;

  // The element type of activations and of what crosses a pipeline boundary.
  virtual DType activation_dtype() const = 0;
  // Shape of the activation (and its gradient) between two pieces for a micro-batch of
  // `micro_batch` sequences of `seq_len` tokens.
  virtual Shape boundary_shape(int micro_batch, int seq_len) const = 0;

  // Forward of one micro-batch through piece `piece` (index into pieces()): `input` is the
  // previous piece's output, undefined on the first piece (which reads batch.tokens). On the
  // last piece *loss receives the loss of the micro-batch, elsewhere {0, 0}.
  virtual PieceActsPtr forward_piece(int piece, const Tensor& input, const ModelBatch& batch,
                                     LossSum* loss) = 0;
  // The output a forward_piece produced, for the next piece (undefined on the last piece).
  virtual const Tensor& piece_output(const PieceActs& acts) const = 0;
  // Backward of a forward_piece: dout is the gradient of its output (ignored on the last piece,
  // whose gradient starts at the loss, scaled by grad_scale). Returns the gradient of its input
  // (undefined on the first piece). last_microbatch: gradients are final after this pass.
  // defer_weight_grads (zero-bubble B pass): input gradients only; backward_weight_piece (the W
  // pass) computes the weight gradients later; the activations must stay alive until then.
  virtual Tensor backward_piece(PieceActs& acts, const Tensor& dout, float grad_scale,
                                bool last_microbatch, bool defer_weight_grads = false) = 0;
  virtual void backward_weight_piece(PieceActs& acts, bool last_microbatch) = 0;

  // ---- what crosses a pipeline boundary beside the activation: a mixture of experts'
  // load-balancing loss couples every MoE layer of a micro-batch (models/layers/moe.h), so its
  // routing statistics travel forward with the activations and its gradient back with theirs
  // (launch/train/pipeline_stage.cc appends them to the boundary tensors) ----
  // Doubles carried beside each boundary tensor; 0 when nothing is (a dense model, no balancing
  // loss, or one piece).
  virtual int boundary_stats() const { return 0; }
  // After forward_piece: `in` the statistics of the pieces before (nullptr on the first piece);
  // `out` (boundary_stats() doubles) receives those for the next piece. On the last piece the
  // loss is completed (loss->aux) and out is unused.
  virtual void forward_stats(PieceActs& acts, const double* in, double* out, LossSum* loss) {
    (void)acts, (void)in, (void)out, (void)loss;
  }
  // Before backward_piece: `in` what the next piece sent back (nullptr on the last piece);
  // `out` (boundary_stats() doubles) receives what the previous piece needs.
  virtual void backward_stats(PieceActs& acts, const double* in, double* out) {
    (void)acts, (void)in, (void)out;
  }

  // Runs again, on the activations of a forward_piece, what selective recompute repeats in the
  // backward pass of the piece's layers (`strata profile` times it); the result is dropped.
  virtual void rerun_selective_recompute(const PieceActs& acts) = 0;

  // ---- generation: tensor parallelism as in training; sequence parallelism is not used by
  // decoding (the weights are the same; every rank of the tensor group sees the whole new
  // positions); the pieces of a pipeline run one after another (decode_over_pipeline) ----
  // Key/value caches of this rank's layers for `batch` sequences of up to `capacity` positions
  // (≤ the model's). The default refuses: a model that does not generate (an encoder).
  virtual std::unique_ptr<GenerationState> start_generation(int batch, int64_t capacity);
  // Runs piece `piece` on the next T positions of each sequence (state.length …), appending to
  // its layers' caches. The first piece reads `tokens` (batch, T) row-major, any other `input`,
  // the previous piece's output: (batch, T, state.width) in the activation type. Returns the
  // output for the next piece; the last piece returns an undefined tensor and fills *logits with
  // each sequence's last new position over the whole vocabulary: (batch, V) f32 on the host, the
  // same on every rank of the tensor group. state.length is the caller's to advance, once every
  // piece has run.
  virtual Tensor decode_piece(GenerationState& state, int piece, const Tensor& input,
                              const std::vector<int32_t>& tokens, int T,
                              std::vector<float>* logits);
  // The whole model on this rank (one piece with the embedding and the head): decode_piece,
  // then state.length += T. Returns the logits.
  std::vector<float> decode(GenerationState& state, const std::vector<int32_t>& tokens, int T);

  // Convenience for single-piece models (tests, evaluation in one process).
  PieceActsPtr forward(const ModelBatch& batch, LossSum* loss) {
    return forward_piece(0, Tensor(), batch, loss);
  }
  void backward(PieceActs& acts, float grad_scale, bool last_microbatch = true) {
    backward_piece(acts, Tensor(), grad_scale, last_microbatch);
  }
};

// The whole model as one piece.
std::vector<ModelPiece> whole_model(int num_layers);

// Model::decode over a pipeline: piece k = chunk·p + stage runs on stage k mod p (`pipeline`,
// this rank's place `stage` of `stages`; null or size 1: one stage), each stage passing its
// output to the next; the last stage's logits are broadcast over the pipeline, so every rank
// returns them. Collective over the pipeline group; state.length advances by T.
std::vector<float> decode_over_pipeline(Model& model, Backend& be, Communicator* pipeline,
                                        GenerationState& state, const std::vector<int32_t>& tokens,
                                        int T);

}  // namespace strata
