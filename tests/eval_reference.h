// eval_reference.h — the validation loss of given parameters by a plain forward pass in one
// process, outside the trainer (no pipeline schedule, no stage, no weight versions): the reference
// for the val_loss a training run reports. Used by test_train.cc and mpi_test_pipeline.cc.
#pragma once

#include <memory>
#include <vector>

#include "launch/train/batches.h"
#include "models/registry.h"
#include "runtime/backend/backend.h"
#include "runtime/base/config.h"
#include "runtime/data/data_source.h"

namespace strata {
namespace testref {

// The mean token loss of validation batches 0 … train.eval_iters − 1 (each a whole global batch
// in one forward) under `params`, the flat parameters of a one-process model of cfg.model.
inline double plain_val_loss(const Config& cfg, const std::vector<float>& params) {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  ModelOptions o;
  o.seed = cfg.train.seed;
  const std::unique_ptr<Model> model = build_model(cfg.model, o, *be);
  if (static_cast<size_t>(model->params().numel()) != params.size()) return -1;
  be->upload(model->params().params(), params.data());
  model->params().params_changed();
  const int B = cfg.train.global_batch_size, S = cfg.model.seq_len;
  SamplingShape shape;
  shape.seq_len = S;
  shape.global_batch = B;
  shape.model_vocab = cfg.model.vocab_size;
  shape.masked_lm = architecture(cfg.model.arch).masked_lm;
  const std::unique_ptr<DataSource> data =
      make_data_source(cfg.data, cfg.train.seed, shape, cfg.source_file);
  double sum = 0, tokens = 0;
  for (int k = 0; k < cfg.train.eval_iters; ++k) {
    SampleBatch h;
    data->sample_batch(Split::kVal, static_cast<uint64_t>(k), 0, B, S, &h);
    const double counted = data->loss_tokens(Split::kVal, static_cast<uint64_t>(k), 0, B, S);
    LossSum loss;
    model->forward(upload_batch(*be, h, B, S, counted / B), &loss);
    sum += loss.sum;
    tokens += counted;
  }
  return sum / tokens;
}

}  // namespace testref
}  // namespace strata
