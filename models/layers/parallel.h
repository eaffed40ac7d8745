// parallel.h — what a layer computes with on this rank: the backend, the parameters, and the
// tensor-parallel group with the collectives Megatron's layers put around their GEMMs.
//
// Tensor parallelism (Megatron-LM): a column-parallel layer's input is the full activation on
// every rank and its output a slice; a row-parallel layer's input is a slice and its output a
// partial sum, reduced over the group. Sequence parallelism (Korthikanti et al.) keeps the
// activations between those regions (residual stream, LayerNorm outputs) sharded along the
// sequence: a column-parallel layer then all-gathers its input, a row-parallel layer
// reduce-scatters its output, and the backward passes do the converse. Layers call these
// helpers; models never call a collective themselves.
//
// Layouts: (B, S, C) activations; with sequence parallelism a rank holds the (B, S/t, C) chunk
// of sequence positions [r·S/t, (r+1)·S/t).
//
// Thread-safety: one per model, used from the training thread.
#pragma once

#include "models/layers/params.h"
#include "runtime/backend/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/memory/tensor.h"

namespace strata {

class TensorParallel {
 public:
  // comm: the tensor group (nullptr when size is 1). sp: sequence parallelism (ignored at t = 1).
  TensorParallel(Backend& backend, Communicator* comm, int size, int rank, bool sp,
                 DType act_dtype);

  int size() const { return size_; }
  int rank() const { return rank_; }
  bool sequence_parallel() const { return sp_; }
  // The sequence length a rank holds of a (B, S, C) activation of length S.
  int64_t seq_local(int64_t S) const { return sp_ ? S / size_ : S; }

  // All-reduce sum over the group; a no-op at t = 1.
  void sum(Tensor& t);
  // All-reduce max over the group; a no-op at t = 1.
  void max(Tensor& t);
  // (B, S/t, C) → (B, S, C) (sp only).
  Tensor gather_sequence(const Tensor& shard);
  // (B, S, C) partial sums → this rank's (B, S/t, C) chunk of their sum (sp only).
  Tensor reduce_scatter_sequence(const Tensor& full);
  // Before a layer that needs the whole sequence: the input itself (no sp) or its gather (sp).
  Tensor full_sequence(const Tensor& x);
  // A partial sum over the group of a (B, S, C) activation (a row-parallel output, a
  // column-parallel input gradient): the whole sum (no sp, in place) or this rank's sequence
  // chunk of it (sp).
  Tensor reduce(Tensor& partial);

 private:
  Tensor act(const Shape& s);

  Backend& be_;
  Communicator* comm_;
  int size_, rank_;
  bool sp_;
  DType act_dtype_;
};

// The environment of every layer call: backend, parameters (handles resolve here), tensor group
// and expert group.
struct LayerEnv {
  Backend& be;
  ParamStore& params;
  TensorParallel& tp;
  DType act_dtype;  // activations and their gradients (bf16 in mixed precision)
  // The expert group a mixture's tokens travel over by all-to-all; null without expert
  // parallelism.
  Communicator* ep = nullptr;
  // The context group ring attention runs over; null without context parallelism.
  Communicator* cp = nullptr;

  Tensor act(const Shape& s) const {  // an activation
    return be.empty(s, MemCategory::kActivations, act_dtype);
  }
  Tensor act_zeros(const Shape& s) const {
    return be.zeros(s, MemCategory::kActivations, act_dtype);
  }
  Tensor stat(const Shape& s) const {  // f32 statistics (LayerNorm, cross-entropy rows)
    return be.empty(s, MemCategory::kActivations);
  }
  Tensor w(ParamRef r) const { return params.cparam(r); }  // compute copy
  Tensor g(ParamRef r) const { return params.grad(r); }    // fp32 gradient
};

// A weight gradient deferred to the zero-bubble W pass: dW += doutᵀ·inp (and db += Σ dout).
struct DeferredWeightGrad {
  ParamRef weight, bias;  // bias invalid: none
  Tensor dout;            // (N, OC)
  Tensor inp;             // (N, C)
};

// The state of one piece's backward pass that every layer consults.
struct BackwardPass {
  // Zero-bubble B pass: compute input gradients only and queue the matrix weight gradients.
  bool defer_weight_grads = false;
  // Gradients are final after this pass (the last micro-batch of the batch): sequence-parallel
  // partial gradients are then summed over the tensor group.
  bool last_microbatch = true;
  std::vector<DeferredWeightGrad>* deferred = nullptr;  // in backward order
};

// Runs the queued weight gradients of a B pass (the W pass) and empties the queue.
void run_deferred_weight_grads(const LayerEnv& env, std::vector<DeferredWeightGrad>& queue);

}  // namespace strata
