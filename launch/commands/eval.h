// commands/eval.h — `strata eval`: how well a trained model does, on a dataset split or on a
// multiple-choice task.
//
//   strata eval (--checkpoint DIR | --hf DIR) [--config FILE] [--set k=v ...]
//               (--data [train|val] [--batches N] [--batch-size B] | --task FILE.jsonl) [--json]
//
// The model as `strata generate` loads it (commands/inference.h).
//   --data: N batches (default 16) of B sequences (default 8) of model.seq_len tokens of the
//     config's data section's split (default val), drawn as training draws them: mean loss
//     (nats/token), perplexity exp(loss), and bits per byte = Σ loss / ln 2 / the bytes those
//     target tokens decode to (byte models: one per token; with data.tokenizer: the decoded
//     bytes; synthetic data: none).
//   --task: JSON Lines in HellaSwag's shape, one example per line: {"ctx": text, "endings":
//     [text, …], "label": index} ("context" for "ctx" too), or with ids {"ctx_ids": [...],
//     "endings_ids": [[...], …], "label": index}. Each ending is scored by the log-likelihood of
//     its tokens after the context, the pair encoded as lm-evaluation-harness encodes it
//     (context + ending as one string, the ending's tokens those past the context's; trailing
//     spaces of the context move to the ending), the input cut from the left to model.seq_len.
//     acc: the ending of the highest log-likelihood is the label; acc_norm: of the highest
//     log-likelihood per character of the ending (per token for ids). Ties go to the first.
// Prints a table, or with --json one object: {"loss", "perplexity", "bits_per_byte", "tokens"}
// or {"examples", "acc", "acc_norm", "loglikelihoods": [[...], …]}.
//
// Thread-safety: one call at a time; collective under mpirun.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/commands/inference.h"

namespace strata {

// The two evaluations, as the --json objects above (collective under mpirun).
nlohmann::json evaluate_task(const InferenceSource& source, const std::string& task_path);
nlohmann::json evaluate_data(const InferenceSource& source, const std::string& split, int batches,
                             int batch_size);

int cmd_eval(const std::vector<std::string>& args);

}  // namespace strata
