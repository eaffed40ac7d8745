// params.h — a model's parameters: the layout every layer declares into, and the flat buffers.
//
// Layers declare their parameters while the model is being built (ParamLayout::add returns a
// typed handle, ParamRef); the model then allocates one flat fp32 buffer for all of them and one
// of the same layout for the gradients (ParamStore). One buffer makes the optimizer, the gradient
// norm and the data-parallel reduction single loops; the handles make a parameter a compile-time
// name (`attn_.qkv.weight`), not a string looked up on the hot path. Names
// ("h.3.attn.c_attn.weight") remain for checkpoints, Hugging Face files and messages.
//
// A layout can be built without a backend: the self-description (models/description.h) counts a
// layer's parameters by declaring it into a throw-away layout, so the planner and the model can
// never disagree on a count.
//
// Tensor parallelism: each entry says how the full parameter is divided over the t ranks of the
// tensor group (ParamSplit) and this rank holds its shard; global_index() maps a shard element to
// its place in the full tensor (initialisation, checkpoints and resharding use it).
//
// Expert parallelism: a parameter declared `expert` (the experts' weights of a mixture, one block
// of rows per expert) is first cut into e equal runs of whole rows over the expert group — rank j
// holds experts [j·E/e, (j+1)·E/e) — and that run is then divided over the tensor group by its
// ParamSplit as a whole parameter would be.
//
// Initialisation is a pure function of (seed, parameter name, global element index), so every
// backend and every layout starts from the same model (docs/contracts.md).
//
// Thread-safety: built and used from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/memory/tensor.h"

namespace strata {

enum class ParamInit { kNormal, kOnes, kZeros };

// How a parameter is divided over the tensor-parallel ranks.
enum class ParamSplit {
  kReplicated,  // every rank holds all of it
  kRows,        // rank r holds rows [r·R/t, (r+1)·R/t) (column-parallel weights and biases, wte)
  kCols,        // rank r holds columns [r·K/t, (r+1)·K/t) (row-parallel weights)
  kBlockRows,   // row blocks (a fused q/k/v or gate/up weight), each split as kRows: rank r
                // holds [block 0's rows of rank r; block 1's rows of rank r; …]
};
// The checkpoint metadata's spelling: "replicated", "rows", "cols", "block_rows:R0,R1,…" (the
// blocks' full row counts); parse_param_split reads these, and "qkv_rows" (three equal blocks of
// full_rows / 3, the spelling before blocks of any size). It returns false on anything else.
std::string split_spelling(ParamSplit s, const std::vector<int64_t>& row_blocks);
bool parse_param_split(const std::string& s, int64_t full_rows, ParamSplit* out,
                       std::vector<int64_t>* row_blocks);

// One parameter: its shape, where it sits in the flat buffers, how it starts.
struct ParamInfo {
  std::string name;
  Shape shape;       // this rank's shard
  Shape full_shape;  // the whole parameter
  ParamSplit split = ParamSplit::kReplicated;
  std::vector<int64_t> row_blocks;  // kBlockRows: each block's full row count
  int64_t offset = 0;               // elements into the flat buffer
  int64_t numel = 0;
  ParamInit init = ParamInit::kZeros;
  double std = 0;                 // for kNormal
  int64_t rows_initialised = -1;  // kNormal: rows past this stay 0 (padded vocabulary); -1 all
  bool decay = false;  // AdamW weight decay applies (matrices and embeddings, not biases/norms)
  // Held by two pipeline stages (a tied embedding: the first stage's table and the last stage's
  // copy for the head): its gradient is final only once the two are summed over the embedding
  // group, after the pipeline has drained.
  bool tied = false;
  // The second holder of a tied parameter (the last stage's copy): the same parameter again, so
  // it is neither counted twice in the gradient norm nor written twice into a checkpoint.
  bool tied_copy = false;
  // Declared expert-split (ParamDecl::expert): the rows are cut into `expert` equal runs over the
  // expert group and this rank holds run `expert_rank` (then its tensor shard of that run). Its
  // gradient is summed over the expert-data-parallel group, not the data-parallel one.
  bool experts = false;
  int expert = 1, expert_rank = 0;
};

// Index in the full parameter of element `local` of the shard that rank `tp_rank` of `tp` holds.
int64_t global_index(const ParamInfo& p, int64_t local, int tp_rank, int tp);
// Its inverse: the element of rank tp_rank's shard that holds full-parameter element `global`, or
// -1 when another rank of the tensor group holds it (or `global` is outside the parameter).
int64_t local_index(const ParamInfo& p, int64_t global, int tp_rank, int tp);

// A typed handle to one parameter of a layout (its index). Default: no parameter (a layer
// without a bias).
struct ParamRef {
  int index = -1;
  bool valid() const { return index >= 0; }
};

// How a layer's parameter is declared: the full shape and the split; the layout derives the shard.
struct ParamDecl {
  std::string name;
  Shape full_shape;
  ParamSplit split = ParamSplit::kReplicated;
  ParamInit init = ParamInit::kZeros;
  double std = 0;
  int64_t rows_initialised = -1;
  bool decay = false;
  std::vector<int64_t> row_blocks = {};  // kBlockRows: each block's full row count
  bool expert = false;  // rows cut over the expert group first (one run of whole experts a rank)
};

// The ordered parameter entries of one rank (the order is the flat buffers' order).
class ParamLayout {
 public:
  // tp: the tensor-parallel size and this rank's place in it; ep: the expert-parallel size and
  // this rank's place in the expert group.
  explicit ParamLayout(int tp = 1, int tp_rank = 0, int ep = 1, int ep_rank = 0)
      : tp_(tp), tp_rank_(tp_rank), ep_(ep), ep_rank_(ep_rank) {}

  ParamRef add(const ParamDecl& d);

  int tp() const { return tp_; }
  int tp_rank() const { return tp_rank_; }
  int ep() const { return ep_; }
  int ep_rank() const { return ep_rank_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  std::vector<ParamInfo>& infos() { return infos_; }  // flags set after declaration (tied)
  const ParamInfo& info(ParamRef r) const { return infos_.at(static_cast<size_t>(r.index)); }
  int64_t numel() const { return numel_; }
  // The parameter named `name`, or an invalid ref (checkpoints and tests; not for the hot path).
  ParamRef find(const std::string& name) const;

 private:
  int tp_, tp_rank_, ep_, ep_rank_;
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, int> index_;
  int64_t numel_ = 0;
};

// The parameters of one rank in memory: the fp32 flat buffer (the master copy in bf16 mode),
// its bf16 compute copy (bf16 mode), and the gradients, all in the layout's order.
class ParamStore {
 public:
  // Allocates the buffers of `layout` on `backend` and initialises them from `seed`.
  ParamStore(ParamLayout layout, Backend& backend, bool bf16, uint64_t seed);
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  const ParamLayout& layout() const { return layout_; }
  const std::vector<ParamInfo>& infos() const { return layout_.infos(); }
  const ParamInfo& info(ParamRef r) const { return layout_.info(r); }
  int64_t numel() const { return params_.numel(); }
  bool bf16() const { return bf16_; }

  Tensor& params() { return params_; }  // (N) flat, fp32
  const Tensor& params() const { return params_; }
  Tensor& grads() { return grads_; }  // (N) flat, same layout
  // Accumulates gradients into another buffer of the same layout from now on (PipeDream-2BW's
  // next batch while the last one's update waits); grads() then returns it.
  void use_grads(const Tensor& g);
  // Computes with another buffer of the same layout from now on (PipeDream-2BW's weight
  // versions); params() then returns it.
  void use_params(const Tensor& p);
  // bf16 mode: re-rounds the bf16 compute copy from params() — to call whenever params() was
  // written (optimizer step, parameter all-gather, checkpoint load); a no-op in fp32.
  void params_changed();
  // (Re)initialises every parameter from `seed`.
  void init(uint64_t seed);
  void zero_grads();

  Tensor grad(ParamRef r) const;  // a view of grads()
  // The weights the forward and backward compute with: the bf16 copy in bf16 mode, else param().
  Tensor cparam(ParamRef r) const;

  // Data-parallel overlap: called while the last micro-batch's backward runs with [first, last)
  // parameter indices whose gradients have just become final, in the order they do.
  void set_grad_ready_hook(std::function<void(int first, int last)> hook) {
    ready_hook_ = std::move(hook);
  }
  // Reports parameters [first, last] (indices, inclusive) final to the hook when reporting is
  // on; tied parameters are left out (the stage reports them after summing the two holders).
  void report_ready(ParamRef first, ParamRef last);
  // Reporting is on during the backward pass that makes gradients final.
  void set_reporting(bool on) { reporting_ = on; }

 private:
  ParamLayout layout_;
  Backend& be_;
  bool bf16_;
  Tensor params_;     // (N) parameters
  Tensor params_lp_;  // (N) bf16 compute copy (bf16 mode only)
  Tensor grads_;      // (N) gradients
  std::function<void(int, int)> ready_hook_;
  bool reporting_ = false;
};

// Full (unsharded) tensors by parameter name: what checkpoints assemble and Hugging Face files
// hold, in our layouts (weights (out, in); wte (Vp, C) with its padded rows).
struct FullTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
using FullTensors = std::map<std::string, FullTensor>;  // [parameter name]

}  // namespace strata
