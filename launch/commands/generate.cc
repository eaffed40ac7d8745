#include "launch/commands/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "launch/args.h"
#include "launch/commands/inference.h"
#include "runtime/base/error.h"
#include "runtime/comm/comm.h"
#include "runtime/data/data_internal.h"
#include "runtime/data/tokenizer.h"

namespace strata {
namespace {

const char kUsage[] =
    "usage: strata generate (--checkpoint DIR | --hf DIR) [--config FILE] [--set k=v ...]\n"
    "                       (--prompt TEXT | --prompt-ids 1,2,3)... [--max-new-tokens N]\n"
    "                       [--temperature T] [--top-k K] [--top-p P] [--seed S] [--json]\n"
    "  --checkpoint DIR   a Strata checkpoint (iter_<N>) or a checkpoint.dir (its newest)\n"
    "  --hf DIR           a Hugging Face directory (GPT2LMHeadModel, LlamaForCausalLM,\n"
    "                     Qwen2ForCausalLM, MistralForCausalLM, MixtralForCausalLM,\n"
    "                     Qwen3MoeForCausalLM)\n"
    "  --config, --set    the other keys: parallel.tensor (under mpirun), device,\n"
    "                     train.precision, data.tokenizer (for text prompts)\n"
    "  --prompt TEXT      tokenized with data.tokenizer, else the checkpoint's (its run's\n"
    "                     data.tokenizer), else the Hugging Face directory's tokenizer.json\n"
    "                     (byte models: its bytes); repeatable\n"
    "  --prompt-ids L     comma-separated token ids; repeatable\n"
    "  --max-new-tokens N new tokens per prompt (default 32)\n"
    "  --temperature T    0 (default): greedy (also below 1e-6); else sample from\n"
    "                     softmax(logits / T)\n"
    "  --top-k K          sample among the K most likely (default 0: all)\n"
    "  --top-p P          sample among the smallest set reaching probability P (default 1)\n"
    "  --seed S           the sampling stream's seed (default 1)\n"
    "  --json             one JSON object per prompt: {\"prompt_ids\", \"ids\", \"text\"}\n";

[[noreturn]] void bad(const std::string& flag, const std::string& expected) {
  bad_flag_of("generate", flag, expected);
}

// The next token from one row of logits.
// Temperatures below this are greedy: softmax(logits / T) is the argmax's one-hot to double
// precision long before (and logits / 2.3e-308 would overflow).
constexpr double kGreedyBelow = 1e-6;

int32_t pick(std::vector<float> logits, const GenerateOptions& o, uint64_t key) {
  const int V = static_cast<int>(logits.size());
  if (o.temperature < kGreedyBelow)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int> order(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  const int k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  std::vector<double> p(static_cast<size_t>(k));
  // exp((l − l_max) / T): the difference first, so that no quotient overflows.
  const double top = logits[static_cast<size_t>(order[0])];
  double sum = 0;
  for (int i = 0; i < k; ++i) {
    const double l = logits[static_cast<size_t>(order[static_cast<size_t>(i)])];
    p[static_cast<size_t>(i)] = std::exp((l - top) / o.temperature);
    sum += p[static_cast<size_t>(i)];
  }
  int keep = k;  // top-p: the smallest prefix reaching the mass
  double mass = 0;
  for (int i = 0; i < k; ++i) {
    mass += p[static_cast<size_t>(i)] / sum;
    if (mass >= o.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0;
  for (int i = 0; i < keep; ++i) kept += p[static_cast<size_t>(i)];
  double u = data_internal::unit_double(mix64(key)) * kept;
  for (int i = 0; i < keep; ++i) {
    u -= p[static_cast<size_t>(i)];
    if (u < 0) return order[static_cast<size_t>(i)];
  }
  return order[static_cast<size_t>(keep - 1)];
}

}  // namespace

std::vector<Generation> generate(const GenerateOptions& o,
                                 const std::function<void(size_t, int32_t)>& on_token) {
  if (o.max_new_tokens < 1) bad("--max-new-tokens", "a positive integer");
  if (!(o.temperature >= 0)) bad("--temperature", "a number >= 0");
  if (o.top_k < 0) bad("--top-k", "an integer >= 0");
  if (!(o.top_p > 0 && o.top_p <= 1))
    bad("--top-p", "a number in (0, 1], got " + std::to_string(o.top_p));
  if (o.prompt_ids.empty() && o.prompts.empty()) bad("--prompt", "at least one prompt");

  InferenceSession session(o.source);
  const ModelConfig& model = session.model_config();
  Model& m = session.model();

  // Prompts as ids: given, or text through the tokenizer (a byte model: bytes).
  std::vector<std::vector<int32_t>> prompts = o.prompt_ids;
  for (const std::string& text : o.prompts) prompts.push_back(session.encode(text, "--prompt"));
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty())
      bad("--prompt", "a non-empty prompt (prompt " + std::to_string(i) + ")");
    for (int32_t id : prompts[i])
      if (id < 0 || id >= model.vocab_size)
        bad("--prompt-ids", "token ids in [0, " + std::to_string(model.vocab_size) +
                                ") (model.vocab_size), got " + std::to_string(id));
    if (static_cast<int64_t>(prompts[i].size()) + o.max_new_tokens > model.seq_len)
      bad("--max-new-tokens", "prompt + new tokens within the model's " +
                                  std::to_string(model.seq_len) + " positions, got " +
                                  std::to_string(prompts[i].size()) + " + " +
                                  std::to_string(o.max_new_tokens));
  }

  // Prompts of one length run as one batch.
  std::vector<Generation> out(prompts.size());
  std::map<size_t, std::vector<size_t>> by_length;
  for (size_t i = 0; i < prompts.size(); ++i) by_length[prompts[i].size()].push_back(i);
  const int V = model.vocab_size;
  for (const auto& [len, which] : by_length) {
    const int B = static_cast<int>(which.size());
    const int64_t capacity = static_cast<int64_t>(len) + o.max_new_tokens;
    std::unique_ptr<GenerationState> st = m.start_generation(B, capacity);
    std::vector<int32_t> step;
    for (size_t i : which) step.insert(step.end(), prompts[i].begin(), prompts[i].end());
    int T = static_cast<int>(len);
    for (int n = 0; n < o.max_new_tokens; ++n) {
      const std::vector<float> logits = m.decode(*st, step, T);
      step.assign(static_cast<size_t>(B), 0);
      for (int b = 0; b < B; ++b) {
        const size_t i = which[static_cast<size_t>(b)];
        const uint64_t key = mix64(mix64(o.seed ^ i) ^ static_cast<uint64_t>(n));
        const int32_t id =
            pick({logits.begin() + int64_t{b} * V, logits.begin() + int64_t{b + 1} * V}, o, key);
        out[i].ids.push_back(id);
        step[static_cast<size_t>(b)] = id;
        if (on_token) on_token(i, id);
      }
      T = 1;
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    out[i].prompt_ids = prompts[i];
    out[i].text = session.decode(out[i].ids);
  }
  return out;
}

int cmd_generate(const std::vector<std::string>& args) {
  GenerateOptions o;
  bool json = false;
  std::vector<Flag> flags = source_flags(&o.source);
  auto number = [](const std::string& flag, std::function<void(double)> take) {
    return value_flag(flag, [flag, take](const std::string& v) { take(number_arg(flag, v)); });
  };
  flags.insert(flags.end(),
               {value_flag("--prompt", [&o](const std::string& v) { o.prompts.push_back(v); }),
                value_flag("--prompt-ids",
                           [&o](const std::string& v) {
                             std::vector<int32_t> ids;
                             if (!parse_token_ids(v, &ids))
                               bad("--prompt-ids", "comma-separated token ids, got \"" + v + "\"");
                             o.prompt_ids.push_back(ids);
                           }),
                number("--max-new-tokens",
                       [&o](double x) {
                         o.max_new_tokens = static_cast<int>(x);
                         if (x != o.max_new_tokens) bad("--max-new-tokens", "an integer");
                       }),
                number("--temperature", [&o](double x) { o.temperature = x; }),
                number("--top-k", [&o](double x) { o.top_k = static_cast<int>(x); }),
                number("--top-p", [&o](double x) { o.top_p = x; }),
                number("--seed", [&o](double x) { o.seed = static_cast<uint64_t>(x); }),
                switch_flag("--json", &json)});
  if (!read_flags(args, flags, kUsage, "an option of strata generate (see strata generate --help)"))
    return 0;
  const bool lead = world().rank == 0;
  const bool stream = lead && !json && o.prompt_ids.size() + o.prompts.size() == 1;
  const std::vector<Generation> gens = generate(o, [&](size_t, int32_t id) {
    if (stream) {
      std::printf("%d ", id);
      std::fflush(stdout);
    }
  });
  if (!lead) return 0;
  if (stream) std::printf("\n");
  for (const Generation& g : gens) {
    if (json) {
      std::printf("%s\n",
                  nlohmann::json{{"prompt_ids", g.prompt_ids}, {"ids", g.ids}, {"text", g.text}}
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                      .c_str());
    } else if (!stream) {
      std::printf("ids:");
      for (int32_t id : g.ids) std::printf(" %d", id);
      std::printf("\n");
    }
    if (!json && !g.text.empty()) std::printf("%s\n", g.text.c_str());
  }
  return 0;
}

}  // namespace strata
