// description.h — what a model is without building it: parameters, FLOPs, the work and the
// activation memory of each part, per tensor-parallel rank.
//
// The planner's cost and memory models (partitioner/), `strata train --dry-run`, the start-up
// memory check and the training metrics (FLOPs, MFU) all read a model through this interface, so
// the numbers they use are the model's own: parameter counts come from the parameter layout the
// model itself declares (its layers declared into a layout that is never allocated); work,
// collectives and activations are what each layer reports of itself (models/layers/work.h),
// summed by the block and the model (models/transformer/description.cc: no architecture counts
// by hand), and checked against the allocator's measured peak (tests/test_planner.cc,
// tests/mpi_test_memory.cc).
//
// Parts: the model is an embedding, num_layers() transformer layers, and a head (final norm, LM
// head, loss). The layers come in layer_kinds() kinds, every layer of a kind identical: one kind
// for most models; Qwen3-MoE with dense layers has two, its mixtures (kind 0) and its dense
// SwiGLU layers (kind 1), and layer_kind(l) says which layer is which. Per-layer figures are of
// one layer of a kind. Sizes are per micro-batch of b sequences of seq_len() tokens on one rank
// of a tensor group of t and an expert group of e (RankShape); "elements" are counted in the
// activation type unless a field says f32.
//
// Expert parallelism: a mixture's expert weights are declared expert-split (ParamDecl::expert);
// a rank of an expert group of e holds E/e experts of each, 1/e of their elements
// (layer_expert_parameters), every other parameter as without it (rank_parameters).
//
// Thread-safety: const methods, callable from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/layers/work.h"
#include "models/model.h"

namespace strata {

// FLOPs of one training iteration in Megatron-LM's counting (matrix multiplies only; attention
// scores over the full S×S as Megatron counts them).
struct FlopCount {
  double model = 0;     // forward + backward (3× forward)
  double hardware = 0;  // plus the forward work recompute repeats
};

class ModelDescription {
 public:
  virtual ~ModelDescription() = default;

  virtual std::string arch() const = 0;
  virtual int num_layers() const = 0;
  // The kinds of layer (≥ 1) and the kind of layer l in [0, num_layers()).
  virtual int layer_kinds() const = 0;
  virtual int layer_kind(int layer) const = 0;
  virtual int seq_len() const = 0;
  virtual int hidden_size() const = 0;
  virtual int num_heads() const = 0;
  virtual int vocab_size() const = 0;
  // The experts of each MoE layer (E), 0 for a dense model.
  virtual int num_experts() const = 0;
  // The vocabulary rows as stored on t ranks (padded to a multiple of 128·t).
  virtual int64_t padded_vocab(int tensor) const = 0;
  // One line for banners: "12 layers, hidden 768, 12 heads, seq 1024, vocab 50257".
  virtual std::string summary() const = 0;
  // Why the model cannot be split over a tensor group of t ranks ("" when it can): the sizes
  // tensor parallelism divides (heads, MLP width, with sequence parallelism the sequence).
  virtual std::string tensor_split_reason(int tensor, bool sequence_parallel) const = 0;
  // The model's keys as the plan's "model" object and checkpoints record them (the keys that fix
  // parameter shapes, docs/config.md's names).
  virtual nlohmann::json shape_json() const = 0;

  // Parameters of the whole model without vocabulary padding (the model size).
  virtual int64_t parameters() const = 0;
  // Elements one rank of a tensor group of t holds of: one layer of kind `kind`, the embedding
  // (first piece), the head (last piece: final norm and an untied LM head), and the copy of a
  // tied embedding that the last piece holds when it is not also the first (0 when untied).
  virtual int64_t layer_parameters(int tensor, int kind) const = 0;
  virtual int64_t embedding_parameters(int tensor) const = 0;
  virtual int64_t head_parameters(int tensor) const = 0;
  virtual int64_t tied_copy_parameters(int tensor) const = 0;
  // Of layer_parameters(t, kind): the experts' weights (all E experts' share of this tensor
  // rank), the elements an expert group of e divides by e; 0 for a dense layer.
  virtual int64_t layer_expert_parameters(int tensor, int kind) const = 0;

  virtual FlopCount flops_per_iteration(double sequences, Recompute recompute) const = 0;

  // Work of one micro-batch of b sequences on one rank (a layer: one of kind `kind`).
  virtual PartWork layer_work(int b, const RankShape& r, int kind) const = 0;
  virtual PartWork embedding_work(int b, const RankShape& r) const = 0;
  virtual PartWork head_work(int b, const RankShape& r) const = 0;

  // Activations of one micro-batch. flash_attention: the attention keeps the softmax
  // statistics (fused GPU kernels) instead of the probabilities (the CPU kernels).
  virtual ActivationElems layer_activations(int b, const RankShape& r, Recompute recompute,
                                            bool flash_attention, int kind) const = 0;
  virtual ActivationElems head_activations(int b, const RankShape& r) const = 0;
  // What the first piece keeps of its embedding besides the piece's input (a norm's input and
  // statistics where the embedding has one).
  virtual ActivationElems embedding_activations(int b, const RankShape& r) const = 0;
  // What a piece keeps besides its layers: its input (the received activation or the
  // embedding's output) and the micro-batch's token ids.
  virtual double piece_input_elems(int b, const RankShape& r) const = 0;
  // The activation between two pieces (what a pipeline send or receive buffer holds).
  virtual double boundary_elems(int b, const RankShape& r) const = 0;
  // Scratch buffers held outside the activations: the sequence-parallel all-gather of one
  // activation, and the fused attention backward's f32 scratch (per layer in flight).
  virtual double sequence_gather_elems(int b, const RankShape& r) const = 0;
  virtual double attention_scratch_f32(int b, const RankShape& r) const = 0;
  // The CPU attention backward's f32 scratch per thread.
  virtual double cpu_attention_scratch_f32_per_thread() const = 0;
};

// [kind] how many of the layers [first_layer, first_layer + layers) are of each kind.
std::vector<int> layer_kind_counts(const ModelDescription& d, int first_layer, int layers);
// [piece] the first layer of each piece of a split ([piece] layers).
std::vector<int> first_layers(const std::vector<int>& layers_per_piece);

// Elements on one rank of piece `piece` of a model cut into `pieces` pieces, holding the
// `layers` layers from `first_layer`: the layers, plus the embedding on the first piece, the
// head on the last, and on the last the copy of a tied embedding when the first piece is
// another.
int64_t piece_parameters(const ModelDescription& d, int tensor, int piece, int pieces,
                         int first_layer, int layers);

// Elements on one rank by the group their gradients are summed over: `dense` over the
// data-parallel group (d ranks), `expert` (the E/e experts of each MoE layer a rank of an expert
// group of e holds) over the expert-data-parallel group (d/e ranks). At e = 1, total() is
// piece_parameters.
struct RankParameters {
  int64_t dense = 0, expert = 0;
  int64_t total() const { return dense + expert; }
};
// piece_parameters at tensor size t and expert size e. Precondition: e divides the experts.
RankParameters rank_parameters(const ModelDescription& d, int tensor, int expert, int piece,
                               int pieces, int first_layer, int layers);

// The elements a layout's parameters hold without the vocabulary's padding rows (the count a
// checkpoint of the unpadded model has): what parameters() reports for a whole-model layout.
int64_t unpadded_parameters(const ParamLayout& layout);

// The per-rank parameter counts of a description's parts (layer_parameters and the rest), taken
// from the layouts the model declares for a one-layer piece of each kind (the layer
// kind_layers[kind]), an embedding-only piece and a head-only piece of `num_layers`, whose copy
// of a tied embedding (tied_copy(t) elements, 0 when untied) is counted apart; cached per tensor
// size (the planner asks often). Thread-safe.
class PartParameterCounts {
 public:
  struct Counts {
    int64_t embedding = 0, head = 0, tied_copy = 0;
    std::vector<int64_t> layer;          // [kind]
    std::vector<int64_t> layer_experts;  // [kind] of `layer`: the parameters declared expert-split
  };
  using Layout = std::function<ParamLayout(int tensor, const std::vector<ModelPiece>& pieces)>;
  PartParameterCounts(Layout layout, int num_layers, std::vector<int> kind_layers,
                      std::function<int64_t(int)> tied_copy)
      : layout_(std::move(layout)),
        num_layers_(num_layers),
        kind_layers_(std::move(kind_layers)),
        tied_copy_(std::move(tied_copy)) {}
  Counts at(int tensor) const;

 private:
  Layout layout_;
  int num_layers_;
  std::vector<int> kind_layers_;  // [kind] a layer of that kind, -1 when none is (counts 0)
  std::function<int64_t(int)> tied_copy_;
  mutable std::mutex mu_;
  mutable std::map<int, Counts> cache_;
};

}  // namespace strata
