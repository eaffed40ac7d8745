// tokenizer_hf.cc — the Hugging Face tokenizer.json loader (tokenizer.h lists what it takes
// and refuses): the BPE vocabulary and merges, the pre-tokenizers (ByteLevel, Split, Sequence)
// and the added tokens, into the Model of tokenizer_model.h. And its writer for a tiktoken
// model (hf_tokenizer_json).
//
// Thread-safety: pure (each call builds its own Model).
#include <nlohmann/json.hpp>

#include "runtime/base/error.h"
#include "runtime/data/tokenizer_model.h"
#include "runtime/io/input_file.h"
#include "runtime/io/json_file.h"

namespace strata::tokenizer_internal {
namespace {

using nlohmann::json;

std::string escape_regex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::strchr("\\^$.|?*+()[]{}", c) != nullptr && c != '\0') out += '\\';
    out += c;
  }
  return out;
}

const json& need(const json& j, const char* key, const std::string& path, const std::string& at) {
  auto it = j.find(key);
  if (it == j.end()) throw InputError(path, at.empty() ? key : at + "." + key, "present");
  return *it;
}

bool flag(const json& j, const char* key, bool dflt, const std::string& path,
          const std::string& at) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) throw InputError(path, at + "." + key, "true or false");
  return it->get<bool>();
}

void add_pre_tokenizer(Model& m, const json& p, const std::string& at) {
  if (p.is_null()) return;
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
    throw InputError(m.path, at + ".type", "a pre-tokenizer type");
  const std::string type = p["type"];
  if (type == "Sequence") {
    const json& list = need(p, "pretokenizers", m.path, at);
    if (!list.is_array()) throw InputError(m.path, at + ".pretokenizers", "a list");
    for (size_t i = 0; i < list.size(); ++i)
      add_pre_tokenizer(m, list[i], at + ".pretokenizers[" + std::to_string(i) + "]");
  } else if (type == "ByteLevel") {
    PreStep s;
    s.add_prefix_space = flag(p, "add_prefix_space", true, m.path, at);
    if (flag(p, "use_regex", true, m.path, at))
      s.regex = std::make_unique<Regex>(kGpt2Pattern, m.path, at);
    m.steps.push_back(std::move(s));
  } else if (type == "Split") {
    PreStep s;
    const json& pat = need(p, "pattern", m.path, at);
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      s.regex =
          std::make_unique<Regex>(pat["Regex"].get<std::string>(), m.path, at + ".pattern.Regex");
    } else if (pat.contains("String") && pat["String"].is_string()) {
      s.regex = std::make_unique<Regex>(escape_regex(pat["String"].get<std::string>()), m.path,
                                        at + ".pattern.String");
    } else {
      throw InputError(m.path, at + ".pattern", "{\"Regex\": ...} or {\"String\": ...}");
    }
    const json& b = need(p, "behavior", m.path, at);
    const std::string bs = b.is_string() ? b.get<std::string>() : "";
    if (bs == "Isolated") {
      s.behavior = SplitBehavior::kIsolated;
    } else if (bs == "Removed") {
      s.behavior = SplitBehavior::kRemoved;
    } else if (bs == "MergedWithPrevious") {
      s.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (bs == "MergedWithNext") {
      s.behavior = SplitBehavior::kMergedWithNext;
    } else if (bs == "Contiguous") {
      s.behavior = SplitBehavior::kContiguous;
    } else {
      throw InputError(m.path, at + ".behavior",
                       "Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous");
    }
    if (flag(p, "invert", false, m.path, at))
      throw InputError(m.path, at + ".invert", "false (inverted splits are not supported)");
    m.steps.push_back(std::move(s));
  } else {
    throw InputError(m.path, at + ".type",
                     "ByteLevel, Split or Sequence (got " + in_quotes(type) + ")");
  }
}

}  // namespace

std::unique_ptr<Model> load_hf(const std::string& path) {
  auto m = std::make_unique<Model>();
  m->path = path;
  const json j = read_json_file(path, kMaxTokenizerFileBytes);
  if (!j.is_object()) throw InputError(path, "", "a tokenizer.json object");
  const json& model = need(j, "model", path, "");
  if (!model.is_object()) throw InputError(path, "model", "an object");
  if (model.contains("type")) {
    const json& t = model["type"];
    if (!t.is_string() || t.get<std::string>() != "BPE")
      throw InputError(path, "model.type", "\"BPE\" (got " + t.dump() + ")");
  }
  if (model.contains("dropout") && !model["dropout"].is_null())
    throw InputError(path, "model.dropout", "null (BPE dropout is not supported)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(k);
    if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      throw InputError(path, std::string("model.") + k, "null (byte-level BPE has none)");
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    throw InputError(path, "normalizer", "null (normalizers are not supported)");
  m->whole_piece_first = flag(model, "ignore_merges", false, path, "model");

  const json& vocab = need(model, "vocab", path, "model");
  if (!vocab.is_object()) throw InputError(path, "model.vocab", "an object of token: id");
  std::string bytes;
  BytesMap spelled;  // byte-level spelling -> id, for the merges
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string where = "model.vocab." + it.key();
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > kMaxTokenId)
      throw InputError(path, where, kIdExpected);
    const int32_t id = it.value().get<int32_t>();
    if (!m->unbyte(it.key(), bytes))
      throw InputError(path, where, "a byte-level token (characters of GPT-2's byte alphabet)");
    m->vocab.set(bytes, id);
    m->set_token(id, bytes);
    spelled.set(it.key(), id);
  }
  m->finish_byte_ids("model.vocab");

  const json& merges = need(model, "merges", path, "model");
  if (!merges.is_array()) throw InputError(path, "model.merges", "a list");
  m->pairs.reserve(merges.size());
  m->rank_id.resize(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string where = "model.merges[" + std::to_string(i) + "]";
    const json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() ||
          s.find(' ', sp + 1) != std::string::npos)
        throw InputError(path, where, "\"left right\": two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw InputError(path, where, "\"left right\" or [left, right]");
    }
    const uint64_t* ia = spelled.find(a);
    const uint64_t* ib = spelled.find(b);
    if (ia == nullptr || ib == nullptr)
      throw InputError(
          path, where,
          "tokens of model.vocab (" + in_quotes(ia == nullptr ? a : b) + " is not one)");
    const uint64_t* ic = spelled.find(a + b);
    if (ic == nullptr)
      throw InputError(path, where,
                       "a merge whose result " + in_quotes(a + b) + " is in model.vocab");
    // Hugging Face collects the merges into a map: a repeated pair takes its last rank.
    m->pairs.set(static_cast<int32_t>(*ia), static_cast<int32_t>(*ib), static_cast<uint32_t>(i));
    m->rank_id[i] = static_cast<int32_t>(*ic);
  }

  m->finish_pairs();

  if (j.contains("pre_tokenizer")) add_pre_tokenizer(*m, j["pre_tokenizer"], "pre_tokenizer");

  std::vector<int> unnormalized, normalized;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    const json& added = j["added_tokens"];
    if (!added.is_array()) throw InputError(path, "added_tokens", "a list");
    for (size_t i = 0; i < added.size(); ++i) {
      const std::string at = "added_tokens[" + std::to_string(i) + "]";
      const json& t = added[i];
      if (!t.is_object()) throw InputError(path, at, "an object");
      const json& id = need(t, "id", path, at);
      const json& content = need(t, "content", path, at);
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId)
        throw InputError(path, at + ".id", kIdExpected);
      if (!content.is_string() || content.get<std::string>().empty())
        throw InputError(path, at + ".content", "a non-empty string");
      if (flag(t, "single_word", false, path, at))
        throw InputError(path, at + ".single_word", "false (single_word is not supported)");
      Special s;
      s.text = content.get<std::string>();
      s.id = id.get<int32_t>();
      s.lstrip = flag(t, "lstrip", false, path, at);
      s.rstrip = flag(t, "rstrip", false, path, at);
      const bool special = flag(t, "special", false, path, at);
      (flag(t, "normalized", !special, path, at) ? normalized : unnormalized)
          .push_back(static_cast<int>(m->specials.size()));
      if (m->holds_other(s.id, s.text))
        throw InputError(path, at + ".id",
                         "an id no other token holds: " + std::to_string(s.id) +
                             " is already the token of bytes " + in_quotes(m->id_bytes[s.id]) +
                             ", not " + in_quotes(s.text));
      m->set_token(s.id, s.text);
      m->specials.push_back(std::move(s));
    }
  }
  for (const auto* group : {&unnormalized, &normalized}) {
    if (group->empty()) continue;
    SpecialMatcher sm;
    for (int k : *group) sm.add(m->specials[k].text, k);
    m->special_passes.push_back(std::move(sm));
  }
  return m;
}

std::string hf_tokenizer_json(const Model& m) {
  if (m.tiktoken_regex.empty())
    throw InputError(m.path, "", "a tiktoken ranks file (this one is a tokenizer.json already)");
  // A token's byte-level spelling: each byte as GPT-2's bytes_to_unicode code point (< 512, so
  // one or two bytes of UTF-8).
  const std::vector<uint32_t> cp = byte_to_unicode();
  const auto spell = [&cp](std::string_view bytes) {
    std::string s;
    for (unsigned char c : bytes) {
      const uint32_t u = cp[c];
      if (u < 0x80) {
        s += static_cast<char>(u);
      } else {
        s += static_cast<char>(0xC0 | (u >> 6));
        s += static_cast<char>(0x80 | (u & 0x3F));
      }
    }
    return s;
  };
  std::vector<bool> special(m.id_bytes.size(), false);
  json added = json::array();
  std::vector<const Special*> by_id;
  for (const Special& t : m.specials) by_id.push_back(&t);
  std::sort(by_id.begin(), by_id.end(),
            [](const Special* a, const Special* b) { return a->id < b->id; });
  for (const Special* t : by_id) {
    special[t->id] = true;
    added.push_back({{"id", t->id},
                     {"content", t->text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  // The vocabulary, and as merges every split of a token into two tokens, ordered by the merged
  // token's rank (its id), then the left and right tokens' (transformers' TikTokenConverter
  // orders them so too): Hugging Face's BPE then merges the adjacent pair whose result has the
  // lowest rank, tiktoken's rule. (Where two pairs making the same token are adjacent to each
  // other, tiktoken merges the leftmost and tokenizers the one listed first.)
  json vocab = json::object();
  std::vector<std::tuple<int32_t, int32_t, int32_t>> merges;  // (merged, left, right)
  for (size_t id = 0; id < m.id_bytes.size(); ++id) {
    if (!m.id_known[id] || special[id]) continue;
    const std::string& bytes = m.id_bytes[id];
    vocab[spell(bytes)] = id;
    m.for_each_split(bytes, [&merges, id](int32_t a, int32_t b) {
      merges.emplace_back(static_cast<int32_t>(id), a, b);
    });
  }
  std::sort(merges.begin(), merges.end());
  json merge_list = json::array();
  for (const auto& [merged, a, b] : merges)
    merge_list.push_back(spell(m.id_bytes[a]) + " " + spell(m.id_bytes[b]));
  json bpe = {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              // tiktoken takes a pre-token that is a token whole, before any merge.
              {"ignore_merges", true},
              {"vocab", std::move(vocab)},
              {"merges", std::move(merge_list)}};
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", m.tiktoken_regex}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", false}};
  json out = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", std::move(added)},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "Sequence"}, {"pretokenizers", json::array({split, byte_level})}}},
              {"post_processor", nullptr},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"model", std::move(bpe)}};
  return out.dump(1, ' ', false, json::error_handler_t::strict) + "\n";
}

}  // namespace strata::tokenizer_internal
