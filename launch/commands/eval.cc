#include "launch/commands/eval.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "launch/args.h"
#include "launch/commands/inference.h"
#include "runtime/base/error.h"
#include "runtime/comm/comm.h"
#include "runtime/data/data_source.h"
#include "runtime/io/input_file.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace {

const char kUsage[] =
    "usage: strata eval (--checkpoint DIR | --hf DIR) [--config FILE] [--set k=v ...]\n"
    "                   (--data [train|val] [--batches N] [--batch-size B] | --task FILE.jsonl)\n"
    "                   [--json]\n"
    "  --data SPLIT     loss, perplexity and bits per byte on the config's data, else the\n"
    "                   checkpoint's run's (default split val)\n"
    "  --batches N      batches of --batch-size B sequences of model.seq_len (16 of 8)\n"
    "  --task FILE      multiple choice in HellaSwag's shape ({\"ctx\", \"endings\", \"label\"}\n"
    "                   per line, or ctx_ids / endings_ids): acc and acc_norm\n"
    "  --json           one JSON object instead of the table\n"
    "  Text is tokenized with data.tokenizer, else the checkpoint's (its run's\n"
    "  data.tokenizer), else the Hugging Face directory's tokenizer.json.\n";

// A task's token ids: a JSON array of integers in [0, V). The value given is named as written: an
// id past int32 is not wrapped (4294967301 is not 5), a fraction (1.9) is not cut.
std::vector<int32_t> task_ids(const nlohmann::json& a, const std::string& path,
                              const std::string& at, int V) {
  if (!a.is_array()) throw InputError(path, at, "token ids as an array of integers");
  std::vector<int32_t> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const nlohmann::json& x = a[i];
    const bool in_range =
        (x.is_number_unsigned() && x.get<uint64_t>() < static_cast<uint64_t>(V)) ||
        (x.is_number_integer() && !x.is_number_unsigned() && x.get<int64_t>() >= 0 &&
         x.get<int64_t>() < V);
    if (!in_range)
      throw InputError(path, at + "[" + std::to_string(i) + "]",
                       "a token id: an integer in [0, " + std::to_string(V) +
                           ") (model.vocab_size), got " + x.dump());
    out.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return out;
}

// Σ of the losses of the tokens that count, and how many: one forward of `ids` (B, S + 1 rows
// flattened), the loss counted where `mask` (B, S) is 1.
LossSum score(InferenceSession& s, const std::vector<int32_t>& inputs,
              const std::vector<int32_t>& targets, const std::vector<float>& mask, int B, int S) {
  Backend& be = s.backend();
  Tensor in = be.empty({B, S}, MemCategory::kActivations, DType::kI32);
  Tensor tg = be.empty({B, S}, MemCategory::kActivations, DType::kI32);
  Tensor w = be.empty({B, S}, MemCategory::kActivations);
  be.upload(in, inputs.data());
  be.upload(tg, targets.data());
  be.upload(w, mask.data());
  LossSum loss;
  s.model().forward(ModelBatch{in, tg, w}, &loss);
  return loss;
}

size_t utf8_chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// A batch of --data is one forward: its f32 logits (B · seq_len · vocab) are allocated whole.
// More than this is a --batch-size no machine holds (2147483647 sequences asked for minutes of
// allocation, then a bare std::bad_alloc).
constexpr double kMaxEvalLogitsBytes = 64.0 * (1 << 30);

nlohmann::json eval_data(InferenceSession& s, const std::string& split, int batches, int B) {
  const ModelConfig& m = s.model_config();
  const double per_sequence = 4.0 * m.seq_len * m.vocab_size;
  if (B * per_sequence > kMaxEvalLogitsBytes)
    throw InputError("<command line>", "--batch-size",
                     "at most " +
                         std::to_string(static_cast<int64_t>(kMaxEvalLogitsBytes / per_sequence)) +
                         " sequences (a batch whose logits, seq_len " + std::to_string(m.seq_len) +
                         " × vocab " + std::to_string(m.vocab_size) +
                         " floats a sequence, take at most 64 GiB), got " + std::to_string(B));
  SamplingShape shape;
  shape.seq_len = m.seq_len;
  shape.global_batch = B;
  shape.model_vocab = m.vocab_size;
  const std::unique_ptr<DataSource> data =
      make_data_source(s.config().data, s.config().train.seed, shape, s.config().source_file);
  const Split sp = split == "train" ? Split::kTrain : Split::kVal;
  double nats = 0, tokens = 0, bytes = 0;
  const bool known_bytes = s.tokenizer() != nullptr || s.is_byte_model();
  std::vector<int32_t> in(static_cast<size_t>(B) * m.seq_len), tg(in.size());
  const std::vector<float> ones(in.size(), 1.0f);
  for (int k = 0; k < batches; ++k) {
    data->sample(sp, static_cast<uint64_t>(k), 0, B, m.seq_len, in.data(), tg.data());
    const LossSum l = score(s, in, tg, ones, B, m.seq_len);
    nats += l.sum;
    tokens += l.count;
    if (known_bytes) bytes += static_cast<double>(s.decode(tg).size());
  }
  const double loss = nats / tokens;
  nlohmann::json r = {{"split", split},
                      {"tokens", tokens},
                      {"loss", loss},
                      {"perplexity", std::exp(loss)},
                      {"bits_per_byte", nullptr}};
  if (known_bytes && bytes > 0) r["bits_per_byte"] = nats / std::log(2.0) / bytes;
  return r;
}

nlohmann::json eval_task(InferenceSession& s, const std::string& path) {
  check_input_file(path, kMaxTextFileBytes);
  std::ifstream f(path);
  if (!f) throw InputError(path, "", "a readable JSON Lines task file");
  const int V = s.model_config().vocab_size, S_max = s.model_config().seq_len;
  int examples = 0, correct = 0, correct_norm = 0;
  nlohmann::json all = nlohmann::json::array();
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = "line " + std::to_string(n);
    // Nesting is bounded as every JSON input's (a line nested 100k deep overflowed the stack).
    std::optional<nlohmann::json> parsed;
    try {
      parsed = parse_json_if_json(line, path);
    } catch (const InputError& e) {
      throw InputError(path, at + (e.where().empty() ? "" : ": " + e.where()), e.expected());
    }
    const nlohmann::json j =
        parsed ? std::move(*parsed) : nlohmann::json(nlohmann::json::value_t::discarded);
    const bool ids = j.is_object() && j.contains("endings_ids");
    const char* ctx_key = j.is_object() && j.contains("context") ? "context" : "ctx";
    if (j.is_discarded() || !j.is_object() || !j.contains("label") ||
        !j["label"].is_number_integer() ||
        !(ids ? j.contains("ctx_ids") && j["endings_ids"].is_array()
              : j.contains(ctx_key) && j[ctx_key].is_string() && j.contains("endings") &&
                    j["endings"].is_array()))
      throw InputError(path, at,
                       "an object {\"ctx\": text, \"endings\": [text, ...], \"label\": index} or "
                       "{\"ctx_ids\", \"endings_ids\", \"label\"}");
    const size_t choices = (ids ? j["endings_ids"] : j["endings"]).size();
    const nlohmann::json& lj = j["label"];
    const int64_t label =
        lj.is_number_unsigned() && lj.get<uint64_t>() > INT64_MAX ? -1 : lj.get<int64_t>();
    if (choices < 2 || label < 0 || label >= static_cast<int64_t>(choices))
      throw InputError(
          path, at + ": label",
          "an index into " + std::to_string(choices) + " endings (at least 2), got " + lj.dump());
    std::vector<double> ll, ll_norm;
    for (size_t e = 0; e < choices; ++e) {
      std::vector<int32_t> context, ending;
      double length = 0;
      try {
        if (ids) {
          context = task_ids(j["ctx_ids"], path, at + ": ctx_ids", V);
          ending = task_ids(j["endings_ids"][e], path,
                            at + ": endings_ids[" + std::to_string(e) + "]", V);
          length = static_cast<double>(ending.size());
        } else {
          // lm-evaluation-harness's pair: trailing spaces of the context go to the ending; the
          // ending's tokens are those of the whole string past the context's.
          std::string ctx = j[ctx_key].get<std::string>();
          std::string end = j["endings"][e].get<std::string>();
          const size_t keep = ctx.find_last_not_of(' ') + 1;
          end = ctx.substr(keep) + end;
          ctx.resize(keep);
          context = s.encode(ctx, "--task");
          const std::vector<int32_t> whole = s.encode(ctx + end, "--task");
          ending.assign(
              whole.begin() + static_cast<int64_t>(std::min(context.size(), whole.size())),
              whole.end());
          length = static_cast<double>(utf8_chars(j["endings"][e].get<std::string>()));
        }
      } catch (const nlohmann::json::exception&) {
        throw InputError(path, at, "token ids as arrays of integers");
      }
      if (context.empty() || ending.empty())
        throw InputError(path, at, "a non-empty context and non-empty endings");
      std::vector<int32_t> all_ids = context;
      all_ids.insert(all_ids.end(), ending.begin(), ending.end());
      for (int32_t id : all_ids)
        if (id < 0 || id >= V)
          throw InputError(path, at,
                           "token ids below model.vocab_size " + std::to_string(V) + ", got " +
                               std::to_string(id));
      // Inputs are all but the last token, cut from the left to the model's positions.
      const int64_t cut = std::max<int64_t>(0, static_cast<int64_t>(all_ids.size()) - 1 - S_max);
      const int S = static_cast<int>(all_ids.size()) - 1 - static_cast<int>(cut);
      std::vector<int32_t> in(all_ids.begin() + cut, all_ids.end() - 1),
          tg(all_ids.begin() + cut + 1, all_ids.end());
      std::vector<float> mask(static_cast<size_t>(S), 0.0f);
      for (int i = std::max(0, S - static_cast<int>(ending.size())); i < S; ++i)
        mask[static_cast<size_t>(i)] = 1.0f;
      const LossSum l = score(s, in, tg, mask, 1, S);
      ll.push_back(-l.sum);
      ll_norm.push_back(-l.sum / std::max(1.0, length));
    }
    const auto best = [](const std::vector<double>& v) {
      return static_cast<int64_t>(std::max_element(v.begin(), v.end()) - v.begin());
    };
    ++examples;
    correct += best(ll) == label;
    correct_norm += best(ll_norm) == label;
    all.push_back(ll);
  }
  if (examples == 0) throw InputError(path, "", "at least one example");
  return {{"task", path},
          {"examples", examples},
          {"acc", static_cast<double>(correct) / examples},
          {"acc_norm", static_cast<double>(correct_norm) / examples},
          {"loglikelihoods", all}};
}

}  // namespace

nlohmann::json evaluate_task(const InferenceSource& source, const std::string& task_path) {
  InferenceSession session(source);
  return eval_task(session, task_path);
}

nlohmann::json evaluate_data(const InferenceSource& source, const std::string& split, int batches,
                             int batch_size) {
  InferenceSession session(source);
  return eval_data(session, split, batches, batch_size);
}

int cmd_eval(const std::vector<std::string>& args) {
  InferenceSource src;
  std::optional<std::string> split, task;
  int batches = 16, batch_size = 8;
  bool json = false;
  std::vector<Flag> flags = source_flags(&src);
  flags.insert(flags.end(), {{"--data",
                              Flag::Kind::kOptionalWord,
                              [&split](const std::string& v) { split = v.empty() ? "val" : v; },
                              {"train", "val"}},
                             value_flag("--task", [&task](const std::string& v) { task = v; }),
                             positive_flag("--batches", &batches),
                             positive_flag("--batch-size", &batch_size),
                             switch_flag("--json", &json)});
  if (!read_flags(args, flags, kUsage, "an option of strata eval (see strata eval --help)"))
    return 0;
  if (split.has_value() == task.has_value())
    bad_flag_of("eval", "--data", "exactly one of --data and --task");
  // Without a config or a data.* override, a checkpoint's data is its run's (run_state.json
  // records the data section); a Hugging Face directory records none, and the default source,
  // the built-in synthetic chain, would be evaluated without a word.
  const bool names_data = !src.config.empty() ||
                          std::any_of(src.sets.begin(), src.sets.end(), [](const std::string& s) {
                            return s.rfind("data.", 0) == 0;
                          });
  if (split && !names_data && !src.checkpoint)
    bad_flag_of("eval", "--data",
                "the data to evaluate: --config FILE with its data section, or --set "
                "data.source=text --set data.path=FILE (--set data.source=synthetic for the "
                "built-in chain); a Hugging Face directory records none");
  src.data_of_run = split && !names_data;
  InferenceSession session(src);
  const nlohmann::json r =
      task ? eval_task(session, *task) : eval_data(session, *split, batches, batch_size);
  if (world().rank != 0) return 0;
  if (json) {
    std::printf("%s\n", r.dump().c_str());
  } else if (task) {
    std::printf("task %s: %d examples | acc %.4f | acc_norm %.4f\n", task->c_str(),
                r["examples"].get<int>(), r["acc"].get<double>(), r["acc_norm"].get<double>());
  } else {
    std::printf(
        "%s split: %.0f tokens | loss %.4f | perplexity %.3f | bits per byte %s\n", split->c_str(),
        r["tokens"].get<double>(), r["loss"].get<double>(), r["perplexity"].get<double>(),
        r["bits_per_byte"].is_null() ? "n/a"
                                     : std::to_string(r["bits_per_byte"].get<double>()).c_str());
  }
  return 0;
}

}  // namespace strata
