// grad_reducer.h — data-parallel gradient reduction in buckets, overlapped with the backward
// pass, with the distributed optimizer (ZeRO-1) as an option.
//
// The flat gradient buffer is cut into buckets of about parallel.bucket_mb, walking the
// parameters from the last to the first (the order in which the backward pass finishes them).
// When every parameter of a bucket is final (mark_ready, called from the last micro-batch's
// backward), the bucket's reduction starts at once, non-blocking, so it runs while the backward
// pass goes on; pending reductions are polled on every later mark_ready (MPI progresses
// non-blocking collectives only when tested). finish() waits for all of them.
//
// Gradients are SUMMED over the data-parallel group: the loss scaling (1 / tokens of the global
// batch) already makes the sum the gradient of the global mean loss, exactly as the serial run.
//
// Without sharding every rank ends with the whole reduced gradient. With sharding (ZeRO-1) each
// bucket is reduce-scattered: rank r receives its near-equal chunk of every bucket into a compact
// buffer (shard_grads), updates only those parameters with optimizer state for them only, and
// gather_params() all-gathers the updated parameters bucket by bucket.
//
// Expert parallelism: an expert weight's gradient is summed over the expert-data-parallel group
// (edp, the data ranks holding the same experts), a dense one over dp. A bucket holds parameters
// of one kind only and reduces (or, with ZeRO-1, reduce-scatters and all-gathers) over its own
// group; the optimizer's shard of an expert weight is then 1/|edp| of it.
//
// Thread-safety: driven from the training thread.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/engine/optimizer.h"

namespace strata {

// One parameter of the flat buffers.
struct ParamSpan {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = false;   // AdamW weight decay applies
  bool counted = true;  // its squares count in the global gradient norm on this rank (a
                        // parameter replicated over the tensor group counts on one rank)
  bool expert = false;  // an expert weight: summed over the expert-data-parallel group
};

class GradReducer {
 public:
  // dp may be null (data-parallel size 1). grads is the flat gradient buffer the spans index.
  // edp: the expert-data-parallel group, null without expert parallelism (expert weights then
  // reduce over dp as every other).
  GradReducer(Backend& backend, Communicator* dp, Tensor grads, std::vector<ParamSpan> params,
              double bucket_mb, bool shard, Communicator* edp = nullptr);
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  void begin_iteration();
  // Parameters [first, last) (indices into params) have final gradients.
  void mark_ready(int first, int last);
  // Starts what has not started, waits for everything.
  void finish();
  // Starts what has not started; true once everything has completed. Never blocks.
  bool test();
  // Reduces another gradient buffer of the same layout from the next begin_iteration() on
  // (PipeDream-2BW alternates two); call between finish() and begin_iteration().
  void use_grads(const Tensor& grads);

  // The gradient buffer the optimizer reads (compact shard with ZeRO-1, else the flat grads) and
  // the optimizer segments over it.
  Tensor& optimizer_grads() { return shard_ ? shard_grads_ : grads_; }
  const std::vector<OptSegment>& optimizer_segments() const { return opt_segments_; }
  // Σ g² over what this rank must count (its shard with ZeRO-1), in double. Sum it over the
  // data-parallel group when norm_sums_over_data() and then over the model-parallel group for
  // the global norm.
  double local_sum_squares();
  // Whether the data ranks hold different parts of the gradient norm: with ZeRO-1 (each its
  // chunks), or with expert parallelism (each rank of an expert group its experts; a dense
  // weight then counts on data rank 0 and an expert weight on the first rank of its edp group).
  bool norm_sums_over_data() const { return shard_ || edp_ != nullptr; }
  // ZeRO-1: all-gathers the updated parameter shards; no-op otherwise.
  void gather_params(Tensor& params);

  bool sharded() const { return shard_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Seconds from begin_iteration() to the start of each bucket's reduction, last iteration.
  const std::vector<double>& bucket_start_s() const { return start_s_; }
  double since_begin_s() const;

 private:
  struct Bucket {
    int64_t offset = 0, numel = 0;        // range of the flat buffer
    int first_param = 0, last_param = 0;  // [first, last)
    int pending = 0;                      // parameters not yet ready this iteration
    bool started = false;                 // its reduction was started this iteration
    std::vector<size_t> counts;           // ZeRO-1 chunk of each data-parallel rank
    int64_t shard_offset = 0;             // ZeRO-1: where this rank's chunk sits in shard_grads
    Communicator* comm = nullptr;         // dp, or edp for a bucket of expert weights
    Request req;
  };
  void start(Bucket& b);
  void start_unmarked();
  void poll();

  Backend& be_;
  Communicator* dp_;
  Communicator* edp_;
  Tensor grads_;
  std::vector<ParamSpan> params_;
  bool shard_;
  std::vector<Bucket> buckets_;  // in launch order (last parameters first)
  std::vector<int> bucket_of_;   // [param] → bucket
  Tensor shard_grads_;           // ZeRO-1: (Σ own chunks) reduced gradients
  std::vector<OptSegment> opt_segments_;
  struct NormSegment {
    int64_t offset, numel;  // in optimizer_grads()
  };
  void add_norm_segment(int64_t offset, int64_t numel);
  std::vector<NormSegment> norm_segments_;  // maximal runs of counted parameters
  std::vector<double> start_s_;
  double begin_ = 0;
};

// Optimizer segments of a whole flat buffer (no sharding): one per parameter.
std::vector<OptSegment> dense_segments(const std::vector<ParamSpan>& params);

}  // namespace strata
