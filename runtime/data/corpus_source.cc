#include "runtime/data/corpus_source.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "runtime/base/error.h"
#include "runtime/data/gpt_dataset.h"
#include "runtime/data/indexed.h"
#include "runtime/data/token_shards.h"

namespace strata {
namespace {

class CorpusSource final : public DataSource {
 public:
  CorpusSource(std::vector<std::unique_ptr<GptDataset>> train,
               std::vector<std::unique_ptr<GptDataset>> val, std::vector<double> weights,
               int64_t global_batch, std::string description)
      : train_(std::move(train)),
        val_(std::move(val)),
        train_blend_(weights),
        val_blend_(weights),
        global_batch_(global_batch),
        description_(std::move(description)) {}

  // The vocabulary is the model's (the tokens are checked against it as they are read).
  int vocab_size() const override { return 0; }
  std::string describe() const override { return description_; }

  void sample(Split split, uint64_t iter, int64_t first, int count, int seq_len, int32_t* inputs,
              int32_t* targets) const override {
    const auto& sets = split == Split::kTrain ? train_ : val_;
    const Blend& blend = split == Split::kTrain ? train_blend_ : val_blend_;
    std::vector<int32_t> t(static_cast<size_t>(seq_len) + 1);
    for (int r = 0; r < count; ++r) {
      const uint64_t s =
          iter * static_cast<uint64_t>(global_batch_) + static_cast<uint64_t>(first + r);
      const auto [d, i] = sets.size() == 1 ? std::pair<int, uint64_t>{0, s} : blend.assign(s);
      sets[static_cast<size_t>(d)]->read_sample(i, t.data());
      std::copy(t.begin(), t.end() - 1, inputs + static_cast<int64_t>(r) * seq_len);
      std::copy(t.begin() + 1, t.end(), targets + static_cast<int64_t>(r) * seq_len);
    }
  }

 private:
  std::vector<std::unique_ptr<GptDataset>> train_, val_;
  Blend train_blend_, val_blend_;
  int64_t global_batch_;
  std::string description_;
};

// A dataset path of the config must exist (a prefix's .idx, or a glob's matches): named at its
// key, before any format error about its contents.
void check_exists(const std::string& source, const std::string& path, const std::string& key,
                  const std::string& config_file) {
  if (source == "indexed") {
    std::error_code ec;
    if (!std::filesystem::exists(path + ".idx", ec))
      throw InputError(config_file, key,
                       "an indexed dataset prefix, cannot find '" + path + ".idx'");
    return;
  }
  glob_t g{};
  const int rc = ::glob(path.c_str(), 0, nullptr, &g);
  const size_t n = rc == 0 ? g.gl_pathc : 0;
  globfree(&g);
  if (n == 0) throw InputError(config_file, key, "token shards, '" + path + "' matches no file");
}

}  // namespace

std::vector<MaskedLmCorpus> open_dataset_corpora(const DataConfig& data, const SamplingShape& shape,
                                                 const std::string& config_file,
                                                 std::string* description) {
  std::vector<std::pair<std::string, std::string>> paths;  // (path, its config key)
  std::vector<double> weights;
  if (data.blend) {
    for (size_t i = 0; i < data.blend->size(); ++i) {
      paths.push_back({(*data.blend)[i].path, "data.blend[" + std::to_string(i) + "].path"});
      weights.push_back((*data.blend)[i].weight);
    }
  } else {
    paths.push_back({*data.path, "data.path"});
    weights.push_back(1);
  }
  std::vector<MaskedLmCorpus> corpora;
  *description = data.source == "indexed" ? "indexed" : "tokens";
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto& [path, key] = paths[i];
    check_exists(data.source, path, key, config_file);
    std::shared_ptr<const TokenCorpus> corpus =
        data.source == "indexed" ? open_indexed_dataset(path) : open_token_shards(path);
    if (data.source == "tokens") {
      // llm.c shards carry no document index: their documents are chunks (2^20 tokens), so that
      // train and validation split by chunk. A corpus of a few chunks is re-cut into about 20, of
      // at least 8 samples each (a chunk boundary is where a sample may jump).
      const int64_t total = corpus->num_tokens();
      if (corpus->num_documents() < 20 && total > 0) {
        const int64_t chunk =
            std::clamp<int64_t>(total / 20, 8 * (int64_t{shape.seq_len} + 1), kShardDocumentTokens);
        corpus = open_token_shards(path, chunk);
      }
    }
    corpora.push_back({corpus, weights[i], 0});
    *description += (i ? ", " : " ") + path +
                    (paths.size() > 1 ? " (weight " + std::to_string(weights[i]) + ")" : "");
  }
  return corpora;
}

std::unique_ptr<DataSource> make_corpus_source(const DataConfig& data, uint64_t seed,
                                               const SamplingShape& shape,
                                               const std::string& config_file) {
  std::string description;
  const std::vector<MaskedLmCorpus> corpora =
      open_dataset_corpora(data, shape, config_file, &description);
  std::vector<std::unique_ptr<GptDataset>> train, val;
  std::vector<double> weights;
  int64_t documents = 0, tokens = 0;
  for (const MaskedLmCorpus& c : corpora) {
    train.push_back(std::make_unique<GptDataset>(c.corpus, Split::kTrain, data.val_fraction,
                                                 shape.seq_len, seed, shape.model_vocab));
    val.push_back(std::make_unique<GptDataset>(c.corpus, Split::kVal, data.val_fraction,
                                               shape.seq_len, seed, shape.model_vocab));
    weights.push_back(c.weight);
    documents += c.corpus->num_documents();
    tokens += c.corpus->num_tokens();
  }
  description += ": " + std::to_string(documents) + " documents, " + std::to_string(tokens) +
                 " tokens; train " + std::to_string(train[0]->samples_per_epoch()) +
                 (corpora.size() > 1 ? "+" : "") + " samples per epoch";
  return std::make_unique<CorpusSource>(std::move(train), std::move(val), std::move(weights),
                                        shape.global_batch, std::move(description));
}

}  // namespace strata
