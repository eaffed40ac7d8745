#include "models/layers/parallel.h"

#include "runtime/base/behaviour.h"
#include "runtime/base/check.h"

namespace strata {

TensorParallel::TensorParallel(Backend& backend, Communicator* comm, int size, int rank, bool sp,
                               DType act_dtype)
    : be_(backend),
      comm_(comm),
      size_(size),
      rank_(rank),
      sp_(sp && size > 1),
      act_dtype_(act_dtype) {
  STRATA_CHECK(
      size == 1 || (comm && comm->size() == size && comm->rank() == rank),
      "tensor-parallel group does not match the layout (size " << size << ", rank " << rank << ")");
}

Tensor TensorParallel::act(const Shape& s) {
  return be_.empty(s, MemCategory::kActivations, act_dtype_);
}

// Every collective here blocks until it completes: the planner prices tensor-parallel
// communication on the critical path (runtime/base/behaviour.h). Overlapping it with the GEMMs
// means changing kTensorParallelOverlap with it.
static_assert(!behaviour::kTensorParallelOverlap, "TensorParallel's collectives are blocking");

void TensorParallel::sum(Tensor& t) {
  if (size_ > 1) comm_->all_reduce(t, ReduceOp::kSum);
}

void TensorParallel::max(Tensor& t) {
  if (size_ > 1) comm_->all_reduce(t, ReduceOp::kMax);
}

Tensor TensorParallel::gather_sequence(const Tensor& shard) {
  const int t = size_;
  const int64_t B = shard.size(0), Sl = shard.size(1), C = shard.size(2);
  Tensor chunks = act({t, B, Sl, C});
  comm_->all_gather(shard.data(), chunks.data(), static_cast<size_t>(shard.numel()), shard.dtype());
  Tensor full = act({B, Sl * t, C});
  be_.seq_interleave(full, chunks, t);
  return full;
}

Tensor TensorParallel::reduce_scatter_sequence(const Tensor& full) {
  const int t = size_;
  const int64_t B = full.size(0), S = full.size(1), C = full.size(2);
  Tensor chunks = act({t, B, S / t, C});
  be_.seq_deinterleave(chunks, full, t);
  Tensor shard = act({B, S / t, C});
  comm_->reduce_scatter(chunks.data(), shard.data(), static_cast<size_t>(shard.numel()),
                        shard.dtype(), ReduceOp::kSum);
  return shard;
}

Tensor TensorParallel::full_sequence(const Tensor& x) {
  return sp_ ? gather_sequence(x) : x;
}

Tensor TensorParallel::reduce(Tensor& partial) {
  if (sp_) return reduce_scatter_sequence(partial);
  sum(partial);
  return partial;
}

void run_deferred_weight_grads(const LayerEnv& env, std::vector<DeferredWeightGrad>& queue) {
  for (const DeferredWeightGrad& w : queue) {
    Tensor dw = env.g(w.weight);
    Tensor db = w.bias.valid() ? env.g(w.bias) : Tensor();
    env.be.matmul_backward_weight(dw, w.bias.valid() ? &db : nullptr, w.dout, w.inp);
  }
  queue.clear();
}

}  // namespace strata
