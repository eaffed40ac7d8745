// commands/generate.h — `strata generate`: text from a trained model, with a key/value cache.
//
//   strata generate (--checkpoint DIR | --hf DIR) [--config FILE] [--set k=v ...]
//                   (--prompt TEXT | --prompt-ids 1,2,3)... [--max-new-tokens N]
//                   [--temperature T] [--top-k K] [--top-p P] [--seed S] [--json]
//
// The model comes from a Strata checkpoint (its recorded model keys) or a Hugging Face directory
// (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, MixtralForCausalLM,
// Qwen3MoeForCausalLM: config.json gives the keys); the config (and --set) gives the rest:
// parallel.tensor under mpirun (a model larger than one device generates on t), device,
// train.precision, and data.tokenizer for text prompts (else the checkpoint's copy of its run's,
// else the directory's tokenizer.json; a model of byte tokens reads text as bytes). The prompt runs
// through the model once (prefill), then each new token is one step over the key/value cache
// (Model::decode): the prefix is never recomputed. Temperature 0 is greedy (the first largest
// logit); otherwise logits / T, top-k, then top-p (the smallest set of tokens whose probability
// reaches P), sampled from a stream keyed by (seed, prompt, step) — the same on every rank. Prompts
// of equal length run as one batch. Without --json, rank 0 streams the text (or ids) as tokens
// come; --json prints one object per prompt {"prompt_ids", "ids", "text"}, `ids` the new tokens
// only.
//
// Thread-safety: one call at a time; collective under mpirun.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launch/commands/inference.h"

namespace strata {

struct GenerateOptions {
  InferenceSource source;  // the model: --checkpoint or --hf, --config, --set
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<std::string> prompts;  // text, tokenized with data.tokenizer (or as bytes)
  int max_new_tokens = 32;
  double temperature = 0;  // 0: greedy
  int top_k = 0;           // 0: all
  double top_p = 1;        // in (0, 1]
  uint64_t seed = 1;
};

struct Generation {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> ids;  // the new tokens only
  std::string text;          // the new tokens decoded ("" without a tokenizer or byte model)
};

// Generates for every prompt (prompt_ids, then prompts). Collective under mpirun; every rank
// returns the same. on_token (optional) sees each prompt batch's new tokens as they come.
// Throws InputError for bad options, prompts or checkpoints.
std::vector<Generation> generate(
    const GenerateOptions& o,
    const std::function<void(size_t prompt, int32_t id)>& on_token = nullptr);

int cmd_generate(const std::vector<std::string>& args);

}  // namespace strata
