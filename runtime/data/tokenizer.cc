// tokenizer.cc — byte-level BPE of tokenizer.h: the encoder (pre-tokenization, special tokens,
// the merges), the parts of loading both loaders share, and the public API. The loaders are
// tokenizer_hf.cc and tokenizer_tiktoken.cc; the model they fill is tokenizer_model.h.
//
// Internally every token is its bytes: a tokenizer.json's byte-level spellings ("Ġthe") are
// mapped back to bytes at load, so both file kinds end as the same Model.
//
// Encoding a pre-token: the lowest-rank adjacent pair is merged, the leftmost among equals,
// until no pair merges (both references' loop). Short pre-tokens use a linear scan over an
// array; long ones a binary heap over a linked list (O(n log n)). Results are cached per
// thread (pre-token bytes -> ids).
#include "runtime/data/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <mutex>
#include <queue>
#include <system_error>
#include <thread>
#include <utility>

#include "runtime/base/error.h"
#include "runtime/data/tokenizer_model.h"
#include "runtime/io/input_file.h"

namespace strata {
namespace tokenizer_internal {
namespace {

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

void Model::bpe_small(std::string_view w, std::vector<int32_t>& out) const {
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

void Model::bpe_heap(std::string_view w, std::vector<int32_t>& out) const {
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

void Model::encode_piece(std::string_view w, std::vector<int32_t>& out) const {
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
                                                          int threads, size_t* failed) const {
  std::vector<std::vector<int32_t>> out(docs.size());
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(docs.size())));
  if (n <= 1) {
    for (size_t i = 0; i < docs.size(); ++i) {
      try {
        out[i] = encode(docs[i]);
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
      while ((i = next.fetch_add(1)) < docs.size()) out[i] = encode(docs[i]);
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
