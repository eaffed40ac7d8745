// tokenizer.cc — byte-level BPE of tokenizer.h: the encoder (pre-tokenization, special tokens,
// the merges), the parts of loading both loaders share, and the public API. The loaders are
// tokenizer_hf.cc and tokenizer_tiktoken.cc; the model they fill is tokenizer_model.h.
//
// Internally every token is its bytes: a tokenizer.json's byte-level spellings ("Ġthe") are
// mapped back to bytes at load, so both file kinds end as the same Model.
//
// Encoding a pre-token: the lowest-rank adjacent pair is merged, the leftmost among equals,
// until no pair merges (both references' loop). Pre-tokens up to 64 bytes merge by scanning an
// array on the stack (what tiktoken does, without its allocations); longer ones with a binary
// heap over a linked list, O(n log n), in per-thread buffers. The first merges look up byte
// pairs in a dense 256 x 256 table; later ones the flat pair hash (PairMap). Nothing allocates
// per pre-token. Results are cached per thread in a fixed two-way set-associative table of
// 64-byte lines (pre-token bytes -> ids), whose misses cost one memory access.
#include "runtime/data/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "runtime/base/error.h"
#include "runtime/data/tokenizer_model.h"
#include "runtime/io/input_file.h"

namespace strata {
namespace tokenizer_internal {
namespace {

// A pre-token's ids as the thread last computed them: one 64-byte line in a two-way set chosen
// by the pre-token's hash, so a look-up reads two adjacent lines and the cache never allocates,
// rehashes or clears as it fills (a new pre-token evicts its set's least recently used line).
// Pre-tokens longer than kCacheBytes or of more than kCacheIds ids are not kept.
constexpr size_t kCacheBytes = 26;
constexpr size_t kCacheIds = 8;
struct alignas(64) CacheLine {
  uint32_t check;  // the hash's top 32 bits
  uint8_t len;     // bytes of the pre-token; 0: an empty line
  uint8_t count;   // its ids
  char bytes[kCacheBytes];
  int32_t ids[kCacheIds];
};
static_assert(sizeof(CacheLine) == 64, "one cache line");
// 512 KiB per thread (8,192 pre-tokens): on real text (a Zipf law of words) it keeps the
// pre-tokens that recur, and with the byte-pair table and the token filter (256 KiB each) it
// fits a core's L2, so on text whose words do not repeat a miss stays cheap. Measured on GPT-2's
// ranks against 2 MiB: unique words ~1.2x faster, 20 MB of real text the same, tinyshakespeare
// (25k distinct words) ~0.9x.
constexpr size_t kCacheSets = size_t{1} << 12;
constexpr size_t kCacheLines = 2 * kCacheSets;

// a[0, n) == b[0, n) for n <= 26 (a pre-token in the cache), by overlapping word loads.
inline bool equal_short(const char* a, const char* b, size_t n) {
  uint64_t x, y;
  if (n >= 8) {
    for (size_t i = 0; i + 8 < n; i += 8) {
      std::memcpy(&x, a + i, 8);
      std::memcpy(&y, b + i, 8);
      if (x != y) return false;
    }
    std::memcpy(&x, a + n - 8, 8);
    std::memcpy(&y, b + n - 8, 8);
    return x == y;
  }
  if (n >= 4) {
    uint32_t p, q, r, t;
    std::memcpy(&p, a, 4);
    std::memcpy(&q, b, 4);
    std::memcpy(&r, a + n - 4, 4);
    std::memcpy(&t, b + n - 4, 4);
    return p == q && r == t;
  }
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

// The per-thread cache of the tokenizer a thread used last.
struct PieceCache {
  uint64_t owner = 0;
  std::unique_ptr<CacheLine[]> lines;  // [kCacheLines]
  void reset(uint64_t uid) {
    if (!lines)
      lines = std::make_unique<CacheLine[]>(kCacheLines);  // zeroed: empty
    else
      std::fill_n(lines.get(), kCacheLines, CacheLine{});
    owner = uid;
  }
};
thread_local PieceCache t_cache;

// The heap merge's buffers, kept per thread so that no pre-token allocates.
struct HeapCandidate {
  uint32_t rank;
  int left, right;  // node indices (byte offsets): (rank, left) orders leftmost first
  int32_t left_id, right_id;
  bool operator>(const HeapCandidate& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};
struct HeapScratch {
  std::vector<int32_t> id;  // [node] -> token id; -1: merged into its left neighbour
  std::vector<int> prev, next;
  std::vector<HeapCandidate> heap;
};
thread_local HeapScratch t_heap;

std::atomic<uint64_t> g_next_model_id{1};
constexpr size_t kScanMax = 64;  // pre-tokens longer than this merge with a heap

}  // namespace

uint64_t next_model_uid() {
  return g_next_model_id.fetch_add(1);
}

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

std::vector<uint32_t> byte_to_unicode() {
  std::vector<uint32_t> m(256, 0);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    m[b] = printable ? static_cast<uint32_t>(b) : next++;
  }
  return m;
}

void Model::set_token(int32_t id, std::string bytes) {
  if (id >= static_cast<int32_t>(id_bytes.size())) {
    id_bytes.resize(id + 1);
    id_known.resize(id + 1, false);
  }
  id_bytes[id] = std::move(bytes);
  id_known[id] = true;
}

// ---- BPE of one pre-token ----

void Model::merge_scan(std::string_view w, std::vector<int32_t>& out) const {
  const size_t n = w.size();
  const auto* s = reinterpret_cast<const unsigned char*>(w.data());
  int32_t ids[kScanMax];     // [part]
  uint32_t ranks[kScanMax];  // [part]: rank of merging part and part + 1
  for (size_t i = 0; i < n; ++i) ids[i] = byte_id[s[i]];
  for (size_t i = 0; i + 1 < n; ++i) ranks[i] = byte_pair_rank[s[i] * 256u + s[i + 1]];
  size_t m = n;  // parts
  while (m > 1) {
    uint32_t best = ranks[0];
    size_t bi = 0;
    for (size_t i = 1; i + 1 < m; ++i) {
      if (ranks[i] < best) best = ranks[i], bi = i;
    }
    if (best == kNoRank) break;
    ids[bi] = merged_id(best);
    for (size_t i = bi + 1; i + 1 < m; ++i) ids[i] = ids[i + 1];
    for (size_t i = bi + 1; i + 2 < m; ++i) ranks[i] = ranks[i + 1];
    --m;
    if (bi > 0) ranks[bi - 1] = pairs.rank(ids[bi - 1], ids[bi]);
    if (bi + 1 < m) ranks[bi] = pairs.rank(ids[bi], ids[bi + 1]);
  }
  out.insert(out.end(), ids, ids + m);
}

void Model::merge_heap(std::string_view w, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(w.size());
  const auto* s = reinterpret_cast<const unsigned char*>(w.data());
  HeapScratch& t = t_heap;
  t.id.resize(n);
  t.prev.resize(n);
  t.next.resize(n);
  t.heap.clear();
  int32_t* id = t.id.data();
  int* prev = t.prev.data();
  int* next = t.next.data();
  for (int i = 0; i < n; ++i) {
    id[i] = byte_id[s[i]];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  const std::greater<HeapCandidate> after;
  auto push = [&](int l, uint32_t rank) {
    if (rank == kNoRank) return;
    t.heap.push_back(HeapCandidate{rank, l, next[l], id[l], id[next[l]]});
    std::push_heap(t.heap.begin(), t.heap.end(), after);
  };
  for (int i = 0; i + 1 < n; ++i) push(i, byte_pair_rank[s[i] * 256u + s[i + 1]]);
  while (!t.heap.empty()) {
    std::pop_heap(t.heap.begin(), t.heap.end(), after);
    const HeapCandidate c = t.heap.back();
    t.heap.pop_back();
    // Stale: either part has changed (merged, or merged away: id -1) since it was pushed.
    if (id[c.left] != c.left_id || id[c.right] != c.right_id || next[c.left] != c.right) continue;
    id[c.left] = merged_id(c.rank);
    id[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.left] >= 0) prev[next[c.left]] = c.left;
    if (prev[c.left] >= 0) push(prev[c.left], pairs.rank(id[prev[c.left]], id[c.left]));
    if (next[c.left] >= 0) push(c.left, pairs.rank(id[c.left], id[next[c.left]]));
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

void Model::encode_piece(std::string_view w, std::vector<int32_t>& out) const {
  const size_t n = w.size();
  if (n == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(w[0])]);
    return;
  }
  const uint64_t h = hash_bytes(w);
  const uint32_t check = static_cast<uint32_t>(h >> 32);
  CacheLine* set = nullptr;
  if (n <= kCacheBytes) {
    PieceCache& c = t_cache;
    if (c.owner != uid) c.reset(uid);
    set = &c.lines[2 * (h & (kCacheSets - 1))];
    for (int way = 0; way < 2; ++way) {
      const CacheLine& l = set[way];
      if (l.len == n && l.check == check && equal_short(l.bytes, w.data(), n)) {
        out.insert(out.end(), l.ids, l.ids + l.count);
        if (way == 1) std::swap(set[0], set[1]);  // most recently used first
        return;
      }
    }
  }
  const size_t start = out.size();
  const uint64_t* whole = whole_piece_first && maybe_token(h) ? vocab.find(w, h) : nullptr;
  if (whole != nullptr) {
    out.push_back(static_cast<int32_t>(*whole));
  } else if (n <= kScanMax) {
    merge_scan(w, out);
  } else {
    merge_heap(w, out);
  }
  const size_t count = out.size() - start;
  if (set != nullptr && count <= kCacheIds) {
    set[1] = set[0];  // the least recently used goes
    CacheLine& l = set[0];
    l.check = check;
    l.len = static_cast<uint8_t>(n);
    l.count = static_cast<uint8_t>(count);
    std::memcpy(l.bytes, w.data(), n);
    std::copy(out.begin() + start, out.end(), l.ids);
  }
}

// ---- pre-tokenization ----

template <class F>
void Model::pretokenize(size_t step, std::string_view piece, F& emit) const {
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

void Model::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  auto emit = [&](std::string_view piece) { encode_piece(piece, out); };
  pretokenize(0, text, emit);
}

void Model::encode_with_specials(std::string_view text, size_t pass,
                                 std::vector<int32_t>& out) const {
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

bool Model::unbyte(std::string_view s, std::string& out) const {
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

void Model::finish_byte_ids(const std::string& where) {
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

void Model::finish_pairs() {
  byte_pair_rank.assign(256 * 256, kNoRank);
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256; ++b) byte_pair_rank[a * 256 + b] = pairs.rank(byte_id[a], byte_id[b]);
  token_filter.clear();
  if (whole_piece_first) {
    token_filter.assign((size_t{1} << kTokenFilterBits) / 64, 0);
    vocab.for_each([&](std::string_view bytes, uint64_t) {
      const uint64_t bit = hash_bytes(bytes) >> (64 - kTokenFilterBits);
      token_filter[bit >> 6] |= uint64_t{1} << (bit & 63);
    });
  }
}

}  // namespace tokenizer_internal

using tokenizer_internal::Model;

bool is_tokenizer_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError(path, "", "a readable tokenizer file (tokenizer.json or tiktoken ranks)");
  char c = 0;
  while (in.get(c) && std::isspace(static_cast<unsigned char>(c))) {
  }
  return (in && c == '{') || (path.size() >= 5 && path.substr(path.size() - 5) == ".json");
}

Tokenizer::Tokenizer(std::unique_ptr<Model> model) : m_(std::move(model)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(
    const std::string& path, const std::string& tiktoken_pattern,
    const std::map<std::string, int32_t>* tiktoken_specials) {
  check_input_file(path, kMaxTokenizerFileBytes);
  if (is_tokenizer_json(path))
    return std::unique_ptr<Tokenizer>(new Tokenizer(tokenizer_internal::load_hf(path)));
  return std::unique_ptr<Tokenizer>(new Tokenizer(
      tokenizer_internal::load_tiktoken_model(path, tiktoken_pattern, tiktoken_specials)));
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

const std::string& Tokenizer::tiktoken_regex() const {
  return m_->tiktoken_regex;
}

std::string Tokenizer::hf_tokenizer_json() const {
  return tokenizer_internal::hf_tokenizer_json(*m_);
}

std::map<std::string, int32_t> Tokenizer::special_tokens() const {
  std::map<std::string, int32_t> out;
  for (const auto& s : m_->specials) out[s.text] = s.id;
  return out;
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
                                                          int threads, size_t* failed) const {
  return batch(docs, threads, failed, true);
}

std::vector<std::vector<int32_t>> Tokenizer::encode_ordinary_batch(
    const std::vector<std::string>& docs, int threads, size_t* failed) const {
  return batch(docs, threads, failed, false);
}

std::vector<std::vector<int32_t>> Tokenizer::batch(const std::vector<std::string>& docs,
                                                   int threads, size_t* failed,
                                                   bool special) const {
  auto encode_one = [this, special](const std::string& doc) {
    return special ? encode(doc) : encode_ordinary(doc);
  };
  std::vector<std::vector<int32_t>> out(docs.size());
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(docs.size())));
  if (n <= 1) {
    for (size_t i = 0; i < docs.size(); ++i) {
      try {
        out[i] = encode_one(docs[i]);
      } catch (...) {
        if (failed) *failed = i;
        throw;
      }
    }
    return out;
  }
  // Documents are handed out one at a time, so uneven lengths balance across the threads. A
  // thread's error (a document the tokenizer refuses) stops the others and is rethrown here; a
  // thread the system will not start (too many asked for, a memory limit) leaves the work to
  // those that did.
  std::atomic<size_t> next{0};
  std::mutex failed_mutex;
  std::exception_ptr error;
  size_t failed_at = docs.size();
  auto work = [&] {
    size_t i = 0;
    try {
      while ((i = next.fetch_add(1)) < docs.size()) out[i] = encode_one(docs[i]);
    } catch (...) {
      next = docs.size();
      const std::lock_guard<std::mutex> lock(failed_mutex);
      if (!error || i < failed_at) {  // the first document that failed, whichever thread
        error = std::current_exception();
        failed_at = i;
      }
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int t = 1; t < n; ++t) pool.emplace_back(work);
  } catch (const std::system_error&) {
    // Fewer threads than asked: the ones started, and this one, do it all.
  }
  work();
  for (auto& th : pool) th.join();
  if (error) {
    if (failed) *failed = failed_at;
    std::rethrow_exception(error);
  }
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

int64_t count_invalid_utf8(std::string_view text, size_t* first) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  int64_t count = 0;
  for (size_t i = 0; i < n;) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    const int k = tokenizer_internal::utf8_step(s, n, i);
    if (k < 0) {
      if (count++ == 0 && first != nullptr) *first = i;
      i += static_cast<size_t>(-k);
    } else {
      i += static_cast<size_t>(k);
    }
  }
  return count;
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
