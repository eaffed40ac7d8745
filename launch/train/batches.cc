#include "launch/train/batches.h"

#include <cstdio>

#include "models/layers/ring_attention.h"
#include "runtime/base/abort_hook.h"
#include "runtime/base/error.h"
#include "runtime/comm/comm.h"

namespace strata {

HostBatch sample_batch(const DataSource& data, const BatchKey& k) {
  HostBatch h;
  data.sample_batch(k.split, k.iter, k.first, k.count, k.seq_len, &h);
  return h;
}

HostBatch context_part(const HostBatch& h, int count, int seq_len, int size, int rank) {
  const ContextChunks ctx{size, rank, seq_len};
  HostBatch part = h;
  part.inputs = ctx.take(h.inputs, count);
  part.targets = ctx.take(h.targets, count);
  if (!h.token_types.empty()) part.token_types = ctx.take(h.token_types, count);
  if (!h.loss_mask.empty()) part.loss_mask = ctx.take(h.loss_mask, count);
  return part;
}

ModelBatch upload_batch(Backend& be, const HostBatch& h, int count, int seq_len,
                        double sentence_loss_weight) {
  const auto put = [&be](const Shape& shape, DType type, const void* host) {
    Tensor t = be.empty(shape, MemCategory::kActivations, type);
    be.upload(t, host);
    return t;
  };
  ModelBatch b;
  b.tokens = put({count, seq_len}, DType::kI32, h.inputs.data());
  b.targets = put({count, seq_len}, DType::kI32, h.targets.data());
  if (!h.token_types.empty()) {  // a masked-LM batch
    b.token_types = put({count, seq_len}, DType::kI32, h.token_types.data());
    b.loss_mask = put({count, seq_len}, DType::kF32, h.loss_mask.data());
    b.key_lengths = put({count}, DType::kI32, h.lengths.data());
    b.sentence_labels = put({count}, DType::kI32, h.sentence_labels.data());
    b.sentence_loss_weight = sentence_loss_weight;
  }
  return b;
}

HostBatch BatchPrefetcher::take(const BatchKey& k) {
  try {
    if (pending_.valid() && key_ == k) return pending_.get();  // rethrows the source's error
    drop();
    return sample_batch(data_, k);
  } catch (const InputError& e) {
    // Bad data this rank alone reads (its sequences) while its peers wait for it in the step's
    // collectives: unwinding would wait on requests they never match, so the rank that found it
    // says so and ends the job here, unless every rank found bad data too (then the error goes
    // up, and the lowest rank prints it: launch/cli.cc).
    if (input_error_agreement(kInputErrorAgreementS) < 0) {
      std::fprintf(stderr, "%s\n", e.what());
      abort_job(2);
    }
    throw;
  }
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
