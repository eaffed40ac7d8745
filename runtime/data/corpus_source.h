// corpus_source.h — the DataSource of tokenized datasets (data.source "tokens" and "indexed",
// one path or a data.blend of several): Megatron's GPT dataset per split over each
// TokenCorpus, blended by weight (runtime/data/gpt_dataset.h).
//
// Sample index: sequence g of the global batch of iteration `iter` is sample iter·B + g of its
// split's stream (B = sequences per iteration), so consecutive iterations read consecutive
// samples (an epoch without replacement), every layout reads the same global batches, and a run
// resumed at iteration i reads what the uninterrupted run read there. Validation batches are
// samples k·B + g of the validation stream for evaluation batch k, the same at every
// evaluation.
//
// Thread-safety: sample() may be called concurrently.
#pragma once

#include <memory>
#include <string>

#include "runtime/base/config.h"
#include "runtime/data/data_source.h"
#include "runtime/data/masked_lm_source.h"

namespace strata {

std::unique_ptr<DataSource> make_corpus_source(const DataConfig& data, uint64_t seed,
                                               const SamplingShape& shape,
                                               const std::string& config_file);

// The corpora of data.path or data.blend (tokens or indexed), opened and checked as
// make_corpus_source opens them, for a masked-LM source; *description names them ("indexed
// data/wiki").
std::vector<MaskedLmCorpus> open_dataset_corpora(const DataConfig& data, const SamplingShape& shape,
                                                 const std::string& config_file,
                                                 std::string* description);

}  // namespace strata
