// config_schema.cc — the config's key tables (config_schema.h): one row per key.

#include "launch/config/config_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <utility>

#include "launch/config/config_parse.h"
#include "launch/config/json_values.h"
#include "launch/config/layout_fields.h"
#include "models/registry.h"
#include "runtime/base/check.h"
#include "runtime/base/error.h"

namespace strata {

using json = nlohmann::json;

const char kDefaultPreset[] = "gpt2-124m";

namespace {

// The interval a number must lie in, lower bound `lo` (closed or open) up to `hi` (open; none
// when infinite), with the words an error gives it: "a number > 0", "a number in [0, 1)".
struct Range {
  double lo;
  bool lo_closed;
  double hi = INFINITY;

  bool contains(double x) const { return (lo_closed ? x >= lo : x > lo) && x < hi; }
  std::string expected() const {
    if (std::isinf(hi))
      return std::string("expected a number ") + (lo_closed ? ">= " : "> ") + text(lo);
    return std::string("expected a number in ") + (lo_closed ? "[" : "(") + text(lo) + ", " +
           text(hi) + ")";
  }
  static std::string text(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return buf;
  }
};
Range at_least(double lo) {
  return {lo, true};
}
Range above(double lo) {
  return {lo, false};
}
Range closed_open(double lo, double hi) {
  return {lo, true, hi};
}
Range open_interval(double lo, double hi) {
  return {lo, false, hi};
}

Key section(const char* name) {
  Key k;
  k.name = name;
  return k;
}

// A field's value as JSON: an absent optional is null.
template <class T>
json as_json(const T& v) {
  return json(v);
}
template <class T>
json as_json(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

// The keys of the struct S that `get` finds in a Config. `get` is a generic lambda,
// [](auto& c) -> auto& { return c.model; }, so one accessor serves the read and the write, and
// each key names its field by member pointer: a misspelt field is a compile error.
template <class S, class Get>
class Fields {
 public:
  explicit Fields(Get get) : get_(get) {}

  // An integer >= min.
  Key integer(const char* name, int S::*f, int64_t min, const char* meaning) const {
    return leaf(name, meaning, f, [min](const Reader& r, const std::string& p) {
      return r.value(p, [min](const json& v) { return int_value(v, min); });
    });
  }
  // An integer >= min, or null.
  Key optional_integer(const char* name, std::optional<int> S::*f, int64_t min,
                       const char* meaning) const {
    return leaf(name, meaning, f, [min](const Reader& r, const std::string& p) {
      return r.value(p, [min](const json& v) { return optional_int_value(v, min); });
    });
  }
  // A number in `range`, or null.
  Key optional_number(const char* name, std::optional<double> S::*f, Range range,
                      const char* meaning) const {
    return leaf(name, meaning, f,
                [range](const Reader& r, const std::string& p) -> std::optional<double> {
                  if (r.at(p).is_null()) return std::nullopt;
                  const double v = r.value(p, number_value);
                  r.require(range.contains(v), p, range.expected());
                  return v;
                });
  }
  // A non-negative integer below 2^64.
  Key seed(const char* name, uint64_t S::*f, const char* meaning) const {
    return leaf(name, meaning, f,
                [](const Reader& r, const std::string& p) { return r.value(p, seed_value); });
  }
  // Any number.
  Key number(const char* name, double S::*f, const char* meaning) const {
    return leaf(name, meaning, f,
                [](const Reader& r, const std::string& p) { return r.value(p, number_value); });
  }
  // A number in `range`.
  Key number(const char* name, double S::*f, Range range, const char* meaning) const {
    return leaf(name, meaning, f, [range](const Reader& r, const std::string& p) {
      const double v = r.value(p, number_value);
      r.require(range.contains(v), p, range.expected());
      return v;
    });
  }
  Key boolean(const char* name, bool S::*f, const char* meaning) const {
    return leaf(name, meaning, f,
                [](const Reader& r, const std::string& p) { return r.value(p, bool_value); });
  }
  // One of `options`.
  Key one_of(const char* name, std::string S::*f, std::vector<std::string> options,
             const char* meaning) const {
    return leaf(name, meaning, f, [options](const Reader& r, const std::string& p) {
      return r.value(p, [&options](const json& v) { return one_of_value(v, options); });
    });
  }
  // One of `keywords` or any other non-empty string, which `other` describes.
  Key keyword_or(const char* name, std::string S::*f, std::vector<std::string> keywords,
                 const char* other, const char* meaning) const {
    return leaf(name, meaning, f, [keywords, other](const Reader& r, const std::string& p) {
      const json& v = r.at(p);
      if (!v.is_string() || v.get<std::string>().empty()) {
        r.fail(p, "expected " + join_list(quoted(keywords), ", ") + " or " + other + ", got " +
                      show(v));
      }
      return v.get<std::string>();
    });
  }
  // A non-empty string (a file path), or null.
  Key path(const char* name, std::optional<std::string> S::*f, const char* meaning) const {
    return leaf(name, meaning, f,
                [](const Reader& r, const std::string& p) {
                  return r.value(p, optional_string_value);
                })
        .paths();
  }
  // A non-empty string, or null, which the field holds as "".
  Key optional_name(const char* name, std::string S::*f, const char* meaning) const {
    Key k = leaf(name, meaning, f, [](const Reader& r, const std::string& p) {
      return r.value(p, optional_string_value).value_or("");
    });
    const Get get = get_;
    k.write = [get, f](const Config& c) {
      const std::string& v = get(c).*f;
      return v.empty() ? json(nullptr) : json(v);
    };
    return k;
  }
  // A key of its own kind: `read` returns the checked value (r, path).
  template <class T, class Read>
  Key custom(const char* name, T S::*f, Read read, const char* meaning) const {
    return leaf(name, meaning, f, read);
  }

 private:
  // `read` returns the checked value of the key at a path.
  template <class T, class Read>
  Key leaf(const char* name, const char* meaning, T S::*f, Read read) const {
    const Get get = get_;
    Key k;
    k.name = name;
    k.meaning = meaning;
    k.read = [get, f, read](const Reader& r, const std::string& p, Config& c) {
      get(c).*f = read(r, p);
    };
    k.write = [get, f](const Config& c) { return as_json(get(c).*f); };
    return k;
  }

  Get get_;
};

template <class Get>
auto fields(Get get) {
  using S = std::remove_reference_t<decltype(get(std::declval<Config&>()))>;
  return Fields<S, Get>(get);
}

// data.blend: null or a non-empty list of {"path": string, "weight": number ≥ 0}, the weights
// data.blend: null or a non-empty list of {"path": string, "weight": number ≥ 0}, the weights
// summing to more than 0.
std::optional<std::vector<BlendEntry>> read_blend(const Reader& r, const std::string& p) {
  const json& v = r.at(p);
  if (v.is_null()) return std::nullopt;
  const std::string expected =
      "expected null or a non-empty list of {\"path\": a dataset, \"weight\": a number >= 0}";
  if (!v.is_array() || v.empty()) r.fail(p, expected + ", got " + show(v));
  std::vector<BlendEntry> out;
  double sum = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    const std::string at = p + "[" + std::to_string(i) + "]";
    if (!e.is_object()) r.fail(p, expected + ", entry " + std::to_string(i) + " is " + show(e));
    for (const auto& [key, value] : e.items())
      if (key != "path" && key != "weight")
        r.fail(p, expected + "; entry " + std::to_string(i) + " has unknown key \"" + key + "\"");
    if (!e.contains("path") || !e["path"].is_string() || e["path"].get<std::string>().empty())
      r.fail(p, expected + "; entry " + std::to_string(i) + " needs a \"path\" string");
    if (!e.contains("weight") || !e["weight"].is_number() || !(e["weight"].get<double>() >= 0))
      r.fail(p, expected + "; entry " + std::to_string(i) + " has weight " +
                    (e.contains("weight") ? show(e["weight"]) : std::string("(none)")));
    out.push_back({e["path"].get<std::string>(), e["weight"].get<double>()});
    sum += out.back().weight;
  }
  if (!(sum > 0)) r.fail(p, expected + "; the weights sum to 0");
  return out;
}

// model.rope_scaling: null or Hugging Face's llama3 object, every field given.
std::optional<RopeScaling> read_rope_scaling(const Reader& r, const std::string& p) {
  const json& v = r.at(p);
  if (v.is_null()) return std::nullopt;
  const std::string expected =
      "expected null or {\"rope_type\": \"llama3\", \"factor\": > 0, \"low_freq_factor\": > 0, "
      "\"high_freq_factor\": > low_freq_factor, \"original_max_position_embeddings\": > 0}";
  if (!v.is_object()) r.fail(p, expected + ", got " + show(v));
  RopeScaling s;
  for (const auto& [key, value] : v.items()) {
    const std::string at = p + "." + key;
    if (key == "rope_type" || key == "type") {
      if (!value.is_string() || value.get<std::string>() != "llama3")
        r.fail(p, expected + ", got " + key + " " + show(value));
      s.rope_type = "llama3";
    } else if (key == "original_max_position_embeddings") {
      const std::optional<int64_t> n = as_int64(value);
      if (!n || *n < 1 || *n > INT_MAX) r.fail(p, expected + ", got " + key + " " + show(value));
      s.original_max_position_embeddings = static_cast<int>(*n);
    } else if (key == "factor" || key == "low_freq_factor" || key == "high_freq_factor") {
      if (!value.is_number() || !(value.get<double>() > 0))
        r.fail(p, expected + ", got " + key + " " + show(value));
      (key == "factor"            ? s.factor
       : key == "low_freq_factor" ? s.low_freq_factor
                                  : s.high_freq_factor) = value.get<double>();
    } else {
      r.fail(p, expected + "; unknown key \"" + key + "\"");
    }
  }
  for (const char* need :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
    if (!v.contains(need)) r.fail(p, expected + "; \"" + need + "\" is missing");
  if (!(s.high_freq_factor > s.low_freq_factor))
    r.fail(p, expected + ", got high_freq_factor " + std::to_string(s.high_freq_factor) +
                  " <= low_freq_factor " + std::to_string(s.low_freq_factor));
  return s;
}

// model.mlp_only_layers: a list of distinct layer indices ≥ 0 (config_checks.cc bounds them by
// model.num_layers).
std::vector<int> read_layer_list(const Reader& r, const std::string& p) {
  const json& v = r.at(p);
  const std::string expected = "expected a list of distinct layer indices >= 0";
  if (!v.is_array()) r.fail(p, expected + ", got " + show(v));
  std::vector<int> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::optional<int64_t> n = as_int64(v[i]);
    if (!n || *n < 0 || *n > INT_MAX)
      r.fail(p, expected + ", got " + show(v) + " (entry " + std::to_string(i) + " is " +
                    show(v[i]) + ")");
    if (std::find(out.begin(), out.end(), *n) != out.end())
      r.fail(p, expected + ", got " + show(v) + " (layer " + std::to_string(*n) + " twice)");
    out.push_back(static_cast<int>(*n));
  }
  return out;
}

// A key of the parallel layout: its row of layout_fields.h (its check and its meaning, shared
// with --plan files and --fix), read into and written from Config::layout.
Key layout_key(const char* name) {
  const LayoutField* f = find_layout_field(name);
  STRATA_CHECK(f != nullptr, "no layout field " << name);
  Key k;
  k.name = f->config_key.substr(f->config_key.rfind('.') + 1);
  k.meaning = f->meaning;
  k.read = [f](const Reader& r, const std::string& p, Config& c) {
    r.value(p, [&](const nlohmann::json& v) { f->read(v, c.layout); });
  };
  k.write = [f](const Config& c) { return f->write(c.layout); };
  return k;
}

}  // namespace

const std::vector<Section>& schema() {
  static const std::vector<Section> sections = [] {
    const auto top = fields([](auto& c) -> auto& { return c; });
    const auto model = fields([](auto& c) -> auto& { return c.model; });
    const auto train = fields([](auto& c) -> auto& { return c.train; });
    const auto optimizer = fields([](auto& c) -> auto& { return c.optimizer; });
    const auto data = fields([](auto& c) -> auto& { return c.data; });
    const auto synthetic = fields([](auto& c) -> auto& { return c.data.synthetic; });
    const auto masked_lm = fields([](auto& c) -> auto& { return c.data.masked_lm; });
    const auto checkpoint = fields([](auto& c) -> auto& { return c.checkpoint; });
    const auto log = fields([](auto& c) -> auto& { return c.log; });
    const auto comm = fields([](auto& c) -> auto& { return c.comm; });
    using M = ModelConfig;
    using T = TrainConfig;
    using O = OptimizerConfig;
    using D = DataConfig;
    using K = CheckpointConfig;
    using L = LogConfig;
    return std::vector<Section>{
        {"",
         {section("model"), section("parallel"), section("train"), section("optimizer"),
          section("data"), section("checkpoint"), section("log"), section("comm"),
          top.one_of(
              "device", &Config::device, {"auto", "cpu", "cuda"},
              "auto: the GPU where the build has CUDA and a device is visible, else the CPU")}},
        {"model",
         {model
              .optional_name("preset", &M::preset,
                             "a file of configs/models/ under the explicit keys")
              .defaults_to(kDefaultPreset),
          model.one_of("arch", &M::arch, architecture_names(), "the model architecture"),
          model.integer("num_layers", &M::num_layers, 1, "transformer blocks"),
          model.integer("hidden_size", &M::hidden_size, 1,
                        "residual width; divisible by num_heads (and by parallel.tensor)"),
          model.integer("num_heads", &M::num_heads, 1, "attention heads"),
          model.integer("ffn_hidden_size", &M::ffn_hidden_size, 1,
                        "MLP width; 4 × hidden_size unless given with hidden_size or later"),
          model.integer("seq_len", &M::seq_len, 1, "tokens per sequence (and learned positions)"),
          model
              .integer("vocab_size", &M::vocab_size, 1,
                       "≥ the data's vocabulary; padded to a multiple of 128·t")
              .then([](const Reader& r, const std::string& p, const Config& c) {
                // Padded to a multiple of 128·t, the vocabulary must still be an int.
                r.require(c.model.vocab_size <= (1 << 30), p,
                          "expected a vocab_size at most 2^30 = 1073741824");
              }),
          model.boolean("tie_embeddings", &M::tie_embeddings,
                        "the LM head shares the token embedding"),
          model.number("dropout", &M::dropout, closed_open(0, 1), "only 0 is implemented")
              .then([](const Reader& r, const std::string& p, const Config& c) {
                // The key is part of the documented config, but no layer applies dropout yet;
                // refusing is better than training without the regularisation asked for.
                r.require(c.model.dropout == 0, p, "dropout is not implemented; expected 0");
              }),
          model.number("init_std", &M::init_std, above(0),
                       "N(0, init_std) weights; residual output projections ÷ √(2L)"),
          model.path("init_from", &M::init_from,
                     "a Hugging Face directory (config.json + safetensors, sharded or not) or "
                     "safetensors file of the architecture's class to start from, or a Strata "
                     "checkpoint (or checkpoint.dir) whose weights alone are taken"),
          model.optional_integer("num_key_value_heads", &M::num_key_value_heads, 1,
                                 "llama: key/value heads (grouped-query attention); null: "
                                 "num_heads, 1: multi-query"),
          model.number("rope_theta", &M::rope_theta, above(0),
                       "llama: the rotary embeddings' base"),
          model.custom("rope_scaling", &M::rope_scaling, read_rope_scaling,
                       "llama: null, or Llama 3.1's {\"rope_type\": \"llama3\", \"factor\", "
                       "\"low_freq_factor\", \"high_freq_factor\", "
                       "\"original_max_position_embeddings\"}"),
          model.number("rms_norm_eps", &M::rms_norm_eps, above(0), "llama: the RMSNorm epsilon"),
          model.integer("type_vocab_size", &M::type_vocab_size, 1,
                        "bert: token types (segments) of the token-type embeddings"),
          model.number("layer_norm_eps", &M::layer_norm_eps, above(0),
                       "bert: the LayerNorm epsilon"),
          model.integer("num_experts", &M::num_experts, 0,
                        "mixtral, qwen3_moe: experts per MoE layer (0: a dense MLP)"),
          model.integer("num_experts_per_tok", &M::num_experts_per_tok, 1,
                        "mixtral, qwen3_moe: experts each token is routed to (top-k)"),
          model.optional_integer("moe_intermediate_size", &M::moe_intermediate_size, 1,
                                 "mixtral, qwen3_moe: each expert's width; null: ffn_hidden_size"),
          model.boolean("norm_topk_prob", &M::norm_topk_prob,
                        "qwen3_moe: the top-k routing weights divided by their sum (mixtral: "
                        "always)"),
          model.number("router_aux_loss_coef", &M::router_aux_loss_coef, at_least(0),
                       "mixtral, qwen3_moe: weight of the load-balancing loss (Hugging Face's)"),
          model.optional_number("moe_capacity_factor", &M::moe_capacity_factor, above(0),
                                "mixtral, qwen3_moe: null routes dropless; cf keeps ⌈cf·k·N/E⌉ "
                                "assignments per expert, those of the largest weights"),
          model.optional_integer("head_dim", &M::head_dim, 1,
                                 "qwen3_moe: the attention's head size; null: hidden_size / "
                                 "num_heads"),
          model.integer("decoder_sparse_step", &M::decoder_sparse_step, 1,
                        "qwen3_moe: layer i is a mixture when (i + 1) % step == 0 (and not in "
                        "mlp_only_layers), else a dense MLP of ffn_hidden_size"),
          model.custom("mlp_only_layers", &M::mlp_only_layers, read_layer_list,
                       "qwen3_moe: layers whose MLP is dense (ffn_hidden_size), whatever "
                       "decoder_sparse_step says")}},
        {"parallel",
         {layout_key("tensor"), layout_key("context"), layout_key("expert"), layout_key("pipeline"),
          layout_key("data"), layout_key("virtual_stages"), layout_key("schedule"),
          layout_key("layers_per_stage"), layout_key("sequence_parallel"),
          layout_key("distributed_optimizer"),
          comm.number("bucket_mb", &CommConfig::bucket_mb, above(0),
                      "gradient bucket size of the data-parallel reduction")}},
        {"train",
         {layout_key("micro_batch_size"),
          train.integer("global_batch_size", &T::global_batch_size, 1,
                        "sequences per optimizer step = micro × micro-batches × d"),
          train.integer("iterations", &T::iterations, 0, "optimizer steps"),
          train.seed("seed", &T::seed, "the model and the data order depend on it alone"),
          layout_key("recompute"),
          train.one_of("precision", &T::precision, {"fp32", "bf16"},
                       "fp32, or bf16 mixed precision"),
          train.one_of("attention_backend", &T::attention_backend, {"auto", "strata", "cudnn"},
                       "attention kernels: Strata's own, cuDNN's, or the faster that runs"),
          train.optional_integer("threads", &T::threads, 1,
                                 "CPU threads per rank; null: OMP_NUM_THREADS, else cores ÷ ranks"),
          train.integer("eval_interval", &T::eval_interval, 0,
                        "validation every N steps and at the last (0: never)"),
          train.integer("eval_iters", &T::eval_iters, 1, "validation batches"),
          train.boolean("skip_nonfinite", &T::skip_nonfinite,
                        "skip a step whose loss or gradient is not finite")}},
        {"optimizer",
         {optimizer.one_of("name", &O::name, {"adamw"}, "AdamW, decoupled weight decay"),
          optimizer.number("lr", &O::lr, at_least(0), "peak learning rate"),
          optimizer.number("min_lr", &O::min_lr, "final learning rate, 0 ≤ min_lr ≤ lr")
              .then([](const Reader& r, const std::string& p, const Config& c) {
                const OptimizerConfig& o = c.optimizer;
                if (!(o.min_lr >= 0 && o.min_lr <= o.lr)) {
                  r.fail_latest({p, "optimizer.lr"},
                                "expected min_lr in [0, lr = " + show(r.at("optimizer.lr")) +
                                    "], got min_lr " + show(r.at(p)));
                }
              }),
          optimizer.integer("warmup_iters", &O::warmup_iters, 0, "linear warm-up from 0"),
          optimizer.one_of("decay", &O::decay,
                           {"cosine", "linear", "constant", "wsd", "inverse-square-root"},
                           "the shape of the decay to min_lr at decay_iters"),
          optimizer.optional_integer("decay_iters", &O::decay_iters, 0,
                                     "where the decay ends; null: train.iterations"),
          optimizer.optional_integer("wsd_decay_iters", &O::wsd_decay_iters, 1,
                                     "decay wsd: the cool-down's iterations, ending at "
                                     "decay_iters"),
          optimizer.one_of("wsd_decay_style", &O::wsd_decay_style,
                           {"exponential", "linear", "cosine", "minus_sqrt"},
                           "decay wsd: the cool-down's shape"),
          optimizer.number("weight_decay", &O::weight_decay, at_least(0),
                           "decoupled, on matrices and embeddings only"),
          optimizer.number("beta1", &O::beta1, closed_open(0, 1), "first-moment decay"),
          optimizer.number("beta2", &O::beta2, closed_open(0, 1), "second-moment decay"),
          optimizer.number("eps", &O::eps, above(0), "added to the second moment's root"),
          optimizer.number("grad_clip", &O::grad_clip, at_least(0),
                           "global-norm clipping; 0: off")}},
        {"data",
         {data.one_of("source", &D::source, {"synthetic", "text", "tokens", "indexed"},
                      "synthetic, text (UTF-8), tokens (llm.c shards) or indexed (Megatron "
                      ".idx/.bin)"),
          data.path("path", &D::path,
                    "the text file, the token shards (a path or glob) or the indexed prefix"),
          data.number("val_fraction", &D::val_fraction, open_interval(0, 1),
                      "held out for validation: the last fraction of a text file, of a "
                      "dataset's documents"),
          section("synthetic"),
          data.custom("blend", &D::blend, read_blend,
                      "null, or [{\"path\", \"weight\"}, …]: datasets of data.source's kind "
                      "mixed by weight, instead of data.path")
              .paths(),
          data.path("tokenizer", &D::tokenizer,
                    "a tokenizer.json or tiktoken file: a text source is tokenized with it; "
                    "a tokens or indexed dataset's ids are decoded with it (bits per byte)"),
          section("masked_lm")}},
        {"data.masked_lm",
         {masked_lm.number("mask_prob", &MaskedLmDataConfig::mask_prob, open_interval(0, 1),
                           "bert: positions chosen for prediction (80% [MASK], 10% random, 10% "
                           "kept)"),
          masked_lm.number("short_seq_prob", &MaskedLmDataConfig::short_seq_prob, closed_open(0, 1),
                           "bert: samples cut shorter than seq_len at random"),
          masked_lm.boolean("sentence_order", &MaskedLmDataConfig::sentence_order,
                            "bert: sentence order (ALBERT's SOP) instead of next sentence"),
          masked_lm.optional_integer("cls_id", &MaskedLmDataConfig::cls_id, 0,
                                     "bert: [CLS]; null: model.vocab_size − 4"),
          masked_lm.optional_integer("sep_id", &MaskedLmDataConfig::sep_id, 0,
                                     "bert: [SEP]; null: model.vocab_size − 3"),
          masked_lm.optional_integer("mask_id", &MaskedLmDataConfig::mask_id, 0,
                                     "bert: [MASK]; null: model.vocab_size − 2"),
          masked_lm.optional_integer("pad_id", &MaskedLmDataConfig::pad_id, 0,
                                     "bert: [PAD]; null: model.vocab_size − 1")}},
        {"data.synthetic",
         {synthetic.integer("vocab_size", &SyntheticDataConfig::vocab_size, 1,
                            "the Markov chain's vocabulary"),
          synthetic.integer("order", &SyntheticDataConfig::order, 0, "the Markov chain's order"),
          synthetic.seed("seed", &SyntheticDataConfig::seed, "the Markov chain's seed")}},
        {"checkpoint",
         {checkpoint.path("dir", &K::dir, "where checkpoints are saved; null: nowhere"),
          checkpoint.integer("interval", &K::interval, 0,
                             "steps between checkpoints (0: never; > 0 needs dir)"),
          checkpoint.integer("keep", &K::keep, 0, "the newest checkpoints kept (0: all)"),
          checkpoint
              .keyword_or("resume", &K::resume, {"auto", "none"}, "a checkpoint path",
                          "auto: the latest in dir; none; or a checkpoint path")
              .paths({"auto", "none"}),
          checkpoint.boolean("async", &K::async,
                             "write the shards in the background while training goes on")}},
        {"log",
         {log.integer("interval", &L::interval, 1, "console progress line every N steps"),
          log.path("metrics", &L::metrics, "JSON Lines file of per-iteration metrics (rank 0)"),
          log.path("trace", &L::trace, "Chrome trace of the run"),
          log.integer("sample_interval", &L::sample_interval, 0,
                      "a greedy sample every N steps (0: never; pipeline 1)"),
          log.optional_name("sample_prompt", &L::sample_prompt,
                            "the samples' prompt: text (data.tokenizer or bytes) or ids 1,2,3"),
          log.integer("sample_tokens", &L::sample_tokens, 1, "new tokens per sample")}},
        {"comm",
         {comm.number("timeout_s", &CommConfig::timeout_s, above(0),
                      "watchdog deadline of every blocking wait")}},
    };
  }();
  return sections;
}

const Section* find_section(const std::string& path) {
  for (const Section& s : schema()) {
    if (s.path == path) return &s;
  }
  return nullptr;
}

bool has_key(const Section& s, const std::string& key) {
  return std::any_of(s.keys.begin(), s.keys.end(), [&key](const Key& k) { return k.name == key; });
}

namespace {

// Levenshtein distance, for the unknown key's suggestion.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string unknown_key_message(const Section& s, const std::string& key) {
  std::vector<std::string> names;
  for (const Key& k : s.keys) names.push_back(k.name);
  std::string suggestion;
  for (const Section& other : schema())
    if (other.path != s.path && !other.path.empty() && has_key(other, key) &&
        !find_section(join(other.path, key))) {
      suggestion = join(other.path, key);
      break;
    }
  if (suggestion.empty()) {
    size_t best = 3;  // at most two edits
    for (const std::string& name : names)
      if (const size_t d = edit_distance(key, name); d < best) {
        best = d;
        suggestion = name;
      }
  }
  return "unknown key (" + (suggestion.empty() ? "" : "did you mean " + suggestion + "? ") +
         "known " + (s.path.empty() ? std::string("top-level keys") : "keys of " + s.path) + ": " +
         join_list(names, ", ") + ")";
}

// Calls f(path, key) for every leaf of the section at `path` and of its nested sections, in
// table order.
void for_each_leaf(const std::string& path,
                   const std::function<void(const std::string&, const Key&)>& f) {
  for (const Key& k : find_section(path)->keys) {
    const std::string sub = join(path, k.name);
    if (k.is_section()) {
      for_each_leaf(sub, f);
    } else {
      f(sub, k);
    }
  }
}

// Checks `j` against the section `schema_path`: an object, known keys only, nested sections
// objects too. `where` is the same place as the file spells it (differs for preset files).
void check_keys(const json& j, const std::string& schema_path, const std::string& where,
                const std::string& file) {
  if (!j.is_object()) {
    throw InputError(file, where,
                     (where.empty() ? "expected a JSON object at the top level, got "
                                    : "expected an object, got ") +
                         show(j));
  }
  const Section& section = *find_section(schema_path);
  for (const auto& [key, value] : j.items()) {
    if (!has_key(section, key))
      throw InputError(file, join(where, key), unknown_key_message(section, key));
    const std::string sub = join(schema_path, key);
    if (find_section(sub)) check_keys(value, sub, join(where, key), file);
  }
}

json to_json(const Config& c) {
  json j = json::object();
  for_each_leaf("",
                [&](const std::string& path, const Key& k) { j[json_path(path)] = k.write(c); });
  return j;
}

// Config's member initialisers, and the few keys whose defaults layer says otherwise.
json default_json() {
  json j = to_json(Config{});
  for_each_leaf("", [&j](const std::string& path, const Key& k) {
    if (k.layer_default) j[json_path(path)] = *k.layer_default;
  });
  return j;
}

// Every key, in table order, with the checks of its kind and its own rule.
Config read_config(const Reader& r) {
  Config c;
  for_each_leaf("", [&r, &c](const std::string& path, const Key& k) {
    k.read(r, path, c);
    if (k.check) k.check(r, path, c);
  });
  return c;
}

std::vector<ConfigKey> config_keys() {
  const json defaults = default_json();
  std::vector<ConfigKey> keys;
  for_each_leaf("", [&](const std::string& path, const Key& k) {
    keys.push_back({path, defaults[json_path(path)].dump(), k.meaning});
  });
  return keys;
}

}  // namespace strata
