#include "launch/train/sampling.h"

#include <algorithm>

#include "runtime/base/error.h"

namespace strata {
namespace {

bool byte_model(const Config& cfg) {
  return cfg.model.vocab_size >= 256 && cfg.model.vocab_size <= 257;
}

// log.sample_prompt as token ids: text through the tokenizer (data.tokenizer's, or null), bytes
// for a byte model, else comma-separated ids; none: token 0.
std::vector<int32_t> prompt_ids(const Config& cfg, const Tokenizer* tok) {
  const std::string& p = cfg.log.sample_prompt;
  if (p.empty()) return {0};
  std::vector<int32_t> ids;
  if (tok) {
    ids = tok->encode(p);
  } else if (byte_model(cfg)) {
    for (unsigned char c : p) ids.push_back(c);
  } else if (!parse_token_ids(p, &ids)) {
    throw InputError(
        cfg.source_file, "log.sample_prompt",
        "comma-separated token ids (no data.tokenizer, not a byte model), got \"" + p + "\"");
  }
  for (int32_t id : ids)
    if (id < 0 || id >= cfg.model.vocab_size)
      throw InputError(cfg.source_file, "log.sample_prompt",
                       "token ids below model.vocab_size " + std::to_string(cfg.model.vocab_size) +
                           ", got " + std::to_string(id));
  if (ids.empty()) ids.push_back(0);
  return ids;
}

}  // namespace

TrainingSampler::TrainingSampler(const Config& cfg, Model& model, Backend& be,
                                 Communicator* pipeline)
    : cfg_(cfg), model_(model), be_(be), pipeline_(pipeline) {
  if (cfg.log.sample_interval <= 0) return;
  if (cfg.data.tokenizer) tok_ = Tokenizer::load(*cfg.data.tokenizer);
  prompt_ = prompt_ids(cfg, tok_.get());
  if (static_cast<int64_t>(prompt_.size()) + cfg.log.sample_tokens > cfg.model.seq_len)
    throw InputError(cfg.source_file, "log.sample_tokens",
                     "the prompt's " + std::to_string(prompt_.size()) + " + " +
                         std::to_string(cfg.log.sample_tokens) + " tokens within model.seq_len " +
                         std::to_string(cfg.model.seq_len));
}

bool TrainingSampler::due(int iteration) const {
  return cfg_.log.sample_interval > 0 && iteration % cfg_.log.sample_interval == 0;
}

void TrainingSampler::keep(int iteration, const Tensor& weights) {
  if (!due(iteration)) return;
  std::vector<float>& host = kept_[iteration];
  host.resize(static_cast<size_t>(weights.numel()));
  be_.download(host.data(), weights);
}

std::optional<TrainingSample> TrainingSampler::sample(int iteration) {
  if (!due(iteration)) return std::nullopt;
  // 2bw: decode from the weights of that step, then point the model back at the newest.
  ParamStore& params = model_.params();
  const Tensor current = params.params();
  Tensor kept;
  if (auto k = kept_.find(iteration); k != kept_.end()) {
    kept = be_.empty({current.numel()}, MemCategory::kParameters);
    be_.upload(kept, k->second.data());
    kept_.erase(k);
    params.use_params(kept);
  }
  const int P = static_cast<int>(prompt_.size()), N = cfg_.log.sample_tokens;
  std::unique_ptr<GenerationState> st = model_.start_generation(1, P + N);
  std::vector<int32_t> step = prompt_, ids;
  for (int n = 0; n < N; ++n) {
    const std::vector<float> logits =
        decode_over_pipeline(model_, be_, pipeline_, *st, step, static_cast<int>(step.size()));
    step = {static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
    ids.push_back(step[0]);
  }
  if (kept.defined()) params.use_params(current);
  std::string text;
  if (tok_) {
    text = tok_->decode(ids);
  } else if (byte_model(cfg_)) {
    for (int32_t id : ids) text += static_cast<char>(id & 0xFF);
  }
  return TrainingSample{ids, text};
}

}  // namespace strata
