// batches.h — micro-batches from the data source to the model's device.
//
// A micro-batch is sampled on the host (DataSource::sample_batch, a pure function of its key)
// and uploaded as the model's ModelBatch (with a masked-LM source's token types, loss mask,
// lengths and sentence labels). BatchPrefetcher samples the next micro-batch on a host
// thread while the device computes the current one: on a GPU, sampling on the critical path left
// the device idle (10.9 ms of a 46 ms GPT-2 124M step on an H100, synthetic source, CUPTI
// timeline). A prefetched batch is the batch; a guess that is not asked for next (the last batch
// of training, an evaluation in between) is dropped and the batch sampled in place.
//
// Thread-safety: one prefetcher per stage, driven from the training thread; the data source's
// sample() is called from its worker thread.
#pragma once

#include <cstdint>
#include <future>
#include <vector>

#include "models/model.h"
#include "runtime/backend/backend.h"
#include "runtime/data/data_source.h"

namespace strata {

// One micro-batch's data as the source writes it, before it goes to the device.
using HostBatch = SampleBatch;

// Which sequences: slots [first, first + count) of batch `iter` of `split`.
struct BatchKey {
  Split split = Split::kTrain;
  uint64_t iter = 0;
  int64_t first = 0;
  int count = 0, seq_len = 0;
  bool operator==(const BatchKey& o) const {
    return split == o.split && iter == o.iter && first == o.first && count == o.count &&
           seq_len == o.seq_len;
  }
};

HostBatch sample_batch(const DataSource& data, const BatchKey& k);
// Context parallelism: the positions context rank `rank` of `size` holds of each of the batch's
// `count` sequences (models/layers/ring_attention.h's ContextChunks); the per-sequence lengths
// and sentence labels stay whole.
HostBatch context_part(const HostBatch& h, int count, int seq_len, int size, int rank);
// The batch on the device; sentence_loss_weight: ModelBatch's (the tokens that count per
// sequence of the global batch).
ModelBatch upload_batch(Backend& be, const HostBatch& h, int count, int seq_len,
                        double sentence_loss_weight = 1);

class BatchPrefetcher {
 public:
  explicit BatchPrefetcher(const DataSource& data) : data_(data) {}
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;
  ~BatchPrefetcher() { drop(); }

  // The batch of `k`: the prefetched one when it is, else sampled now. Rethrows the source's
  // error; bad data (InputError) that not every rank found ends the job here, with its line and
  // status 2 (input_error_agreement).
  HostBatch take(const BatchKey& k);
  // Starts sampling `k` on a host thread (dropping an unused earlier guess).
  void prefetch(const BatchKey& k);

 private:
  void drop();
  const DataSource& data_;
  BatchKey key_{};
  std::future<HostBatch> pending_;
};

}  // namespace strata
