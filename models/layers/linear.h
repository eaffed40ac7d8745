// linear.h — Megatron's tensor-parallel linear layers, y = x·Wᵀ + b with W (out, in).
//
// ColumnParallelLinear: W split by rows (each of the t ranks computes out/t of the outputs). Its
// input is the full activation: with sequence parallelism the layer all-gathers the (B, S/t, C)
// shard itself. Its input gradient is a partial sum over the group (each rank's slice of W
// contributes), which backward() reduces (all-reduce, or reduce-scatter back to the sequence
// shard with sequence parallelism).
//
// RowParallelLinear: W split by columns (each rank holds in/t inputs: the output slice of the
// column-parallel layer before it). Its output is a partial sum, reduced over the group (or
// reduce-scattered with sequence parallelism); the residual stream it joins is added after the
// reduction (with t = 1, inside the GEMM). In the backward pass its output gradient is needed on
// the whole sequence: gather_output_grad() all-gathers it with sequence parallelism.
//
// Backward passes follow the BackwardPass: weight gradients are accumulated now, or queued for
// the zero-bubble W pass (models/layers/parallel.h). Backend ops with fused epilogues are used
// where a layer's neighbour allows it (GELU after the column layer, the GELU's gradient in the
// row layer's input-gradient GEMM, the residual in the row layer's forward GEMM).
//
// Thread-safety: as the model.
#pragma once

#include <string>
#include <vector>

#include "models/layers/parallel.h"
#include "models/layers/params.h"
#include "models/layers/work.h"

namespace strata {

// How a linear layer's parameters start.
struct LinearInit {
  double std = 0.02;  // weights N(0, std); biases 0
};

class ColumnParallelLinear {
 public:
  ColumnParallelLinear() = default;
  // Declares `name`.weight (out, in) and, with `bias`, `name`.bias (out). row_blocks: the output
  // rows are blocks of these sizes (query, key, value; gate, up), each split over the group
  // (ParamSplit::kBlockRows), so a rank's output is its share of every block, in block order.
  ColumnParallelLinear(ParamLayout& layout, const std::string& name, int64_t in, int64_t out,
                       LinearInit init, bool bias, std::vector<int64_t> row_blocks = {});
  // A layer whose weight is another layer's parameter (an LM head tied to the embedding), no
  // bias.
  static ColumnParallelLinear tied_to(ParamRef weight, int64_t out_local);

  // y (B, S, out/t) = x · Wᵀ + b for the local x (B, S_local, in), gathered first with
  // sequence parallelism.
  Tensor forward(const LayerEnv& env, const Tensor& x) const;
  // pre = x · Wᵀ + b and out = gelu(pre), both (B, S, out/t): the MLP's first half in one op.
  void forward_gelu(const LayerEnv& env, const Tensor& x, Tensor* pre, Tensor* out,
                    GeluKind kind = GeluKind::kTanh) const;
  // Weight gradients from dout (B, S, out/t) and the forward's local input x, and the input
  // gradient reduced over the group: (B, S_local, in). dout is taken by value and released once
  // used (unless the W pass keeps it), so a caller may hand over the last reference.
  Tensor backward(const LayerEnv& env, BackwardPass& pass, Tensor dout, const Tensor& x) const;

  // One micro-batch through an `in` → `out` layer: its GEMM on this rank's out/t rows; with
  // sequence parallelism the gather of its input (forward, and again for the weight gradient);
  // the reduction of its input gradient over the group (all-reduce, or reduce-scatter with sp).
  static PartWork work(int64_t in, int64_t out, const WorkShape& s);

  ParamRef weight, bias;
  int64_t out_local = 0;  // output features on this rank
};

class RowParallelLinear {
 public:
  RowParallelLinear() = default;
  // Declares `name`.weight (out, in) split by columns and `name`.bias (out) replicated.
  RowParallelLinear(ParamLayout& layout, const std::string& name, int64_t in, int64_t out,
                    LinearInit init, bool bias);

  // residual + x · Wᵀ + b, reduced over the group: (B, S, out) without sequence parallelism,
  // this rank's (B, S/t, out) chunk with it. x (B, S, in/t).
  Tensor forward_residual(const LayerEnv& env, const Tensor& x, const Tensor& residual) const;
  // The output gradient over the whole sequence (gathered with sequence parallelism).
  Tensor gather_output_grad(const LayerEnv& env, const Tensor& dresid) const;
  // dinp (may be null) = dout_full · W, assigned; weight gradients from dout_full and x.
  void backward(const LayerEnv& env, BackwardPass& pass, Tensor* dinp, const Tensor& dout_full,
                const Tensor& x) const;
  // The input x was gelu(pre): dpre = gelu'(pre) · (dout_full · W) in one op (fused where the
  // backend can), then the weight gradients from dout_full and x.
  void backward_through_gelu(const LayerEnv& env, BackwardPass& pass, Tensor& dpre,
                             const Tensor& dout_full, const Tensor& pre, const Tensor& x,
                             GeluKind kind = GeluKind::kTanh) const;

  // One micro-batch through an `in` → `out` layer: its GEMM on this rank's in/t columns, the
  // reduction of its partial output (all-reduce, or reduce-scatter with sp), the residual join
  // (2 reads, 1 write and a byte mask per element), and with sp the gather of its output gradient.
  static PartWork work(int64_t in, int64_t out, const WorkShape& s);

  ParamRef weight, bias;
};

// A linear layer every rank of the tensor group holds whole (BERT's small heads: the masked-LM
// transform (C, C) and the pooler (C, C)), applied to the rows this rank holds. Its input is
// either sequence-sharded (the residual stream's chunk with sequence parallelism: each rank's
// weight gradient is a partial sum over the group, summed on the last micro-batch, as Norm's)
// or the same on every rank (then so is every gradient: nothing to sum). Weight gradients are
// never deferred to a zero-bubble W pass (like a norm's, they are small).
class ReplicatedLinear {
 public:
  ReplicatedLinear() = default;
  // Declares `name`.weight (out, in) and `name`.bias (out), replicated.
  ReplicatedLinear(ParamLayout& layout, const std::string& name, int64_t in, int64_t out,
                   LinearInit init, bool sequence_sharded);

  // y (…, out) = x (…, in) · Wᵀ + b.
  Tensor forward(const LayerEnv& env, const Tensor& x) const;
  // pre = x · Wᵀ + b and out = gelu(pre).
  void forward_gelu(const LayerEnv& env, const Tensor& x, Tensor* pre, Tensor* out,
                    GeluKind kind) const;
  // dinp (may be null) = dout · W, assigned; dW, db += (summed over the group per above).
  void backward(const LayerEnv& env, const BackwardPass& pass, Tensor* dinp, const Tensor& dout,
                const Tensor& x) const;

  // `rows` rows through an `in` → `out` layer: its GEMM (the gradient sums of the last
  // micro-batch are not per micro-batch work).
  static PartWork work(int64_t in, int64_t out, double rows);

  ParamRef weight, bias;
  bool sequence_sharded = false;
};

// dinp = dout · W now (dinp may be null); dW (and db) += now or, in a zero-bubble B pass, queued
// for the W pass. dout_changes_later: dout is a buffer that keeps accumulating after this call
// (the residual stream's gradient), so the W pass needs a copy of its value now.
void linear_backward(const LayerEnv& env, BackwardPass& pass, Tensor* dinp, ParamRef weight,
                     ParamRef bias, const Tensor& dout, const Tensor& inp,
                     bool dout_changes_later = false);

}  // namespace strata
