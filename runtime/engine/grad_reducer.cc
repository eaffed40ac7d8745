#include "runtime/engine/grad_reducer.h"

#include <algorithm>
#include <chrono>

#include "runtime/base/behaviour.h"
#include "runtime/base/check.h"

namespace strata {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::vector<OptSegment> dense_segments(const std::vector<ParamSpan>& params) {
  std::vector<OptSegment> s;
  for (const ParamSpan& p : params) s.push_back({p.offset, p.offset, p.numel, p.decay});
  return s;
}

GradReducer::GradReducer(Backend& backend, Communicator* dp, Tensor grads,
                         std::vector<ParamSpan> params, double bucket_mb, bool shard,
                         Communicator* edp)
    : be_(backend),
      dp_(dp),
      edp_(edp),
      grads_(std::move(grads)),
      params_(std::move(params)),
      shard_(shard && dp != nullptr && dp->size() > 1) {
  const int n = static_cast<int>(params_.size());
  const int64_t bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1048576 / 4));
  bucket_of_.assign(static_cast<size_t>(n), -1);
  // Walk from the last parameter back: the backward pass finishes them in that order.
  for (int i = n - 1; i >= 0;) {
    Bucket b;
    b.last_param = i + 1;
    int64_t elems = 0;
    int j = i;
    // With expert parallelism a bucket holds expert weights or dense ones, never both.
    const bool expert = edp_ != nullptr && params_[static_cast<size_t>(i)].expert;
    while (j >= 0 &&
           (elems == 0 || elems + params_[static_cast<size_t>(j)].numel <= bucket_elems) &&
           (edp_ == nullptr || params_[static_cast<size_t>(j)].expert == expert)) {
      elems += params_[static_cast<size_t>(j)].numel;
      --j;
    }
    b.first_param = j + 1;
    b.comm = expert ? edp_ : dp_;
    b.offset = params_[static_cast<size_t>(b.first_param)].offset;
    b.numel = elems;
    for (int k = b.first_param; k < b.last_param; ++k)
      bucket_of_[static_cast<size_t>(k)] = static_cast<int>(buckets_.size());
    buckets_.push_back(std::move(b));
    i = j;
  }

  if (!shard_) {
    opt_segments_ = dense_segments(params_);
    for (const ParamSpan& p : params_) {
      // With expert parallelism the norm is summed over the data group: each weight counts on
      // the first rank of the group it was reduced over.
      const bool first =
          edp_ == nullptr || (p.expert ? edp_->rank() == 0 : dp_ == nullptr || dp_->rank() == 0);
      if (p.counted && first) add_norm_segment(p.offset, p.numel);
    }
    return;
  }
  // ZeRO-1: this rank owns chunk `rank` of every bucket (in the bucket's group); intersect the
  // chunks with the parameters to get optimizer and norm segments over the compact shard buffer.
  int64_t compact = 0;
  for (Bucket& b : buckets_) {
    const int r = b.comm->rank();
    b.counts = chunk_counts(static_cast<size_t>(b.numel), b.comm->size());
    int64_t before = 0;
    for (int k = 0; k < r; ++k) before += static_cast<int64_t>(b.counts[static_cast<size_t>(k)]);
    const int64_t lo = b.offset + before;
    const int64_t hi = lo + static_cast<int64_t>(b.counts[static_cast<size_t>(r)]);
    b.shard_offset = compact;
    for (int k = b.first_param; k < b.last_param; ++k) {
      const ParamSpan& p = params_[static_cast<size_t>(k)];
      const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (a >= e) continue;
      const int64_t at = compact + (a - lo);
      opt_segments_.push_back({a, at, e - a, p.decay});
      if (p.counted) add_norm_segment(at, e - a);
    }
    compact += hi - lo;
  }
  shard_grads_ = be_.zeros({compact}, MemCategory::kGradients);
}

// Adjacent counted ranges become one: the norm is then a few reductions (one per run of
// counted parameters), not one per parameter — each is a device round trip on a GPU.
void GradReducer::add_norm_segment(int64_t offset, int64_t numel) {
  if (!norm_segments_.empty()) {
    NormSegment& last = norm_segments_.back();
    if (last.offset + last.numel == offset) {
      last.numel += numel;
      return;
    }
  }
  norm_segments_.push_back({offset, numel});
}

double GradReducer::since_begin_s() const {
  return now_s() - begin_;
}

void GradReducer::begin_iteration() {
  for (Bucket& b : buckets_) {
    b.pending = b.last_param - b.first_param;
    b.started = false;
  }
  start_s_.assign(buckets_.size(), -1.0);
  begin_ = now_s();
}

void GradReducer::start(Bucket& b) {
  // The planner prices the reduction of f32 gradients (runtime/base/behaviour.h).
  static_assert(behaviour::kGradientWireBytes == sizeof(float), "gradients are reduced in f32");
  b.started = true;
  start_s_[static_cast<size_t>(&b - buckets_.data())] = now_s() - begin_;
  float* g = grads_.f32() + b.offset;
  if (!b.comm || b.comm->size() == 1) {
    // A group of one (the expert-data group when expert = data): the chunk is the whole bucket.
    if (shard_ && b.numel > 0) {
      Tensor chunk = shard_grads_.view(b.shard_offset, {b.numel});
      be_.copy(chunk, grads_.view(b.offset, {b.numel}));
    }
    return;
  }
  if (shard_) {
    b.req = b.comm->ireduce_scatterv(g, shard_grads_.f32() + b.shard_offset, b.counts, DType::kF32,
                                     ReduceOp::kSum);
  } else {
    b.req = b.comm->iall_reduce(g, static_cast<size_t>(b.numel), DType::kF32, ReduceOp::kSum);
  }
}

void GradReducer::poll() {
  for (Bucket& b : buckets_)
    if (b.req.pending()) b.req.test();
}

void GradReducer::mark_ready(int first, int last) {
  for (int k = first; k < last; ++k) {
    Bucket& b = buckets_[static_cast<size_t>(bucket_of_[static_cast<size_t>(k)])];
    STRATA_CHECK(b.pending > 0, "parameter " << k << " marked ready twice in one iteration");
    // Started here, while the backward pass goes on, or at ReduceGrads (runtime/base/behaviour.h).
    if (--b.pending == 0 && behaviour::kReduceBucketsDuringBackward) start(b);
  }
  poll();
}

void GradReducer::start_unmarked() {
  for (Bucket& b : buckets_) {
    // A parameter the backward pass never marked (not used this step), or a bucket left for
    // ReduceGrads.
    if (!b.started) {
      b.pending = 0;
      start(b);
    }
  }
}

void GradReducer::finish() {
  start_unmarked();
  for (Bucket& b : buckets_) b.req.wait();
}

bool GradReducer::test() {
  start_unmarked();
  bool done = true;
  for (Bucket& b : buckets_) done = b.req.test() && done;
  return done;
}

void GradReducer::use_grads(const Tensor& grads) {
  STRATA_CHECK(grads.numel() == grads_.numel(),
               "gradient buffer of " << grads.numel() << " elements for " << grads_.numel());
  for (const Bucket& b : buckets_)
    STRATA_CHECK(!b.req.pending(), "gradient buffer switched during a reduction");
  grads_ = grads;
}

double GradReducer::local_sum_squares() {
  const Tensor& g = optimizer_grads();
  std::vector<Tensor> views;
  views.reserve(norm_segments_.size());
  for (const NormSegment& n : norm_segments_) views.push_back(g.view(n.offset, {n.numel}));
  return be_.sum_squares_multi(views);
}

void GradReducer::gather_params(Tensor& params) {
  // Blocking, right after the step: the planner prices it so (runtime/base/behaviour.h).
  static_assert(!behaviour::kGatherParamsDuringForward && behaviour::kParamGatherWireBytes == 4,
                "the f32 parameter shards are all-gathered after the step and waited for");
  if (!shard_) return;
  std::vector<Request> reqs;
  for (Bucket& b : buckets_) {
    if (b.comm->size() == 1) continue;  // the whole bucket was this rank's chunk
    const int r = b.comm->rank();
    int64_t before = 0;
    for (int k = 0; k < r; ++k) before += static_cast<int64_t>(b.counts[static_cast<size_t>(k)]);
    float* base = params.f32() + b.offset;
    reqs.push_back(b.comm->iall_gatherv(base + before, base, b.counts, DType::kF32));
  }
  wait_all(reqs);
}

}  // namespace strata
