#include "launch/train/batches.h"

namespace strata {

HostBatch sample_batch(const DataSource& data, const BatchKey& k) {
  HostBatch h;
  h.inputs.resize(static_cast<size_t>(k.count) * static_cast<size_t>(k.seq_len));
  h.targets.resize(h.inputs.size());
  data.sample(k.split, k.iter, k.first, k.count, k.seq_len, h.inputs.data(), h.targets.data());
  return h;
}

ModelBatch upload_batch(Backend& be, const HostBatch& h, int count, int seq_len) {
  ModelBatch b;
  b.tokens = be.empty({count, seq_len}, MemCategory::kActivations, DType::kI32);
  b.targets = be.empty({count, seq_len}, MemCategory::kActivations, DType::kI32);
  be.upload(b.tokens, h.inputs.data());
  be.upload(b.targets, h.targets.data());
  return b;
}

HostBatch BatchPrefetcher::take(const BatchKey& k) {
  if (pending_.valid() && key_ == k) return pending_.get();  // rethrows the source's error
  drop();
  return sample_batch(data_, k);
}

void BatchPrefetcher::prefetch(const BatchKey& k) {
  drop();
  key_ = k;
  const DataSource* data = &data_;
  pending_ = std::async(std::launch::async, [data, k] { return sample_batch(*data, k); });
}

void BatchPrefetcher::drop() {
  if (!pending_.valid()) return;
  pending_.wait();
  pending_ = std::future<HostBatch>();  // an unused guess's error is not this batch's
}

}  // namespace strata
