// tokenizer.cc — byte-level BPE of tokenizer.h.
//
// Internally every token is its bytes: a tokenizer.json's byte-level spellings ("Ġthe") are
// mapped back to bytes at load, so both file kinds end as the same Model:
//   bytes -> id (the vocabulary), id -> bytes (for decode), and a pair table
//   (left id, right id) -> (rank, merged id).
// For a tokenizer.json the pair table is the merges list (rank = its index). For tiktoken it is
// every split of every token into two tokens (rank = the merged token's rank), which is exactly
// tiktoken's rule "merge the adjacent pair whose concatenation has the lowest rank".
//
// Encoding a pre-token: the lowest-rank adjacent pair is merged, the leftmost among equals,
// until no pair merges (both references' loop). Short pre-tokens use a linear scan over an
// array; long ones a binary heap over a linked list (O(n log n)). Results are cached per
// thread (pre-token bytes -> ids).
#include "runtime/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <thread>
#include <utility>

#include "runtime/base/error.h"
#include "runtime/io/input_file.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace tokenizer_internal {
namespace {

constexpr uint32_t kNoRank = 0xFFFFFFFFu;

// Token ids (and tiktoken ranks) stay below 2^22: the id -> bytes table is as long as the
// largest id, and the largest vocabularies in use hold ~262k tokens (a file claiming id 2^30
// made a 32 GB table).
constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;
const std::string kIdExpected = "a non-negative integer id up to " + std::to_string(kMaxTokenId);

uint64_t hash_bytes(std::string_view s) {
  // FNV-1a over 8-byte words, then a final mix: fast for the short keys of pre-tokens.
  uint64_t h = 0xcbf29ce484222325ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
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
  const uint64_t* find(std::string_view key) const {
    if (slots_.empty()) return nullptr;
    const uint64_t h = hash_bytes(key);
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

// (left id, right id) -> (rank, merged id), open addressing.
class PairMap {
 public:
  struct Entry {
    uint64_t key = kEmptyKey;
    uint32_t rank = kNoRank;
    int32_t id = -1;
  };
  void reserve(size_t n) {
    size_t cap = 64;
    while (cap < 2 * n) cap *= 2;
    table_.assign(cap, Entry{});
    mask_ = cap - 1;
  }
  void set(int32_t a, int32_t b, uint32_t rank, int32_t id) {
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (table_[i].key == kEmptyKey || table_[i].key == k) {
        table_[i] = Entry{k, rank, id};
        return;
      }
    }
  }
  // kNoRank when the pair does not merge.
  const Entry& get(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      const Entry& e = table_[i];
      if (e.key == k || e.key == kEmptyKey) return e.key == k ? e : none_;
    }
  }

 private:
  static constexpr uint64_t kEmptyKey = ~0ull;
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t k) const { return ((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<Entry> table_;
  size_t mask_ = 0;
  Entry none_;
};

// ---- UTF-8 ----

// Length of the valid UTF-8 sequence at s[i], or the length of its maximal invalid subpart
// negated (-1 for a byte that starts nothing valid). Unicode Table 3-7.
int utf8_step(const unsigned char* s, size_t n, size_t i) {
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
std::string_view sanitize_utf8(std::string_view in, std::string& buf) {
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    const int k = utf8_step(s, n, i);
    if (k < 0) break;
    i += k;
  }
  if (i == n) return in;
  buf.assign(in.data(), i);
  while (i < n) {
    const int k = utf8_step(s, n, i);
    if (k > 0) {
      buf.append(in.data() + i, k);
      i += k;
    } else {
      buf.append("\xEF\xBF\xBD");
      i += -k;
    }
  }
  return buf;
}

// Decodes the code point at s[i] of valid UTF-8; sets len.
uint32_t decode_cp(std::string_view s, size_t i, int* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) return *len = 1, p[0];
  if (p[0] < 0xE0) return *len = 2, ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  if (p[0] < 0xF0) return *len = 3, ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  *len = 4;
  return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

// Unicode White_Space (Rust's char::is_whitespace, used by added tokens' lstrip/rstrip).
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// GPT-2's bytes_to_unicode: byte -> the code point that spells it in a byte-level vocabulary.
std::vector<uint32_t> byte_to_unicode() {
  std::vector<uint32_t> m(256, 0);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    m[b] = printable ? static_cast<uint32_t>(b) : next++;
  }
  return m;
}

// ---- regex ----

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string escape_regex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::strchr("\\^$.|?*+()[]{}", c) != nullptr && c != '\0') out += '\\';
    out += c;
  }
  return out;
}

struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
  ~MatchData() { pcre2_match_data_free(md); }
};

class Regex {
 public:
  // Throws InputError(file, where, ...) when the pattern does not compile.
  Regex(const std::string& pattern, const std::string& file, const std::string& where) {
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
  // moves on by one character.
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
      if (rc < 0) return;  // PCRE2_ERROR_NOMATCH (or a resource limit: the rest is a gap)
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

// The per-thread pre-token cache of the tokenizer a thread used last.
struct ThreadCache {
  uint64_t owner = 0;
  BytesMap map;  // pre-token -> (offset << 32 | count) into ids
  std::vector<int32_t> ids;
};
thread_local ThreadCache t_cache;
std::atomic<uint64_t> g_next_model_id{1};
constexpr size_t kCacheMaxEntries = 1 << 20;
constexpr size_t kHeapThreshold = 128;  // pre-tokens longer than this merge with a heap

}  // namespace

struct Model {
  std::string path;
  uint64_t uid = g_next_model_id.fetch_add(1);
  int32_t byte_id[256];
  PairMap pairs;
  BytesMap vocab;                              // bytes -> id (regular tokens)
  std::vector<std::string> id_bytes;           // [id] -> bytes (special tokens: their text)
  std::vector<bool> id_known;                  // [id]
  bool whole_piece_first = false;              // tiktoken / ignore_merges
  std::vector<PreStep> steps;                  // pre-tokenization pipeline
  std::vector<Special> specials;               // [index]
  std::vector<SpecialMatcher> special_passes;  // split out in this order
  std::vector<uint32_t> byte_unicode;          // byte-level spelling of each byte

  int vocab_size() const { return static_cast<int>(id_bytes.size()); }

  void set_token(int32_t id, std::string bytes) {
    if (id >= static_cast<int32_t>(id_bytes.size())) {
      id_bytes.resize(id + 1);
      id_known.resize(id + 1, false);
    }
    id_bytes[id] = std::move(bytes);
    id_known[id] = true;
  }

  // ---- BPE of one pre-token ----

  void bpe_small(std::string_view w, std::vector<int32_t>& out) const {
    const size_t n = w.size();
    int32_t ids[kHeapThreshold];
    uint32_t ranks[kHeapThreshold];
    int32_t merged[kHeapThreshold];
    for (size_t i = 0; i < n; ++i) ids[i] = byte_id[static_cast<unsigned char>(w[i])];
    auto lookup = [&](size_t i) {
      const PairMap::Entry& e = pairs.get(ids[i], ids[i + 1]);
      ranks[i] = e.rank;
      merged[i] = e.id;
    };
    size_t m = n;
    for (size_t i = 0; i + 1 < m; ++i) lookup(i);
    while (m > 1) {
      uint32_t best = kNoRank;
      size_t bi = 0;
      for (size_t i = 0; i + 1 < m; ++i) {
        if (ranks[i] < best) best = ranks[i], bi = i;
      }
      if (best == kNoRank) break;
      ids[bi] = merged[bi];
      const size_t tail = m - bi - 2;
      std::memmove(ids + bi + 1, ids + bi + 2, tail * sizeof(int32_t));
      std::memmove(ranks + bi + 1, ranks + bi + 2, (tail > 0 ? tail - 1 : 0) * sizeof(uint32_t));
      std::memmove(merged + bi + 1, merged + bi + 2, (tail > 0 ? tail - 1 : 0) * sizeof(int32_t));
      --m;
      if (bi > 0) lookup(bi - 1);
      if (bi + 1 < m) lookup(bi);
    }
    out.insert(out.end(), ids, ids + m);
  }

  void bpe_heap(std::string_view w, std::vector<int32_t>& out) const {
    const int n = static_cast<int>(w.size());
    std::vector<int32_t> id(n);
    std::vector<int> prev(n), next(n);
    for (int i = 0; i < n; ++i) {
      id[i] = byte_id[static_cast<unsigned char>(w[i])];
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
      uint32_t rank;
      int left, right;
      int32_t left_id, right_id, merged;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int l) {
      const int r = next[l];
      if (r < 0) return;
      const PairMap::Entry& e = pairs.get(id[l], id[r]);
      if (e.rank != kNoRank) heap.push(Cand{e.rank, l, r, id[l], id[r], e.id});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    // Node indices are byte offsets of each part's start, so (rank, left) orders as
    // (rank, position): the leftmost of equal ranks first.
    std::vector<bool> dead(n, false);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      if (dead[c.left] || next[c.left] != c.right || id[c.left] != c.left_id ||
          id[c.right] != c.right_id)
        continue;
      id[c.left] = c.merged;
      dead[c.right] = true;
      next[c.left] = next[c.right];
      if (next[c.right] >= 0) prev[next[c.right]] = c.left;
      if (prev[c.left] >= 0) push(prev[c.left]);
      push(c.left);
    }
    for (int i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
  }

  void encode_piece(std::string_view w, std::vector<int32_t>& out) const {
    if (w.size() == 1) {
      out.push_back(byte_id[static_cast<unsigned char>(w[0])]);
      return;
    }
    ThreadCache& c = t_cache;
    if (c.owner != uid || c.map.size() >= kCacheMaxEntries) {
      c.map.clear();
      c.ids.clear();
      c.owner = uid;
    }
    if (const uint64_t* v = c.map.find(w)) {
      const int32_t* p = c.ids.data() + (*v >> 32);
      out.insert(out.end(), p, p + (*v & 0xFFFFFFFFu));
      return;
    }
    const size_t start = out.size();
    const uint64_t* whole = whole_piece_first ? vocab.find(w) : nullptr;
    if (whole != nullptr) {
      out.push_back(static_cast<int32_t>(*whole));
    } else if (w.size() <= kHeapThreshold) {
      bpe_small(w, out);
    } else {
      bpe_heap(w, out);
    }
    const size_t count = out.size() - start;
    c.map.set(w, (static_cast<uint64_t>(c.ids.size()) << 32) | count);
    c.ids.insert(c.ids.end(), out.begin() + start, out.end());
  }

  // ---- pre-tokenization ----

  template <class F>
  void pretokenize(size_t step, std::string_view piece, F& emit) const {
    if (piece.empty()) return;
    if (step == steps.size()) {
      emit(piece);
      return;
    }
    const PreStep& st = steps[step];
    std::string prefixed;
    if (st.add_prefix_space && piece[0] != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed += ' ';
      prefixed.append(piece);
      piece = prefixed;
    }
    if (!st.regex) {
      pretokenize(step + 1, piece, emit);
      return;
    }
    // `from`: start of the text not yet emitted; `pending`: for MergedWithNext, the start of
    // a match waiting for its following gap; for Contiguous, the start of a run of matches.
    size_t from = 0;
    size_t run_start = std::string_view::npos, run_end = 0;
    st.regex->for_each_match(piece, [&](size_t b, size_t e) {
      switch (st.behavior) {
        case SplitBehavior::kIsolated:
          if (b > from) pretokenize(step + 1, piece.substr(from, b - from), emit);
          pretokenize(step + 1, piece.substr(b, e - b), emit);
          from = e;
          break;
        case SplitBehavior::kRemoved:
          if (b > from) pretokenize(step + 1, piece.substr(from, b - from), emit);
          from = e;
          break;
        case SplitBehavior::kMergedWithPrevious:
          pretokenize(step + 1, piece.substr(from, e - from), emit);
          from = e;
          break;
        case SplitBehavior::kMergedWithNext:
          // The gap before the match ends the previous piece, which started at a match.
          if (b > from) pretokenize(step + 1, piece.substr(from, b - from), emit);
          from = b;
          break;
        case SplitBehavior::kContiguous:
          if (run_start != std::string_view::npos && b == run_end) {
            run_end = e;
          } else {
            if (run_start != std::string_view::npos)
              pretokenize(step + 1, piece.substr(run_start, run_end - run_start), emit);
            if (b > from) pretokenize(step + 1, piece.substr(from, b - from), emit);
            run_start = b;
            run_end = e;
          }
          from = e;
          break;
      }
    });
    if (run_start != std::string_view::npos)
      pretokenize(step + 1, piece.substr(run_start, run_end - run_start), emit);
    if (from < piece.size()) pretokenize(step + 1, piece.substr(from), emit);
  }

  void encode_text(std::string_view text, std::vector<int32_t>& out) const {
    auto emit = [&](std::string_view piece) { encode_piece(piece, out); };
    pretokenize(0, text, emit);
  }

  // Splits out the special tokens of passes [pass, end) and encodes the rest.
  void encode_with_specials(std::string_view text, size_t pass, std::vector<int32_t>& out) const {
    if (pass == special_passes.size()) {
      encode_text(text, out);
      return;
    }
    const SpecialMatcher& sm = special_passes[pass];
    size_t from = 0;
    size_t at = 0;
    while (true) {
      auto [b, e, index] = sm.find(text, at);
      if (b == std::string_view::npos) break;
      const Special& sp = specials[index];
      if (sp.lstrip) {
        while (b > from) {
          // Step back over one whitespace character.
          size_t k = b - 1;
          while (k > from && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
          int len = 0;
          if (!is_white_space(decode_cp(text, k, &len))) break;
          b = k;
        }
      }
      if (sp.rstrip) {
        while (e < text.size()) {
          int len = 0;
          if (!is_white_space(decode_cp(text, e, &len))) break;
          e += len;
        }
      }
      if (b > from) encode_with_specials(text.substr(from, b - from), pass + 1, out);
      out.push_back(sp.id);
      from = at = e;
    }
    if (from < text.size()) encode_with_specials(text.substr(from), pass + 1, out);
  }

  // ---- loading ----

  // The byte-level spelling of a token -> its bytes; false if a character is not one.
  bool unbyte(std::string_view s, std::string& out) const {
    static const std::vector<int> inverse = [] {
      std::vector<int> inv(512, -1);
      const std::vector<uint32_t> m = byte_to_unicode();
      for (int b = 0; b < 256; ++b) inv[m[b]] = b;
      return inv;
    }();
    out.clear();
    for (size_t i = 0; i < s.size();) {
      const int k = utf8_step(reinterpret_cast<const unsigned char*>(s.data()), s.size(), i);
      if (k < 0) return false;
      int len = 0;
      const uint32_t c = decode_cp(s, i, &len);
      if (c >= inverse.size() || inverse[c] < 0) return false;
      out += static_cast<char>(inverse[c]);
      i += len;
    }
    return true;
  }

  void finish_byte_ids(const std::string& where) {
    for (int b = 0; b < 256; ++b) {
      const uint64_t* v = vocab.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
      if (v == nullptr) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        throw InputError(
            path, where,
            std::string("a token for every byte (byte-level BPE); byte ") + hex + " has none");
      }
      byte_id[b] = static_cast<int32_t>(*v);
    }
  }
};

namespace {

using nlohmann::json;

std::string in_quotes(const std::string& s) {
  return "\"" + s + "\"";
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
    m->pairs.set(static_cast<int32_t>(*ia), static_cast<int32_t>(*ib), static_cast<uint32_t>(i),
                 static_cast<int32_t>(*ic));
  }

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
    if (ok) bytes = b64decode(std::string_view(line).substr(0, sp), &ok);
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
  // Every split of a token into two tokens merges into it, at its rank.
  m->pairs.reserve(tokens.size() * 4);
  for (const auto& [bytes, rank] : tokens) {
    for (size_t k = 1; k < bytes.size(); ++k) {
      const uint64_t* a = m->vocab.find(std::string_view(bytes).substr(0, k));
      if (a == nullptr) continue;
      const uint64_t* b = m->vocab.find(std::string_view(bytes).substr(k));
      if (b == nullptr) continue;
      m->pairs.set(static_cast<int32_t>(*a), static_cast<int32_t>(*b), static_cast<uint32_t>(rank),
                   rank);
    }
  }

  const int32_t n = static_cast<int32_t>(tokens.size());
  std::string pattern = pattern_in;
  if (pattern.empty()) {
    if (n == 50256) pattern = "gpt2";
    if (n == 100256) pattern = "cl100k";
    if (n == 128000) pattern = "llama3";
    if (pattern.empty())
      throw InputError(path, "",
                       "a pre-tokenization pattern for this tiktoken file (\"gpt2\", \"llama3\", "
                       "\"cl100k\" or a regex): its " +
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
  m->steps.push_back(std::move(step));
  SpecialMatcher sm;
  for (const auto& [text, id] : specials) {
    if (text.empty() || id < 0)
      throw InputError(path, "special token " + in_quotes(text), "a non-empty text and id >= 0");
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

}  // namespace
}  // namespace tokenizer_internal

using tokenizer_internal::Model;

Tokenizer::Tokenizer(std::unique_ptr<Model> model) : m_(std::move(model)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path,
                                           const std::string& tiktoken_pattern) {
  check_input_file(path, kMaxTokenizerFileBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError(path, "", "a readable tokenizer file (tokenizer.json or tiktoken ranks)");
  char c = 0;
  while (in.get(c) && std::isspace(static_cast<unsigned char>(c))) {
  }
  const bool is_json =
      (in && c == '{') || (path.size() >= 5 && path.substr(path.size() - 5) == ".json");
  in.close();
  if (is_json) return std::unique_ptr<Tokenizer>(new Tokenizer(tokenizer_internal::load_hf(path)));
  return std::unique_ptr<Tokenizer>(
      new Tokenizer(tokenizer_internal::load_tiktoken_model(path, tiktoken_pattern, nullptr)));
}

std::unique_ptr<Tokenizer> Tokenizer::load_tiktoken(
    const std::string& path, const std::string& pattern,
    const std::map<std::string, int32_t>& specials) {
  return std::unique_ptr<Tokenizer>(
      new Tokenizer(tokenizer_internal::load_tiktoken_model(path, pattern, &specials)));
}

int Tokenizer::vocab_size() const {
  return m_->vocab_size();
}

const std::string& Tokenizer::path() const {
  return m_->path;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::string buf;
  const std::string_view t = tokenizer_internal::sanitize_utf8(text, buf);
  std::vector<int32_t> out;
  out.reserve(t.size() / 3 + 16);
  m_->encode_with_specials(t, 0, out);
  return out;
}

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  std::string buf;
  const std::string_view t = tokenizer_internal::sanitize_utf8(text, buf);
  std::vector<int32_t> out;
  out.reserve(t.size() / 3 + 16);
  m_->encode_text(t, out);
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& docs,
                                                          int threads) const {
  std::vector<std::vector<int32_t>> out(docs.size());
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(docs.size())));
  if (n <= 1) {
    for (size_t i = 0; i < docs.size(); ++i) out[i] = encode(docs[i]);
    return out;
  }
  // Documents are handed out one at a time, so uneven lengths balance across the threads.
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < docs.size();) out[i] = encode(docs[i]);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= m_->vocab_size() || !m_->id_known[id])
      throw InputError("<token ids>", "index " + std::to_string(i),
                       "a token id of " + m_->path + " (got " + std::to_string(id) + ")");
    out += m_->id_bytes[id];
  }
  return out;
}

std::optional<int32_t> Tokenizer::token_id(const std::string& token) const {
  for (const auto& s : m_->specials)
    if (s.text == token) return s.id;
  if (const uint64_t* v = m_->vocab.find(token)) return static_cast<int32_t>(*v);
  std::string bytes;
  if (m_->unbyte(token, bytes)) {
    if (const uint64_t* v = m_->vocab.find(bytes)) return static_cast<int32_t>(*v);
  }
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::eod_id() const {
  for (const char* t : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
    if (auto id = token_id(t)) return id;
  return std::nullopt;
}

bool parse_token_ids(const std::string& text, std::vector<int32_t>* ids) {
  ids->clear();
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string n = text.substr(at, comma - at);
    if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos)
      return false;
    ids->push_back(std::stoi(n));
    at = comma + 1;
  }
  return true;
}

}  // namespace strata
