// decoder.h — the pre-norm decoder-only transformer that GPT-2 and the Llama family share,
// composed of the tensor-parallel layers of models/layers/. An architecture (models/gpt/,
// models/llama/) is a DecoderShape: its sizes, its choices and its parameter names.
//
//   x = embed(tokens) [+ learned positions]
//   L blocks of
//     a = x + attn.proj(attention(attn.qkv(norm_1(x))))   causal, NH query / KVH key-value heads,
//                                                         [rotary embeddings on q and k]
//     y = a + mlp.proj(act(mlp.fc(norm_2(a))))             GELU, or SwiGLU on [gate; up]
//   then the final norm, the LM head (tied to the embedding unless shape.tie is false) and the
//   mean cross-entropy.
//
// Norms are LayerNorm (GPT-2) or RMSNorm (Llama); positions learned (GPT-2's wpe) or rotary
// (Llama); linear layers with or without biases. Weight matrices are (out, in): y = x·Wᵀ + b.
// The flat order is the embedding (and positions), layer 0 … L−1, the final norm, [lm_head].
// Initialisation: weights and embeddings N(0, init_std); with shape.scaled_proj_init (GPT-2)
// the two residual output projections of each block N(0, init_std/√(2L)); biases 0, norm
// weights 1.
//
// Tensor parallelism and sequence parallelism are the layers' (models/layers/parallel.h): the
// embedding and the LM head are vocab-parallel, q/k/v and the MLP's expansion column-parallel,
// the two output projections row-parallel, norms and positions replicated. With tied
// embeddings split over pipeline stages, the last stage holds its own copy of the embedding
// (same name, so the same initial values; its gradient is summed with the first stage's every
// step, so it stays equal).
//
// Thread-safety: one model per rank, driven from one thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/description.h"
#include "models/layers/attention.h"
#include "models/layers/cross_entropy.h"
#include "models/layers/embedding.h"
#include "models/layers/mlp.h"
#include "models/layers/norm.h"
#include "models/layers/rope.h"
#include "models/model.h"
#include "runtime/base/config.h"

namespace strata {

// Parameter names of one architecture; a layer's are "<layer><index>.<suffix>".
struct DecoderNames {
  std::string embedding;  // the token table
  std::string positions;  // learned positions ("" without)
  std::string layer;      // "h." → "h.3.ln_1.weight"
  std::string norm_1, qkv, attn_proj, norm_2, mlp_fc, mlp_proj;
  std::string final_norm;
  std::string lm_head;
};

// The sizes and choices of a decoder (from the config: gpt_shape, llama_shape), checked by the
// model (sizes that must divide by the tensor-parallel size).
struct DecoderShape {
  std::string arch;  // model.arch
  int L = 0;         // layers
  int C = 0;         // hidden size
  int NH = 0;        // query heads
  int KVH = 0;       // key/value heads (NH: multi-head attention)
  int F = 0;         // MLP hidden size
  int S = 0;         // maximum sequence length (positions)
  int V = 0;         // vocabulary
  bool tie = true;
  double init_std = 0.02;
  bool scaled_proj_init = false;  // residual output projections N(0, init_std/√(2L))
  NormKind norm = NormKind::kLayerNorm;
  double norm_eps = 1e-5;         // RMSNorm's (LayerNorm's is 1e-5)
  bool learned_positions = true;  // else rotary embeddings
  double rope_theta = 10000;
  std::optional<RopeScaling> rope_scaling;
  MlpActivation mlp = MlpActivation::kGelu;
  bool bias = true;
  DecoderNames names;

  int head_size() const { return C / NH; }
};

class DecoderModel final : public Model {
 public:
  DecoderModel(const DecoderShape& shape, const ModelOptions& options, Backend& backend);
  ~DecoderModel() override;

  ParamStore& params() override { return *store_; }
  const ParamStore& params() const override { return *store_; }
  const std::vector<ModelPiece>& pieces() const override { return pieces_; }
  DType activation_dtype() const override { return options_.bf16 ? DType::kBF16 : DType::kF32; }
  Shape boundary_shape(int micro_batch, int seq_len) const override;

  PieceActsPtr forward_piece(int piece, const Tensor& input, const ModelBatch& batch,
                             LossSum* loss) override;
  const Tensor& piece_output(const PieceActs& acts) const override;
  Tensor backward_piece(PieceActs& acts, const Tensor& dout, float grad_scale, bool last_microbatch,
                        bool defer_weight_grads) override;
  void backward_weight_piece(PieceActs& acts, bool last_microbatch) override;
  void rerun_selective_recompute(const PieceActs& acts) override;
  std::unique_ptr<GenerationState> start_generation(int batch, int64_t capacity) override;
  Tensor decode_piece(GenerationState& state, int piece, const Tensor& input,
                      const std::vector<int32_t>& tokens, int T,
                      std::vector<float>* logits) override;

  const DecoderShape& shape() const { return shape_; }
  // The logits (B·S, Vp/t) of a last-piece forward (valid until its backward consumes them).
  static const Tensor& logits(const PieceActs& acts);

  // The parameter layout of `pieces` at tensor size t, rank r (built, never allocated): what
  // DecoderModel holds, and what the self-description counts.
  static ParamLayout layout(const DecoderShape& shape, int tensor, int tensor_rank, bool sp,
                            const std::vector<ModelPiece>& pieces);

 private:
  struct Block;
  struct Head;
  struct Acts;
  // The layers of options.pieces declared into declared_, nothing allocated (layout()).
  DecoderModel(const DecoderShape& shape, const ModelOptions& options);
  // Builds this rank's layers, declaring their parameters into `layout`.
  void declare(ParamLayout& layout);
  void block_forward(const Block& blk, const Tensor& x, Acts& a, int i, bool recomputing) const;
  void block_backward(const Block& blk, const Tensor& x, Acts& a, int i, BackwardPass& pass,
                      Tensor& dresid) const;
  // The block holding layer `layer` (one this rank holds).
  const Block& block(int layer) const;
  // Reports the final gradients of the head's parameters, of every parameter of `piece`.
  void report_head_ready() const;
  void report_embedding_ready() const;
  void report_piece_ready(int piece) const;

  DecoderShape shape_;
  ModelOptions options_;
  std::vector<ModelPiece> pieces_;
  ParamLayout declared_;  // moved into store_ once allocated
  std::unique_ptr<TensorParallel> tp_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<LayerEnv> env_;
  std::unique_ptr<TensorParallel> decode_tp_;  // the tensor group without sequence parallelism
  std::unique_ptr<LayerEnv> decode_env_;       // generation's layer calls
  VocabParallelEmbedding embedding_;           // when this rank holds the first piece
  RotaryEmbedding rope_;                       // without learned positions, once built on a backend
  std::vector<Block> blocks_;        // [layer − first layer of this rank's first piece …]
  std::unique_ptr<Head> head_;       // when this rank holds the last piece
  std::vector<int> block_of_layer_;  // [layer] index into blocks_, -1 when not held
};

// The self-description of a decoder (models/description.h).
std::unique_ptr<ModelDescription> describe_decoder(const DecoderShape& shape);

}  // namespace strata
