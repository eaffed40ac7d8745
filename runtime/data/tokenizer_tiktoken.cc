// tokenizer_tiktoken.cc — the tiktoken ranks file loader (tokenizer.h): one "<base64 token>
// <rank>" per line, rank == id; the pair table is every split of a token into two tokens, at
// the merged token's rank; the pre-tokenization regex and special tokens come from the pattern
// ("gpt2", "llama3", "cl100k", a regex) or are given.
//
// Thread-safety: pure (each call builds its own Model).
#include <algorithm>
#include <fstream>
#include <map>
#include <tuple>

#include "runtime/base/error.h"
#include "runtime/data/tokenizer_model.h"
#include "runtime/io/input_file.h"

namespace strata::tokenizer_internal {
namespace {

std::string b64decode(std::string_view s, bool* ok) {
  static const std::vector<int> table = [] {
    std::vector<int> t(256, -1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(a[i])] = i;
    return t;
  }();
  std::string out;
  *ok = s.size() % 4 == 0 && !s.empty();
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (size_t i = 0; i < s.size() && *ok; ++i) {
    const unsigned char c = s[i];
    if (c == '=') {
      if (i + 2 < s.size()) *ok = false;
      ++pad;
      continue;
    }
    if (pad > 0 || table[c] < 0) {
      *ok = false;
      break;
    }
    acc = (acc << 6) | table[c];
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Model> load_tiktoken_model(
    const std::string& path, const std::string& pattern_in,
    const std::map<std::string, int32_t>* explicit_specials) {
  auto m = std::make_unique<Model>();
  m->path = path;
  check_input_file(path, kMaxTokenizerFileBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError(path, "", "a readable tokenizer file (tokenizer.json or tiktoken ranks)");
  std::string line;
  int64_t lineno = 0;
  std::vector<std::pair<std::string, int32_t>> tokens;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::string where = "line " + std::to_string(lineno);
    const size_t sp = line.find(' ');
    bool ok = sp != std::string::npos;
    std::string bytes;
    long long rank = -1;
    // Padding alone ("=") is the empty token, as Python's base64.b64decode reads it: Whisper's
    // multilingual.tiktoken ends with one. No piece of text merges into it; decode() gives "".
    const std::string_view field = std::string_view(line).substr(0, ok ? sp : 0);
    if (ok && !field.empty() && field.size() <= 4 &&
        field.find_first_not_of('=') == std::string_view::npos) {
      bytes.clear();
    } else if (ok) {
      bytes = b64decode(field, &ok);
    }
    if (ok) {
      const std::string r = line.substr(sp + 1);
      ok = !r.empty() && r.size() <= 10 &&
           std::all_of(r.begin(), r.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (ok) rank = std::stoll(r);
      ok = ok && rank <= kMaxTokenId;
    }
    if (!ok)
      throw InputError(path, where,
                       "a base64 token, one space and a rank up to " + std::to_string(kMaxTokenId));
    if (m->vocab.find(bytes) != nullptr) throw InputError(path, where, "a token not listed before");
    if (rank < static_cast<long long>(m->id_bytes.size()) && m->id_known[rank])
      throw InputError(path, where, "a rank not used before");
    m->vocab.set(bytes, rank);
    m->set_token(static_cast<int32_t>(rank), bytes);
    tokens.emplace_back(std::move(bytes), static_cast<int32_t>(rank));
  }
  if (tokens.empty()) throw InputError(path, "line 1", "a base64 token, one space and a rank");
  m->finish_byte_ids("");
  m->whole_piece_first = true;
  // Every split of a token into two tokens merges into it, at its rank (which is its id).
  std::vector<std::tuple<int32_t, int32_t, int32_t>> splits;  // (left, right, merged)
  for (const auto& [bytes, rank] : tokens)
    m->for_each_split(
        bytes, [&splits, rank = rank](int32_t a, int32_t b) { splits.emplace_back(a, b, rank); });
  m->pairs.reserve(splits.size());
  for (const auto& [a, b, rank] : splits) m->pairs.set(a, b, static_cast<uint32_t>(rank));
  m->finish_pairs();

  const int32_t n = static_cast<int32_t>(tokens.size());
  std::string pattern = pattern_in;
  if (pattern.empty()) {
    if (n == 50256) pattern = "gpt2";
    if (n == 100256) pattern = "cl100k";
    if (n == 128000) pattern = "llama3";
    if (pattern.empty())
      throw InputError(path, "",
                       "a pre-tokenization pattern for this tiktoken file (\"gpt2\", \"llama3\", "
                       "\"cl100k\" or a regex; strata data prepare --pattern): its " +
                           std::to_string(n) + " ranks match no known encoding");
  }
  std::map<std::string, int32_t> specials;
  std::string regex;
  if (pattern == "gpt2" || pattern == "r50k" || pattern == "p50k") {
    regex = kGpt2Pattern;
    specials["<|endoftext|>"] = n;
  } else if (pattern == "llama3") {
    regex = kLlama3Pattern;
    const char* named[] = {
        "<|begin_of_text|>",   "<|end_of_text|>",   nullptr, nullptr,     nullptr, nullptr,
        "<|start_header_id|>", "<|end_header_id|>", nullptr, "<|eot_id|>"};
    int reserved = 0;
    for (int i = 0; i < 256; ++i) {
      const char* s = i < 10 ? named[i] : nullptr;
      specials[s != nullptr ? std::string(s)
                            : "<|reserved_special_token_" + std::to_string(reserved++) + "|>"] =
          n + i;
    }
  } else if (pattern == "cl100k") {
    regex = kLlama3Pattern;
    specials = {{"<|endoftext|>", n + 1},
                {"<|fim_prefix|>", n + 2},
                {"<|fim_middle|>", n + 3},
                {"<|fim_suffix|>", n + 4},
                {"<|endofprompt|>", n + 20}};
  } else {
    regex = pattern;
    specials["<|endoftext|>"] = n;
  }
  if (explicit_specials != nullptr) specials = *explicit_specials;
  PreStep step;
  step.regex = std::make_unique<Regex>(regex, path, "pattern");
  m->tiktoken_regex = regex;
  m->steps.push_back(std::move(step));
  SpecialMatcher sm;
  for (const auto& [text, id] : specials) {
    if (text.empty() || id < 0)
      throw InputError(path, "special token " + in_quotes(text), "a non-empty text and id >= 0");
    if (m->holds_other(id, text))
      throw InputError(path, "special token " + in_quotes(text),
                       "an id no rank of the file holds: " + std::to_string(id) +
                           " is a rank of the file (its ranks are not 0.." + std::to_string(n - 1) +
                           " without a gap)");
    Special s;
    s.text = text;
    s.id = id;
    sm.add(text, static_cast<int>(m->specials.size()));
    m->set_token(id, text);
    m->specials.push_back(std::move(s));
  }
  if (!sm.empty()) m->special_passes.push_back(std::move(sm));
  return m;
}

}  // namespace strata::tokenizer_internal
