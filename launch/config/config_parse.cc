// config_parse.cc — layered config loading (defaults < preset < file < --set), strict checks.
//
// Layering happens on JSON before any value is read: every layer is checked for unknown keys on
// its own, so an unknown key is reported against the file (or "<command line>") that spelled it;
// the layers are then merged key by key over the defaults, remembering which layer set each
// leaf. Values are read into Config only after merging, so a type or range error names the
// source that last set the bad value, and a consistency error names the most recently set of
// the keys involved (the one the user is most likely to have just changed).
//
// Every key is written once, in the tables of schema(): its name, where it lives in Config, its
// kind and single-key checks, and its meaning. The known-key lists, the defaults (Config's own
// member initialisers), the reads and the resolved JSON all come from those tables; only the
// checks that combine several keys are code (check_consistency, validate_for_world).

#include "launch/config/config_parse.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "models/registry.h"
#include "runtime/base/error.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace {

using json = nlohmann::json;

const char kCommandLine[] = "<command line>";
const char kDefaultsFile[] = "<defaults>";
// DESIGN.md's default model. The built-in model defaults are its sizes, so the preset is only
// read from disk when a config names one: a defaults-only run needs no files.
const char kDefaultPreset[] = "gpt2-124m";

// Layers, lowest first. A leaf's layer decides whether ffn_hidden_size is derived from
// hidden_size and which source a consistency error blames.
enum Layer : int { kLayerDefaults = 0, kLayerPreset = 1, kLayerFile = 2, kLayerFirstSet = 3 };
// A layer set over a finished config (config_with_layer): above every --set.
constexpr int kLayerOver = INT_MAX;

struct Origin {
  std::string file;
  int layer = kLayerDefaults;
  // Prefix of the config path that the file does not spell: a preset file holds the keys of
  // the model section at its top level, so "model.hidden_size" is "hidden_size" there.
  std::string strip;
};
using Origins = std::map<std::string, Origin>;  // config path of a leaf -> who set it last

std::string join(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

// "a.b" as a JSON pointer, "/a/b".
json::json_pointer json_path(const std::string& path) {
  std::string p = "/" + path;
  std::replace(p.begin(), p.end(), '.', '/');
  return json::json_pointer(p);
}

std::string join_list(const std::vector<std::string>& items, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? sep : "") + items[i];
  return s;
}

std::vector<std::string> quoted(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const std::string& s : items) out.push_back("\"" + s + "\"");
  return out;
}

// The first `limit` characters or more of v's JSON text, serialised only that far: a value of
// any size costs no more than the cut. Bytes that are not UTF-8 (a --set string) are replaced.
void append_json_prefix(const json& v, size_t limit, std::string* out) {
  auto text = [](const json& x) { return x.dump(-1, ' ', false, json::error_handler_t::replace); };
  if (v.is_object() || v.is_array()) {
    *out += v.is_object() ? '{' : '[';
    for (auto it = v.begin(); it != v.end() && out->size() < limit; ++it) {
      if (it != v.begin()) *out += ',';
      if (v.is_object()) *out += text(json(it.key())) + ':';
      append_json_prefix(it.value(), limit, out);
    }
    *out += v.is_object() ? '}' : ']';
  } else if (v.is_string()) {
    *out += text(json(v.get_ref<const std::string&>().substr(0, limit)));
  } else {
    *out += text(v);
  }
}

// A value as the user wrote it, cut short so that one error stays one line.
std::string show(const json& v) {
  constexpr size_t kMaxChars = 60;
  std::string s;
  append_json_prefix(v, kMaxChars + 1, &s);
  if (s.size() > kMaxChars) {
    size_t cut = kMaxChars;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    s = s.substr(0, cut) + "...";
  }
  return s;
}

// An integer-valued JSON number; 3.0 counts, 3.5 does not. Values beyond int64 saturate, which
// every caller then refuses as out of range.
std::optional<int64_t> as_int64(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d) return std::nullopt;
    if (d >= 9.2e18) return INT64_MAX;
    if (d <= -9.2e18) return INT64_MIN;
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

// Typed, range-checked reads from the merged JSON. Every error names the source that set the
// value (its file and the path as that file spells it).
class Reader {
 public:
  Reader(const json& root, const Origins& origins, std::string fallback_file)
      : root_(root), origins_(origins), fallback_file_(std::move(fallback_file)) {}

  // Every path exists: the merge starts from the defaults, which hold every key.
  const json& at(const std::string& path) const {
    const json* v = &root_;
    for (size_t start = 0;;) {
      const size_t dot = path.find('.', start);
      v = &v->at(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) return *v;
      start = dot + 1;
    }
  }

  Origin origin(const std::string& path) const {
    const auto it = origins_.find(path);
    return it == origins_.end() ? Origin{fallback_file_, kLayerDefaults, ""} : it->second;
  }

  [[noreturn]] void fail(const std::string& path, const std::string& expected) const {
    fail_in(origin(path).file, path, expected);
  }

  // Names `path` in `file`; the path is spelled as `file` spells it when `file` set it.
  [[noreturn]] void fail_in(const std::string& file, const std::string& path,
                            const std::string& expected) const {
    const Origin o = origin(path);
    std::string where = path;
    if (o.file == file && !o.strip.empty() && where.rfind(o.strip, 0) == 0) {
      where = where.substr(o.strip.size());
    }
    throw InputError(file, where, expected);
  }

  // A consistency error among several keys: reported at the key set by the latest layer,
  // since that is the one the user most likely just changed (first listed on ties).
  [[noreturn]] void fail_latest(std::initializer_list<std::string> paths,
                                const std::string& expected) const {
    const std::string* latest = paths.begin();
    for (const std::string& p : paths) {
      if (origin(p).layer > origin(*latest).layer) latest = &p;
    }
    fail(*latest, expected);
  }

  // The file of whichever of `paths` was set last.
  std::string latest_file(std::initializer_list<std::string> paths) const {
    Origin best = origin(*paths.begin());
    for (const std::string& p : paths) {
      if (origin(p).layer > best.layer) best = origin(p);
    }
    return best.file;
  }

  void require(bool ok, const std::string& path, const std::string& expected) const {
    if (!ok) fail(path, expected + ", got " + show(at(path)));
  }

  int integer(const std::string& path, int64_t min) const {
    return *integer_impl(path, min, /*nullable=*/false);
  }
  std::optional<int> optional_integer(const std::string& path, int64_t min) const {
    return integer_impl(path, min, /*nullable=*/true);
  }

  uint64_t seed(const std::string& path) const {
    const json& v = at(path);
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      // 2^64 is exactly representable; anything below it that is integral fits in uint64.
      if (std::isfinite(d) && std::floor(d) == d && d >= 0 && d < 18446744073709551616.0) {
        return static_cast<uint64_t>(d);
      }
    }
    fail(path, "expected a non-negative integer, got " + show(v));
  }

  double number(const std::string& path) const {
    const json& v = at(path);
    if (!v.is_number()) fail(path, "expected a number, got " + show(v));
    return v.get<double>();
  }

  bool boolean(const std::string& path) const {
    const json& v = at(path);
    if (!v.is_boolean()) fail(path, "expected a boolean, got " + show(v));
    return v.get<bool>();
  }

  // Optional strings are all file paths here; "" would only fail later, far from the config.
  std::optional<std::string> optional_string(const std::string& path) const {
    const json& v = at(path);
    if (v.is_null()) return std::nullopt;
    if (!v.is_string()) fail(path, "expected a string or null, got " + show(v));
    if (v.get<std::string>().empty()) fail(path, "expected a non-empty string or null, got \"\"");
    return v.get<std::string>();
  }

  std::string one_of(const std::string& path, const std::vector<std::string>& options) const {
    const json& v = at(path);
    if (v.is_string() &&
        std::find(options.begin(), options.end(), v.get<std::string>()) != options.end()) {
      return v.get<std::string>();
    }
    fail(path, "expected one of " + join_list(quoted(options), ", ") + ", got " + show(v));
  }

  std::optional<std::vector<int>> optional_positive_array(const std::string& path) const {
    const json& v = at(path);
    if (v.is_null()) return std::nullopt;
    const std::string expected = "expected an array of positive integers or null, got " + show(v);
    if (!v.is_array()) fail(path, expected);
    std::vector<int> out;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::optional<int64_t> n = as_int64(v[i]);
      if (!n || *n < 1 || *n > INT_MAX) {
        fail(path, expected + " (entry " + std::to_string(i) + " is " + show(v[i]) + ")");
      }
      out.push_back(static_cast<int>(*n));
    }
    return out;
  }

 private:
  std::optional<int> integer_impl(const std::string& path, int64_t min, bool nullable) const {
    const json& v = at(path);
    if (nullable && v.is_null()) return std::nullopt;
    const std::string or_null = nullable ? " or null" : "";
    const std::optional<int64_t> n = as_int64(v);
    if (!n) fail(path, "expected an integer" + or_null + ", got " + show(v));
    if (*n < min) {
      const std::string what = min == 1   ? "a positive integer"
                               : min == 0 ? "a non-negative integer"
                                          : "an integer >= " + std::to_string(min);
      fail(path, "expected " + what + or_null + ", got " + show(v));
    }
    if (*n > INT_MAX) {
      fail(path, "expected an integer at most " + std::to_string(INT_MAX) + ", got " + show(v));
    }
    return static_cast<int>(*n);
  }

  const json& root_;
  const Origins& origins_;
  std::string fallback_file_;
};

// ---- the key tables ----

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

// A rule of one key beyond its kind, run right after the key is read (the key's path, the
// Config read so far); it throws InputError through the Reader.
using KeyCheck = std::function<void(const Reader&, const std::string& path, const Config&)>;

// One key of a section. A leaf reads itself from the merged JSON into Config, with the checks
// of its kind, and writes itself back as JSON; a key without `read` is a nested section, whose
// keys are the Section at "<section path>.<name>".
struct Key {
  std::string name;
  std::string meaning;  // one line; docs/config.md says it at more length
  std::function<void(const Reader&, const std::string& path, Config&)> read;
  std::function<json(const Config&)> write;
  KeyCheck check;                     // none when the kind says it all
  std::optional<json> layer_default;  // the defaults layer's value, where not Config's own

  bool is_section() const { return !read; }
  Key then(KeyCheck c) && {
    check = std::move(c);
    return std::move(*this);
  }
  Key defaults_to(json v) && {
    layer_default = std::move(v);
    return std::move(*this);
  }
};

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
    return leaf(name, meaning, f,
                [min](const Reader& r, const std::string& p) { return r.integer(p, min); });
  }
  // An integer >= min, or null.
  Key optional_integer(const char* name, std::optional<int> S::*f, int64_t min,
                       const char* meaning) const {
    return leaf(name, meaning, f, [min](const Reader& r, const std::string& p) {
      return r.optional_integer(p, min);
    });
  }
  // A non-negative integer below 2^64.
  Key seed(const char* name, uint64_t S::*f, const char* meaning) const {
    return leaf(name, meaning, f, [](const Reader& r, const std::string& p) { return r.seed(p); });
  }
  // Any number.
  Key number(const char* name, double S::*f, const char* meaning) const {
    return leaf(name, meaning, f,
                [](const Reader& r, const std::string& p) { return r.number(p); });
  }
  // A number in `range`.
  Key number(const char* name, double S::*f, Range range, const char* meaning) const {
    return leaf(name, meaning, f, [range](const Reader& r, const std::string& p) {
      const double v = r.number(p);
      r.require(range.contains(v), p, range.expected());
      return v;
    });
  }
  Key boolean(const char* name, bool S::*f, const char* meaning) const {
    return leaf(name, meaning, f,
                [](const Reader& r, const std::string& p) { return r.boolean(p); });
  }
  // One of `options`.
  Key one_of(const char* name, std::string S::*f, std::vector<std::string> options,
             const char* meaning) const {
    return leaf(name, meaning, f,
                [options](const Reader& r, const std::string& p) { return r.one_of(p, options); });
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
                [](const Reader& r, const std::string& p) { return r.optional_string(p); });
  }
  // A non-empty string, or null, which the field holds as "".
  Key optional_name(const char* name, std::string S::*f, const char* meaning) const {
    Key k = leaf(name, meaning, f, [](const Reader& r, const std::string& p) {
      return r.optional_string(p).value_or("");
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
  // An array of positive integers, or null.
  Key positive_array(const char* name, std::optional<std::vector<int>> S::*f,
                     const char* meaning) const {
    return leaf(name, meaning, f,
                [](const Reader& r, const std::string& p) { return r.optional_positive_array(p); });
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

// The keys of one section ("" the top level, "data.synthetic" a nested one), in DESIGN.md's
// order, so that error messages list them as documented.
struct Section {
  std::string path;
  std::vector<Key> keys;
};

const std::vector<Section>& schema() {
  static const std::vector<Section> sections = [] {
    const auto top = fields([](auto& c) -> auto& { return c; });
    const auto model = fields([](auto& c) -> auto& { return c.model; });
    const auto parallel = fields([](auto& c) -> auto& { return c.parallel; });
    const auto train = fields([](auto& c) -> auto& { return c.train; });
    const auto optimizer = fields([](auto& c) -> auto& { return c.optimizer; });
    const auto data = fields([](auto& c) -> auto& { return c.data; });
    const auto synthetic = fields([](auto& c) -> auto& { return c.data.synthetic; });
    const auto masked_lm = fields([](auto& c) -> auto& { return c.data.masked_lm; });
    const auto checkpoint = fields([](auto& c) -> auto& { return c.checkpoint; });
    const auto log = fields([](auto& c) -> auto& { return c.log; });
    const auto comm = fields([](auto& c) -> auto& { return c.comm; });
    using M = ModelConfig;
    using P = ParallelConfig;
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
                     "safetensors file of the architecture's class to start from"),
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
                       "bert: the LayerNorm epsilon")}},
        {"parallel",
         {parallel.integer("tensor", &P::tensor, 1, "tensor-parallel size t"),
          parallel.integer("pipeline", &P::pipeline, 1, "pipeline stages p"),
          parallel.optional_integer("data", &P::data, 1,
                                    "data-parallel size d; null: world size / (t·p)"),
          parallel.integer("virtual_stages", &P::virtual_stages, 1,
                           "model chunks per stage (interleaved schedule only)"),
          parallel.one_of("schedule", &P::schedule,
                          {"gpipe", "1f1b", "interleaved", "2bw", "zb-h1"},
                          "the pipeline schedule"),
          parallel.positive_array("layers_per_stage", &P::layers_per_stage,
                                  "explicit split: p·v entries summing to model.num_layers"),
          parallel.boolean("sequence_parallel", &P::sequence_parallel,
                           "shard LayerNorm/dropout regions along the sequence"),
          parallel.boolean("distributed_optimizer", &P::distributed_optimizer, "ZeRO-1"),
          parallel.number("bucket_mb", &P::bucket_mb, above(0),
                          "gradient bucket size of the data-parallel reduction")}},
        {"train",
         {train.integer("micro_batch_size", &T::micro_batch_size, 1, "sequences per micro-batch"),
          train.integer("global_batch_size", &T::global_batch_size, 1,
                        "sequences per optimizer step = micro × micro-batches × d"),
          train.integer("iterations", &T::iterations, 0, "optimizer steps"),
          train.seed("seed", &T::seed, "the model and the data order depend on it alone"),
          train.one_of("recompute", &T::recompute, {"none", "selective", "full"},
                       "activation recomputation"),
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
          optimizer.one_of("decay", &O::decay, {"cosine", "linear", "constant"},
                           "the shape of the decay to min_lr at decay_iters"),
          optimizer.optional_integer("decay_iters", &O::decay_iters, 0,
                                     "where the decay ends; null: train.iterations"),
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
                      "mixed by weight, instead of data.path"),
          data.path("tokenizer", &D::tokenizer,
                    "a tokenizer.json or tiktoken file: a text source is tokenized with it"),
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
          checkpoint.keyword_or("resume", &K::resume, {"auto", "none"}, "a checkpoint path",
                                "auto: the latest in dir; none; or a checkpoint path"),
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

std::string unknown_key_message(const Section& s) {
  std::vector<std::string> names;
  for (const Key& k : s.keys) names.push_back(k.name);
  return "unknown key (known " +
         (s.path.empty() ? std::string("top-level keys") : "keys of " + s.path) + ": " +
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
      throw InputError(file, join(where, key), unknown_key_message(section));
    const std::string sub = join(schema_path, key);
    if (find_section(sub)) check_keys(value, sub, join(where, key), file);
  }
}

std::string models_dir() {
  return configs_dir() + "/models";
}

std::string preset_path(const std::string& name) {
  return models_dir() + "/" + name + ".json";
}

std::vector<std::string> known_presets() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(models_dir(), ec)) {
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Preset names become file names; refusing separators keeps a name from reaching outside
// configs/models.
bool valid_preset_name(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-';
  });
}

void merge_into(json& dst, const json& src, const std::string& path, const Origin& origin,
                Origins& origins) {
  for (const auto& [key, value] : src.items()) {
    const std::string sub = join(path, key);
    if (find_section(sub)) {
      merge_into(dst[key], value, sub, origin, origins);
    } else {
      dst[key] = value;
      origins[sub] = origin;
    }
  }
}

// `--set a.b=v` as a one-key layer {"a": {"b": v}}, after checking that a.b is a known key.
json parse_set(const std::string& arg) {
  const size_t eq = arg.find('=');
  const std::string path = arg.substr(0, eq);
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const bool empty_part =
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); });
  if (eq == std::string::npos || empty_part) {
    throw InputError(kCommandLine, "--set " + arg, "expected section.key=value");
  }
  std::string at;
  for (const std::string& part : parts) {
    const Section* section = find_section(at);
    if (!section) {
      throw InputError(kCommandLine, join(at, part),
                       "unknown key (" + at + " is a value, not a section)");
    }
    if (!has_key(*section, part)) {
      throw InputError(kCommandLine, join(at, part), unknown_key_message(*section));
    }
    at = join(at, part);
  }
  const std::string text = arg.substr(eq + 1);
  json value;
  try {
    value = parse_json_if_json(text, kCommandLine).value_or(json(text));
  } catch (const InputError& e) {
    // JSON Strata cannot hold (too deep, a number beyond double's range), at its path in a.b.
    const std::string& w = e.where();
    throw InputError(e.file(), w.empty() || w[0] == '[' ? at + w : join(at, w), e.expected());
  }
  if (find_section(at)) check_keys(value, at, at, kCommandLine);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    json wrapped = json::object();
    wrapped[*it] = std::move(value);
    value = std::move(wrapped);
  }
  return value;
}

// ffn_hidden_size follows hidden_size (4x) unless it was given at the same layer as
// hidden_size or later: a file that widens a preset's hidden_size widens its FFN too.
void derive_ffn(json& merged, Origins& origins) {
  auto layer_of = [&origins](const std::string& p) {
    const auto it = origins.find(p);
    return it == origins.end() ? static_cast<int>(kLayerDefaults) : it->second.layer;
  };
  if (layer_of("model.ffn_hidden_size") >= layer_of("model.hidden_size")) return;
  const std::optional<int64_t> hidden = as_int64(merged["model"]["hidden_size"]);
  // A bad hidden_size is reported when it is read, before ffn_hidden_size.
  if (!hidden || *hidden < 1 || *hidden > INT_MAX) return;
  merged["model"]["ffn_hidden_size"] = 4 * *hidden;
  origins["model.ffn_hidden_size"] = origins.at("model.hidden_size");
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

// Combinations that are wrong whatever the world size.
void check_consistency(const Config& c, const Reader& r) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const TrainConfig& t = c.train;
  using std::to_string;

  if (m.hidden_size % m.num_heads != 0) {
    r.fail_latest({"model.hidden_size", "model.num_heads"},
                  "hidden_size " + to_string(m.hidden_size) + " is not divisible by num_heads " +
                      to_string(m.num_heads));
  }

  if (m.num_heads % m.kv_heads() != 0) {
    r.fail_latest({"model.num_key_value_heads", "model.num_heads"},
                  "num_heads " + to_string(m.num_heads) +
                      " is not a multiple of num_key_value_heads " + to_string(m.kv_heads()));
  }

  if (p.virtual_stages > 1 && p.schedule != "interleaved") {
    r.fail_latest({"parallel.virtual_stages", "parallel.schedule"},
                  "virtual_stages " + to_string(p.virtual_stages) +
                      " needs schedule \"interleaved\", got \"" + p.schedule + "\"");
  }
  if (p.schedule == "interleaved" && p.pipeline < 2) {
    r.fail_latest(
        {"parallel.schedule", "parallel.pipeline"},
        "schedule \"interleaved\" needs pipeline >= 2, got pipeline " + to_string(p.pipeline));
  }
  // One entry per model chunk; every layer in exactly one chunk, never silently dropped.
  const int64_t chunks = int64_t{p.pipeline} * p.virtual_stages;
  const std::string chunks_text = "pipeline " + to_string(p.pipeline) + " × virtual_stages " +
                                  to_string(p.virtual_stages) + " = " + to_string(chunks);
  if (p.layers_per_stage) {
    const std::vector<int>& lps = *p.layers_per_stage;
    if (static_cast<int64_t>(lps.size()) != chunks) {
      r.fail_latest(
          {"parallel.layers_per_stage", "parallel.pipeline", "parallel.virtual_stages"},
          "expected " + chunks_text + " entries in layers_per_stage, got " + to_string(lps.size()));
    }
    int64_t sum = 0;
    for (int n : lps) sum += n;
    if (sum != m.num_layers) {
      r.fail_latest({"parallel.layers_per_stage", "model.num_layers"},
                    "layers_per_stage sums to " + to_string(sum) + " but num_layers is " +
                        to_string(m.num_layers) + " (every layer must be in exactly one stage)");
    }
  } else if (m.num_layers < chunks) {
    r.fail_latest({"model.num_layers", "parallel.pipeline", "parallel.virtual_stages"},
                  "num_layers " + to_string(m.num_layers) + " is fewer than the " + chunks_text +
                      " model chunks (each chunk needs at least one layer)");
  }

  // cuDNN's fused attention serves bf16 operands on a GPU, head sizes multiple of 8 up to 128;
  // asking for it where it cannot run is an error, not a silent fallback.
  if (t.attention_backend == "cudnn") {
    if (c.device != "cuda") {
      r.fail_latest({"train.attention_backend", "device"},
                    "attention_backend \"cudnn\" runs on the GPU: expected device \"cuda\", "
                    "got \"" +
                        c.device + "\"");
    }
    if (t.precision != "bf16") {
      r.fail_latest({"train.attention_backend", "train.precision"},
                    "attention_backend \"cudnn\" is bf16 only (cuDNN's fused attention has no "
                    "fp32 kernels): expected precision \"bf16\", got \"" +
                        t.precision + "\"");
    }
    const int head_size = m.num_heads > 0 ? m.hidden_size / m.num_heads : 0;
    if (head_size % 8 != 0 || head_size > 128) {
      r.fail_latest({"train.attention_backend", "model.hidden_size", "model.num_heads"},
                    "attention_backend \"cudnn\" needs a head size that is a multiple of 8 up "
                    "to 128, got hidden_size / num_heads = head size " +
                        to_string(head_size));
    }
  }

  // Warm-up then decay: a warm-up longer than the decay would end on a rate the decay has
  // already taken to min_lr, a jump nobody asks for (Megatron-LM refuses it too).
  const OptimizerConfig& o = c.optimizer;
  if (o.decay != "constant" && o.decay_iters && o.warmup_iters > *o.decay_iters) {
    r.fail_latest({"optimizer.warmup_iters", "optimizer.decay_iters"},
                  "expected warmup_iters <= decay_iters, got warmup_iters " +
                      to_string(o.warmup_iters) + " > decay_iters " + to_string(*o.decay_iters) +
                      " (the rate would drop from lr to min_lr when the warm-up ends)");
  }

  // Samples during training continue a prompt: an encoder has nothing to generate.
  if (c.log.sample_interval > 0 && architecture(m.arch).masked_lm) {
    r.fail_latest({"log.sample_interval", "model.arch"},
                  "samples continue a prompt with a causal language model: expected "
                  "sample_interval 0 for arch \"" +
                      m.arch + "\" (an encoder), got " + to_string(c.log.sample_interval));
  }

  if (t.global_batch_size % t.micro_batch_size != 0) {
    r.fail_latest({"train.global_batch_size", "train.micro_batch_size"},
                  "global_batch_size " + to_string(t.global_batch_size) +
                      " is not a multiple of micro_batch_size " + to_string(t.micro_batch_size));
  }

  const DataConfig& d = c.data;
  if (d.blend && d.source != "tokens" && d.source != "indexed") {
    r.fail_latest({"data.blend", "data.source"},
                  "data.blend mixes datasets of data.source \"tokens\" or \"indexed\", got \"" +
                      d.source + "\"");
  }
  if (d.blend && d.path) {
    r.fail_latest({"data.blend", "data.path"},
                  "either data.path or data.blend, got both (data.path " + *d.path + ")");
  }
  if (d.tokenizer && d.source != "text") {
    r.fail_latest({"data.tokenizer", "data.source"},
                  "data.tokenizer tokenizes data.source \"text\" (tokens and indexed datasets "
                  "are tokenized already: strata data prepare), got \"" +
                      d.source + "\"");
  }
  if (d.source != "synthetic" && !d.path && !d.blend) {
    // Named at data.path, in the source that chose the file-backed data.source.
    r.fail_in(r.latest_file({"data.source", "data.path"}), "data.path",
              "data.source \"" + d.source + "\" reads a file: expected a string, got null");
  }
  // Token ids index the embedding table, so the data's vocabulary must fit the model's.
  if (d.source == "synthetic" && d.synthetic.vocab_size > m.vocab_size) {
    r.fail_latest({"data.synthetic.vocab_size", "model.vocab_size", "data.source"},
                  "synthetic vocab_size " + to_string(d.synthetic.vocab_size) +
                      " exceeds model vocab_size " + to_string(m.vocab_size));
  }
  if (d.source == "text" && m.vocab_size < 256) {
    r.fail_latest({"model.vocab_size", "data.source"},
                  "data.source \"text\" has byte tokens 0..255: expected model vocab_size >= "
                  "256, got " +
                      to_string(m.vocab_size));
  }

  if (c.checkpoint.interval > 0 && !c.checkpoint.dir) {
    r.fail_in(r.latest_file({"checkpoint.interval", "checkpoint.dir"}), "checkpoint.dir",
              "checkpoint.interval " + to_string(c.checkpoint.interval) +
                  " saves checkpoints: expected a directory, got null");
  }
}

}  // namespace

std::string configs_dir() {
  if (const char* env = std::getenv("STRATA_CONFIGS"); env != nullptr && *env != '\0') return env;
  return std::string(STRATA_SOURCE_DIR) + "/configs";
}

nlohmann::json load_model_preset(const std::string& name, const std::string& file,
                                 const std::string& where) {
  if (!valid_preset_name(name)) {
    throw InputError(
        file, where,
        "expected a preset name (letters, digits, '.', '_', '-'), got " + show(json(name)));
  }
  const std::string path = preset_path(name);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(file, where,
                     "unknown preset " + show(json(name)) + " (known presets in " + models_dir() +
                         ": " + join_list(known_presets(), ", ") + ")");
  }
  json preset = read_json_file(path, kMaxJsonFileBytes, DuplicateKeys::kRefuse);
  check_keys(preset, "model", "", path);
  if (preset.contains("preset")) {
    throw InputError(path, "preset",
                     "unknown key (a preset holds model keys and names no other preset)");
  }
  return preset;
}

Config config_from_json(const nlohmann::json& j, const std::string& file,
                        const std::vector<std::string>& sets) {
  const std::string source = file.empty() ? kDefaultsFile : file;
  check_keys(j, "", "", source);

  struct Layer {
    json value;
    Origin origin;
  };
  std::vector<Layer> layers = {{j, Origin{source, kLayerFile, ""}}};
  for (size_t i = 0; i < sets.size(); ++i) {
    layers.push_back(
        {parse_set(sets[i]), Origin{kCommandLine, kLayerFirstSet + static_cast<int>(i), ""}});
  }

  json merged = default_json();
  Origins origins;
  // The preset sits under the file's keys even when --set names it, so it is found first.
  const Layer* named = nullptr;
  for (const Layer& l : layers) {
    if (l.value.contains("model") && l.value["model"].contains("preset")) named = &l;
  }
  if (named != nullptr) {
    const json& name = named->value["model"]["preset"];
    if (name.is_string()) {
      json preset_layer = json::object();
      preset_layer["model"] =
          load_model_preset(name.get<std::string>(), named->origin.file, "model.preset");
      merge_into(merged, preset_layer, "",
                 Origin{preset_path(name.get<std::string>()), kLayerPreset, "model."}, origins);
    } else if (!name.is_null()) {
      throw InputError(named->origin.file, "model.preset",
                       "expected a string or null, got " + show(name));
    }
  }
  for (const Layer& l : layers) merge_into(merged, l.value, "", l.origin, origins);
  derive_ffn(merged, origins);

  const Reader reader(merged, origins, source);
  Config c = read_config(reader);
  check_consistency(c, reader);
  c.source_file = source;
  c.resolved = to_json(c);
  return c;
}

Config config_with_layer(const Config& c, const nlohmann::json& layer, const std::string& file) {
  check_keys(layer, "", "", file);
  json merged = c.resolved;
  Origins origins;
  // The config's keys keep its file; which layer inside it set each is no longer known.
  for_each_leaf("", [&](const std::string& path, const Key&) {
    origins[path] = Origin{c.source_file, kLayerFile, ""};
  });
  merge_into(merged, layer, "", Origin{file, kLayerOver, ""}, origins);
  const Reader reader(merged, origins, c.source_file);
  Config out = read_config(reader);
  check_consistency(out, reader);
  out.source_file = c.source_file;
  out.resolved = to_json(out);
  return out;
}

ModelConfig checked_model(const ModelConfig& m, const std::string& file) {
  Config c;
  c.model = m;
  json model = to_json(c)["model"];
  model["preset"] = nullptr;
  // The synthetic data's default vocabulary must not be what fails a model of fewer tokens.
  return config_from_json(json{{"model", model}}, file, {"data.synthetic.vocab_size=1"}).model;
}

Config load_config(const std::string& path, const std::vector<std::string>& sets) {
  if (path.empty()) return config_from_json(json::object(), kDefaultsFile, sets);
  return config_from_json(read_json_file(path, kMaxJsonFileBytes, DuplicateKeys::kRefuse), path,
                          sets);
}

void validate_for_world(const Config& c, int world_size) {
  if (world_size < 1) {
    throw std::invalid_argument("validate_for_world: world size " + std::to_string(world_size));
  }
  using std::to_string;
  const std::string& file = c.source_file;
  const ParallelConfig& p = c.parallel;
  const int64_t tp = int64_t{p.tensor} * p.pipeline;
  const std::string world = "world size " + to_string(world_size) + " (mpirun -np)";
  const std::string tp_text =
      "tensor " + to_string(p.tensor) + " × pipeline " + to_string(p.pipeline);
  if (world_size % tp != 0) {
    throw InputError(file, "parallel",
                     world + " is not divisible by " + tp_text + " = " + to_string(tp));
  }
  if (p.data && tp * *p.data != world_size) {
    throw InputError(file, "parallel.data",
                     world + " != " + tp_text + " × data " + to_string(*p.data) + " = " +
                         to_string(tp * *p.data));
  }

  // Tensor parallelism splits heads, the hidden dimension and the FFN across ranks.
  const ModelConfig& m = c.model;
  const std::string by_tensor = " is not divisible by tensor " + to_string(p.tensor);
  if (m.num_heads % p.tensor != 0) {
    throw InputError(file, "model.num_heads", "num_heads " + to_string(m.num_heads) + by_tensor);
  }
  // Each rank holds whole key/value heads: never replicated or rounded (Megatron refuses too).
  if (m.kv_heads() % p.tensor != 0) {
    throw InputError(file, "model.num_key_value_heads",
                     "num_key_value_heads " + to_string(m.kv_heads()) + by_tensor +
                         " (each tensor rank holds whole key/value heads)");
  }
  if (m.hidden_size % p.tensor != 0) {
    throw InputError(file, "model.hidden_size",
                     "hidden_size " + to_string(m.hidden_size) + by_tensor);
  }
  if (m.ffn_hidden_size % p.tensor != 0) {
    throw InputError(file, "model.ffn_hidden_size",
                     "ffn_hidden_size " + to_string(m.ffn_hidden_size) + by_tensor);
  }
  // Sequence parallelism splits the sequence dimension of the activations across the same ranks.
  if (p.sequence_parallel && m.seq_len % p.tensor != 0) {
    throw InputError(file, "parallel.sequence_parallel",
                     "sequence_parallel needs seq_len divisible by tensor: seq_len " +
                         to_string(m.seq_len) + by_tensor);
  }
  // What the architecture adds (its own keys, its own splits).
  architecture(m.arch).validate(m, p.tensor, file);

  const TrainConfig& t = c.train;
  const int64_t d = data_parallel_size(c, world_size);
  const int64_t per_step = int64_t{t.micro_batch_size} * d;
  if (t.global_batch_size % per_step != 0) {
    throw InputError(file, "train.global_batch_size",
                     "global_batch_size " + to_string(t.global_batch_size) +
                         " is not divisible by micro_batch_size " + to_string(t.micro_batch_size) +
                         " × data-parallel size " + to_string(d) + " = " + to_string(per_step));
  }
}

std::vector<ConfigKey> config_keys() {
  const json defaults = default_json();
  std::vector<ConfigKey> keys;
  for_each_leaf("", [&](const std::string& path, const Key& k) {
    keys.push_back({path, defaults[json_path(path)].dump(), k.meaning});
  });
  return keys;
}

int data_parallel_size(const Config& c, int world_size) {
  if (c.parallel.data) return *c.parallel.data;
  return static_cast<int>(world_size / (int64_t{c.parallel.tensor} * c.parallel.pipeline));
}

int microbatches_per_pipeline(const Config& c, int world_size) {
  const int d = data_parallel_size(c, world_size);
  // Before validate_for_world a world smaller than tensor x pipeline gives d = 0.
  if (d < 1) return 0;
  return static_cast<int>(c.train.global_batch_size / (int64_t{c.train.micro_batch_size} * d));
}

}  // namespace strata
