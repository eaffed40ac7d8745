// tokenizer_model.h — the tokenizer's one model (tokenizer.h), which both loaders fill and the
// encoder runs: every token is its bytes; the vocabulary (bytes -> id), id -> bytes for decode,
// a pair table (left id, right id) -> rank with the merged id found from the rank, and a dense
// byte-pair copy of its first level; the pre-tokenization steps and the special tokens. Internal to
// the tokenizer's files: tokenizer.cc (BPE, pre-tokenization, the public API), tokenizer_hf.cc
// (Hugging Face tokenizer.json), tokenizer_tiktoken.cc (tiktoken ranks files).
//
// For a tokenizer.json the pair table is the merges list (rank = its index). For tiktoken it is
// every split of every token into two tokens (rank = the merged token's rank), which is exactly
// tiktoken's rule "merge the adjacent pair whose concatenation has the lowest rank".
//
// Thread-safety: a loaded Model is immutable; its const methods may run on any threads at once
// (each thread keeps its own pre-token cache: tokenizer.cc). Loading is single-threaded.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/base/error.h"

namespace strata::tokenizer_internal {

constexpr uint32_t kNoRank = 0xFFFFFFFFu;

// Token ids (and tiktoken ranks) stay below 2^22: the id -> bytes table is as long as the
// largest id, and the largest vocabularies in use hold ~262k tokens (a file claiming id 2^30
// made a 32 GB table).
constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;
inline const std::string kIdExpected =
    "a non-negative integer id up to " + std::to_string(kMaxTokenId);

inline uint64_t hash_bytes(std::string_view s) {
  // FNV-1a over 8-byte words, then a final mix: fast for the short keys of pre-tokens. The
  // tail is read with fixed-size (overlapping) loads, never a byte loop or a memcpy call.
  const char* p = s.data();
  const size_t n = s.size();
  uint64_t h = 0xcbf29ce484222325ull ^ n;
  uint64_t w = 0;
  if (n >= 8) {
    size_t i = 0;
    for (; i + 8 < n; i += 8) {
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 0x100000001b3ull;
      h ^= h >> 29;
    }
    std::memcpy(&w, p + n - 8, 8);  // the last 8 bytes, overlapping the previous word
  } else if (n >= 4) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + n - 4, 4);
    w = lo | (static_cast<uint64_t>(hi) << 32);
  } else if (n > 0) {
    w = static_cast<unsigned char>(p[0]) |
        (static_cast<uint64_t>(static_cast<unsigned char>(p[n / 2])) << 8) |
        (static_cast<uint64_t>(static_cast<unsigned char>(p[n - 1])) << 16);
  }
  h = (h ^ w) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 32;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

// Bytes -> uint64 value, open addressing; keys are copied into one arena.
class BytesMap {
 public:
  size_t size() const { return count_; }
  size_t arena_bytes() const { return arena_.size(); }
  void clear() {
    slots_.clear();
    arena_.clear();
    count_ = 0;
  }
  const uint64_t* find(std::string_view key) const { return find(key, hash_bytes(key)); }
  // With the key's hash_bytes() already at hand.
  const uint64_t* find(std::string_view key, uint64_t h) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return nullptr;
      if (s.hash == h && s.len == key.size() &&
          std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0)
        return &s.value;
    }
  }
  // Inserts or overwrites.
  void set(std::string_view key, uint64_t value) {
    if ((count_ + 1) * 2 > slots_.size()) grow();
    const uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s = Slot{h, arena_.size(), static_cast<uint32_t>(key.size()), value};
        arena_.append(key.data(), key.size());
        ++count_;
        return;
      }
      if (s.hash == h && s.len == key.size() &&
          std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0) {
        s.value = value;
        return;
      }
    }
  }
  template <class F>
  void for_each(F f) const {
    for (const Slot& s : slots_)
      if (s.len != kEmpty) f(std::string_view(arena_.data() + s.off, s.len), s.value);
  }

 private:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  struct Slot {
    uint64_t hash = 0;
    size_t off = 0;
    uint32_t len = kEmpty;
    uint64_t value = 0;
  };
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(std::max<size_t>(64, old.size() * 2), Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].len != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t mask_ = 0;
  size_t count_ = 0;
};

// (left id, right id) -> the rank of their merge, open addressing (linear probing, at most half
// full). The merged id comes from the rank (Model::merged_id).
class PairMap {
 public:
  // Room for n pairs: the table is sized once, so set() never rehashes.
  void reserve(size_t n) {
    size_t cap = 64;
    int bits = 6;
    while (cap < 2 * n) cap *= 2, ++bits;
    table_.assign(cap, Entry{});
    mask_ = cap - 1;
    shift_ = 64 - bits;
    count_ = 0;
  }
  // Inserts or overwrites (Hugging Face: a repeated merge takes its last rank).
  void set(int32_t a, int32_t b, uint32_t rank) {
    if (2 * (count_ + 1) > table_.size()) grow();
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (table_[i].key == kEmptyKey) ++count_;
      if (table_[i].key == kEmptyKey || table_[i].key == k) {
        table_[i] = Entry{k, rank};
        return;
      }
    }
  }
  // kNoRank when the pair does not merge.
  uint32_t rank(int32_t a, int32_t b) const {
    if (table_.empty()) return kNoRank;
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      const Entry& e = table_[i];
      if (e.key == k) return e.rank;
      if (e.key == kEmptyKey) return kNoRank;
    }
  }
  size_t size() const { return count_; }

 private:
  static constexpr uint64_t kEmptyKey = ~0ull;
  struct Entry {
    uint64_t key = kEmptyKey;
    uint32_t rank = kNoRank;
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Fibonacci hashing: the top bits of the product, which every bit of the key reaches.
  size_t slot(uint64_t k) const {
    return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void grow() {
    std::vector<Entry> old = std::move(table_);
    reserve(std::max<size_t>(32, old.size()));
    for (const Entry& e : old)
      if (e.key != kEmptyKey)
        set(static_cast<int32_t>(e.key >> 32), static_cast<int32_t>(e.key & 0xFFFFFFFFu), e.rank);
  }
  std::vector<Entry> table_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t count_ = 0;
};

// ---- UTF-8 ----

// Length of the valid UTF-8 sequence at s[i], or the length of its maximal invalid subpart
// negated (-1 for a byte that starts nothing valid). Unicode Table 3-7.
inline int utf8_step(const unsigned char* s, size_t n, size_t i) {
  const unsigned c = s[i];
  if (c < 0x80) return 1;
  int len;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= n) return -k;
    const unsigned d = s[i + k];
    if (d < lo || d > hi) return -k;
    lo = 0x80;
    hi = 0xBF;
  }
  return len;
}

// `in` if it is valid UTF-8; otherwise a copy in `buf` with each maximal invalid subpart
// replaced by U+FFFD (Python's errors="replace").
std::string_view sanitize_utf8(std::string_view in, std::string& buf);

// Decodes the code point at s[i] of valid UTF-8; sets len.
inline uint32_t decode_cp(std::string_view s, size_t i, int* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) return *len = 1, p[0];
  if (p[0] < 0xE0) return *len = 2, ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  if (p[0] < 0xF0) return *len = 3, ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  *len = 4;
  return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

// Unicode White_Space (Rust's char::is_whitespace, used by added tokens' lstrip/rstrip).
inline bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// GPT-2's bytes_to_unicode: byte -> the code point that spells it in a byte-level vocabulary.
std::vector<uint32_t> byte_to_unicode();

// ---- regex ----

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
  ~MatchData() { pcre2_match_data_free(md); }
};

class Regex {
 public:
  // Throws InputError(file, where, ...) when the pattern does not compile.
  Regex(const std::string& pattern, const std::string& file, const std::string& where)
      : file_(file), where_(where) {
    const std::string& p = pattern;
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP,
                          &err, &off, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw InputError(file, where,
                       "a regular expression (PCRE2: " + std::string(reinterpret_cast<char*>(msg)) +
                           " at offset " + std::to_string(off) + ")");
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(start, end) for each match in s (valid UTF-8), left to right; an empty match
  // moves on by one character. A match PCRE2 gives up on (its match, depth or heap limit: a
  // pattern that backtracks without end on this text) is an InputError naming the pattern (its
  // file and key) and the byte: the rest of the text must not go unsplit.
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    thread_local MatchData data;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;
    while (pos <= s.size()) {
      int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), pos, 0, data.md, nullptr)
                    : PCRE2_ERROR_JIT_BADOPTION;
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION)
        rc = pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data.md,
                         nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw InputError(file_, where_,
                         "a pattern PCRE2 can apply to the text: it gave up at byte " +
                             std::to_string(pos) + " of a " + std::to_string(s.size()) +
                             "-byte text (" + reinterpret_cast<const char*>(msg) + ")");
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {
        if (b >= s.size()) return;
        int len = 1;
        decode_cp(s, b, &len);
        pos = b + len;
        continue;
      }
      f(b, e);
      pos = e;
    }
  }

 private:
  std::string file_, where_;  // where the pattern came from, for errors
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// Aho-Corasick is not needed: a trie walked from each candidate position finds the longest
// special token there; candidates are positions whose byte starts some token.
class SpecialMatcher {
 public:
  void add(const std::string& s, int index) {
    if (s.empty()) return;
    int node = 0;
    for (unsigned char c : s) {
      auto& kids = nodes_[node].kids;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(c, 0),
                                 [](auto a, auto b) { return a.first < b.first; });
      if (it != kids.end() && it->first == c) {
        node = it->second;
      } else {
        nodes_.emplace_back();
        const int child = static_cast<int>(nodes_.size()) - 1;
        nodes_[node].kids.insert(it, {c, child});
        node = child;
      }
    }
    nodes_[node].index = index;
    first_[static_cast<unsigned char>(s[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // The leftmost-longest match in s from `from`: (start, end, index), or start == npos.
  std::tuple<size_t, size_t, int> find(std::string_view s, size_t from) const {
    for (size_t i = from; i < s.size(); ++i) {
      if (!first_[static_cast<unsigned char>(s[i])]) continue;
      int node = 0, best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        const auto& kids = nodes_[node].kids;
        const unsigned char c = s[j];
        auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(c, 0),
                                   [](auto a, auto b) { return a.first < b.first; });
        if (it == kids.end() || it->first != c) break;
        node = it->second;
        if (nodes_[node].index >= 0) best = nodes_[node].index, best_end = j + 1;
      }
      if (best >= 0) return {i, best_end, best};
    }
    return {std::string_view::npos, 0, -1};
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> kids;  // sorted by byte
    int index = -1;
  };
  std::vector<Node> nodes_{1};
  bool first_[256] = {};
  bool empty_ = true;
};

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenization step, applied to each piece the previous steps produced.
struct PreStep {
  std::unique_ptr<Regex> regex;  // null: no split
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool add_prefix_space = false;  // ByteLevel's: prepend ' ' unless the piece starts with one
};

struct Special {
  std::string text;
  int32_t id = 0;
  bool lstrip = false, rstrip = false;
};

// "text" with its quotes, for error messages.
inline std::string in_quotes(const std::string& s) {
  return "\"" + s + "\"";
}

// A fresh identity for each Model (the per-thread pre-token cache knows whose entries it holds).
uint64_t next_model_uid();

struct Model {
  std::string path;
  uint64_t uid = next_model_uid();
  int32_t byte_id[256];
  PairMap pairs;                               // (left id, right id) -> rank
  std::vector<int32_t> rank_id;                // [rank] -> merged id; empty: the rank is the id
  std::vector<uint32_t> byte_pair_rank;        // [256 * byte + byte] -> rank of their tokens' merge
  std::vector<uint64_t> token_filter;          // bits by hash of every token's bytes (below)
  BytesMap vocab;                              // bytes -> id (regular tokens)
  std::vector<std::string> id_bytes;           // [id] -> bytes (special tokens: their text)
  std::vector<bool> id_known;                  // [id]
  bool whole_piece_first = false;              // tiktoken / ignore_merges
  std::string tiktoken_regex;                  // a tiktoken file's pattern; empty: tokenizer.json
  std::vector<PreStep> steps;                  // pre-tokenization pipeline
  std::vector<Special> specials;               // [index]
  std::vector<SpecialMatcher> special_passes;  // split out in this order

  int vocab_size() const { return static_cast<int>(id_bytes.size()); }
  void set_token(int32_t id, std::string bytes);
  // f(left id, right id) for every split of `bytes` into two tokens of the vocabulary: a
  // tiktoken file's merges (the loader's pair table, the tokenizer.json writer's merges).
  template <class F>
  void for_each_split(std::string_view bytes, F f) const {
    for (size_t k = 1; k < bytes.size(); ++k) {
      const uint64_t* a = vocab.find(bytes.substr(0, k));
      if (a == nullptr) continue;
      const uint64_t* b = vocab.find(bytes.substr(k));
      if (b != nullptr) f(static_cast<int32_t>(*a), static_cast<int32_t>(*b));
    }
  }
  // Whether `id` already spells other bytes (a special token given an id a token of the
  // vocabulary holds: both would encode to it, and decoding could give only one).
  bool holds_other(int32_t id, const std::string& bytes) const {
    return id >= 0 && id < static_cast<int32_t>(id_known.size()) && id_known[id] &&
           id_bytes[id] != bytes;
  }
  int32_t merged_id(uint32_t rank) const {
    return rank_id.empty() ? static_cast<int32_t>(rank) : rank_id[rank];
  }

  // ---- encoding (tokenizer.cc) ----

  // The ids of one pre-token: the lowest-rank adjacent pair merged, the leftmost among equals,
  // until no pair merges; cached per thread.
  void encode_piece(std::string_view w, std::vector<int32_t>& out) const;
  // Pre-tokenizes `text` through `steps` and encodes each piece.
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  // Splits out the special tokens of passes [pass, end) and encodes the rest.
  void encode_with_specials(std::string_view text, size_t pass, std::vector<int32_t>& out) const;

  // ---- loading (tokenizer.cc, for both loaders) ----

  // The byte-level spelling of a token -> its bytes; false if a character is not one.
  bool unbyte(std::string_view s, std::string& out) const;
  // byte_id from the vocabulary; InputError(path, where) when a byte has no token.
  void finish_byte_ids(const std::string& where);
  // Once the pairs are in: byte_pair_rank, and token_filter when whole_piece_first.
  void finish_pairs();

 private:
  // Merges the pre-token w (not cached) into out: an array scan up to 64 bytes, a heap over a
  // linked list beyond (tokenizer.cc).
  void merge_scan(std::string_view w, std::vector<int32_t>& out) const;
  void merge_heap(std::string_view w, std::vector<int32_t>& out) const;
  // Whether w may be a token of the vocabulary (false: it is not); h = hash_bytes(w).
  bool maybe_token(uint64_t h) const {
    const uint64_t bit = h >> (64 - kTokenFilterBits);
    return (token_filter[bit >> 6] >> (bit & 63)) & 1u;
  }
  static constexpr int kTokenFilterBits = 21;  // 256 KiB: ~2% false positives at 50k tokens
  template <class F>
  void pretokenize(size_t step, std::string_view piece, F& emit) const;
};

// The loaders. InputError naming the file and the JSON key or line.
// A Hugging Face tokenizer.json (tokenizer_hf.cc).
std::unique_ptr<Model> load_hf(const std::string& path);
// A tiktoken model as a Hugging Face tokenizer.json (Tokenizer::hf_tokenizer_json).
std::string hf_tokenizer_json(const Model& m);
// A tiktoken ranks file with a pattern ("gpt2", "llama3", "cl100k", a regex, or "" for the
// encoding the number of ranks names) and its special tokens, or `explicit_specials`
// (tokenizer_tiktoken.cc).
std::unique_ptr<Model> load_tiktoken_model(const std::string& path, const std::string& pattern,
                                           const std::map<std::string, int32_t>* explicit_specials);

}  // namespace strata::tokenizer_internal
