// data.cc — the synthetic, text and tokens data sources of data.h.
//
// Every random decision (the chain's table, a sequence's start, each generated token, a
// window's offset) is a word of a counter-based stream (splitmix64) keyed by what it depends
// on, never the state of a sequential generator: that is what makes sequence g of batch iter
// the same on every rank and in every parallel layout.
#include "runtime/data/data_source.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/base/error.h"
#include "runtime/data/corpus_source.h"
#include "runtime/data/data_internal.h"
#include "runtime/data/masked_lm_source.h"
#include "runtime/data/tokenizer.h"
#include "runtime/io/input_file.h"

namespace strata {
namespace data_internal {

uint64_t sequence_key(uint64_t seed, Split split, uint64_t iter, uint64_t g) {
  // Chained rather than summed, so no two (split, iter, g) triples can collide by arithmetic.
  uint64_t h = mix64(seed);
  h = mix64(h ^ static_cast<uint64_t>(split));
  h = mix64(h ^ iter);
  return mix64(h ^ g);
}

uint64_t stream_word(uint64_t key, uint64_t i) {
  return mix64(key + i * 0x9E3779B97F4A7C15ull);
}

double unit_double(uint64_t w) {
  return static_cast<double>(w >> 11) * 0x1.0p-53;
}

namespace {

// Entropy in nats of a distribution given as probabilities (zeros contribute nothing).
double entropy(const double* p, int64_t n) {
  double h = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] > 0) h -= p[i] * std::log(p[i]);
  }
  return h;
}

int64_t ipow(int64_t base, int exp) {
  int64_t r = 1;
  for (int i = 0; i < exp; ++i) r *= base;
  return r;
}

}  // namespace

MarkovAnalysis analyze_markov(const std::vector<double>& transitions, int vocab, int order,
                              int max_iterations) {
  const int64_t V = vocab;
  const int64_t contexts = ipow(V, order);
  const int64_t top = contexts / V;  // V^(k-1): contexts sharing the same newest k-1 tokens
  if (vocab < 1 || order < 1 || static_cast<int64_t>(transitions.size()) != contexts * V) {
    throw std::invalid_argument("analyze_markov: transitions must be (vocab^order, vocab)");
  }

  MarkovAnalysis a;
  std::vector<double> pi(contexts, 1.0 / static_cast<double>(contexts));
  std::vector<double> next(contexts);
  bool settled = false;
  while (a.iterations < max_iterations) {
    ++a.iterations;
    // Pull form: context r*V + v is entered from the V contexts q*V^(k-1) + r by emitting v,
    // so each entry is one fixed-order sum (deterministic, no scattered writes).
    double total = 0;
    for (int64_t r = 0; r < top; ++r) {
      double* out = &next[r * V];
      std::fill(out, out + V, 0.0);
      for (int64_t q = 0; q < V; ++q) {
        const int64_t from = q * top + r;
        const double w = pi[from];
        const double* row = &transitions[from * V];
        for (int64_t v = 0; v < V; ++v) out[v] += w * row[v];
      }
      for (int64_t v = 0; v < V; ++v) total += out[v];
    }
    // Renormalise so rounding in the row sums cannot drift the mass away from 1.
    double change = 0;
    for (int64_t c = 0; c < contexts; ++c) {
      next[c] /= total;
      change += std::fabs(next[c] - pi[c]);
    }
    pi.swap(next);
    if (change < 1e-12) {
      settled = true;
      break;
    }
  }
  if (!settled) {
    throw std::runtime_error("Markov chain stationary distribution did not settle within " +
                             std::to_string(max_iterations) + " power-iteration steps");
  }

  for (int64_t c = 0; c < contexts; ++c) {
    a.entropy_rate += pi[c] * entropy(&transitions[c * V], V);
  }

  // H_j: entropy of the first j tokens of a stationary context (= of any j consecutive tokens),
  // obtained by summing pi over the k-j newest digits; contexts sharing a j-token prefix are
  // contiguous because the oldest token is the most significant digit.
  std::vector<double> prefix_entropy(order + 1, 0.0);  // [j], j in [0, k]
  for (int j = 1; j <= order; ++j) {
    const int64_t block = ipow(V, order - j);
    std::vector<double> marginal(contexts / block, 0.0);
    for (int64_t c = 0; c < contexts; ++c) marginal[c / block] += pi[c];
    prefix_entropy[j] = entropy(marginal.data(), static_cast<int64_t>(marginal.size()));
  }
  for (int i = 0; i + 1 < order; ++i) {
    a.short_context_entropy.push_back(prefix_entropy[i + 2] - prefix_entropy[i + 1]);
  }
  a.stationary = std::move(pi);
  return a;
}

double markov_entropy_rate(const std::vector<double>& transitions, int vocab, int order) {
  return analyze_markov(transitions, vocab, order).entropy_rate;
}

double markov_loss_floor(const MarkovAnalysis& a, int seq_len) {
  if (seq_len < 1) throw std::invalid_argument("markov_loss_floor: seq_len must be >= 1");
  // Positions 0 .. k-2 see a context shorter than the order; the rest see all they need.
  const int short_positions = std::min(seq_len, static_cast<int>(a.short_context_entropy.size()));
  double sum = 0;
  for (int i = 0; i < short_positions; ++i) sum += a.short_context_entropy[i];
  sum += static_cast<double>(seq_len - short_positions) * a.entropy_rate;
  return sum / seq_len;
}

std::vector<double> synthetic_transitions(int vocab, int order, uint64_t seed) {
  const int64_t V = vocab;
  const int64_t contexts = ipow(V, order);
  std::vector<double> t(static_cast<size_t>(contexts * V));
  const uint64_t table_key = mix64(mix64(seed) ^ 0x5354524154414d43ull);  // "STRATAMC"
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t c = 0; c < contexts; ++c) {
    const uint64_t key = mix64(table_key ^ static_cast<uint64_t>(c));
    double* row = &t[c * V];
    // Box-Muller, one normal per pair of words; 1 - u keeps the logarithm's argument in (0, 1].
    for (int64_t v = 0; v < V; ++v) {
      const double u1 = 1.0 - unit_double(stream_word(key, 2 * v));
      const double u2 = unit_double(stream_word(key, 2 * v + 1));
      row[v] = 2.5 * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
    }
    const double mx = *std::max_element(row, row + V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) {
      row[v] = std::exp(row[v] - mx);
      sum += row[v];
    }
    for (int64_t v = 0; v < V; ++v) row[v] /= sum;
  }
  return t;
}

size_t first_invalid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min_cp;
    if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1F, min_cp = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0F, min_cp = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07, min_cp = 0x10000;
    } else {
      return i;  // a continuation byte or 0xF8..0xFF where a sequence must start
    }
    if (n - i < len) return i;
    for (size_t j = 1; j < len; ++j) {
      if ((s[i + j] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return n;
}

}  // namespace data_internal

namespace {

using data_internal::MarkovAnalysis;
using data_internal::sequence_key;
using data_internal::stream_word;
using data_internal::unit_double;

// Limits of the synthetic chain. Contexts bound the stationary distribution; transitions bound
// the dense table (8 bytes each: 2^24 is 128 MiB per process) and the cost of one
// power-iteration step.
constexpr int64_t kMaxContexts = int64_t{1} << 22;
constexpr int64_t kMaxTransitions = int64_t{1} << 24;

std::string byte_at(uint64_t offset) {
  return "byte " + std::to_string(offset);
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

void check_sample_args(int64_t first, int count, int seq_len) {
  if (first < 0 || count < 0 || seq_len < 1) {
    throw std::invalid_argument("DataSource::sample: need first >= 0, count >= 0, seq_len >= 1");
  }
}

// Index of the entry of a cumulative table cdf[0..n) into which u in [0, 1) falls.
int64_t pick(const double* cdf, int64_t n, double u) {
  const double target = u * cdf[n - 1];
  const int64_t i = std::upper_bound(cdf, cdf + n, target) - cdf;
  return std::min(i, n - 1);
}

// The synthetic source's Markov chain (data_internal.h's layout): its table as cumulative rows,
// its stationary start distribution and its entropies; sequences drawn from a key.
class MarkovChain {
 public:
  MarkovChain(const SyntheticDataConfig& cfg, const std::string& config_file)
      : vocab_(cfg.vocab_size), order_(cfg.order) {
    contexts_ = 1;
    for (int i = 0; i < order_; ++i) contexts_ *= vocab_;
    top_ = contexts_ / vocab_;
    cdf_ = data_internal::synthetic_transitions(vocab_, order_, cfg.seed);
    // Chains over tens of tokens settle within ~1000 steps (vocab 64, order 2: 38 for seed 7,
    // at most 987 over 300 seeds); two to four tokens can need ~50000, but their steps are
    // tiny. The cap bounds the start-up time of a pathological chain to about 2^34
    // multiply-adds before it is refused.
    const int max_steps = static_cast<int>(
        std::clamp<int64_t>((int64_t{1} << 34) / (contexts_ * vocab_), 1000, 1000000));
    try {
      analysis_ = data_internal::analyze_markov(cdf_, vocab_, order_, max_steps);
    } catch (const std::runtime_error& e) {
      throw InputError(config_file, "data.synthetic.seed",
                       "a chain that mixes: " + std::string(e.what()) + " (try another seed)");
    }
    // Rows become cumulative in place: sampling needs only the CDFs.
    for (int64_t c = 0; c < contexts_; ++c) {
      double* row = &cdf_[c * vocab_];
      for (int v = 1; v < vocab_; ++v) row[v] += row[v - 1];
    }
    start_cdf_ = std::move(analysis_.stationary);
    analysis_.stationary.clear();
    for (int64_t c = 1; c < contexts_; ++c) start_cdf_[c] += start_cdf_[c - 1];
  }

  int vocab() const { return vocab_; }
  int order() const { return order_; }
  const MarkovAnalysis& analysis() const { return analysis_; }

  // x[0, n): a sequence started in the stationary distribution, every decision a word of the
  // stream of `key`: word 0 picks the starting context (its k tokens open the sequence), word
  // t - k + 1 picks token t for t >= k.
  void generate(uint64_t key, int n, int32_t* x) const {
    int64_t c = pick(start_cdf_.data(), contexts_, unit_double(stream_word(key, 0)));
    int64_t digit = top_;
    for (int j = 0; j < order_; ++j, digit /= vocab_) {
      if (j < n) x[j] = static_cast<int32_t>((c / digit) % vocab_);
    }
    for (int t = order_; t < n; ++t) {
      const double u = unit_double(stream_word(key, static_cast<uint64_t>(t - order_ + 1)));
      const int64_t v = pick(&cdf_[c * vocab_], vocab_, u);
      x[t] = static_cast<int32_t>(v);
      c = (c % top_) * vocab_ + v;
    }
  }

 private:
  int vocab_;
  int order_;
  int64_t contexts_;               // V^k
  int64_t top_;                    // V^(k-1)
  std::vector<double> cdf_;        // (V^k, V): cumulative next-token distribution per context
  std::vector<double> start_cdf_;  // [context] cumulative stationary distribution
  MarkovAnalysis analysis_;        // entropies only (the stationary vector lives in start_cdf_)
};

class SyntheticSource final : public DataSource {
 public:
  SyntheticSource(const SyntheticDataConfig& cfg, uint64_t seed, const std::string& config_file)
      : chain_(cfg, config_file), seed_(seed) {}

  int vocab_size() const override { return chain_.vocab(); }

  std::string describe() const override {
    return "synthetic Markov chain: vocab " + std::to_string(chain_.vocab()) + ", order " +
           std::to_string(chain_.order()) + ", entropy rate " +
           fmt("%.3f", chain_.analysis().entropy_rate) + " nats/token";
  }

  std::optional<double> entropy_rate() const override { return chain_.analysis().entropy_rate; }

  std::optional<double> loss_floor(int seq_len) const override {
    return data_internal::markov_loss_floor(chain_.analysis(), seq_len);
  }

  void sample(Split split, uint64_t iter, int64_t first, int count, int seq_len, int32_t* inputs,
              int32_t* targets) const override {
    check_sample_args(first, count, seq_len);
    const int n = seq_len + 1;
    // (seq_len + 1): one sequence; inputs are its first seq_len tokens, targets its last.
    std::vector<int32_t> x(n);
    for (int r = 0; r < count; ++r) {
      chain_.generate(sequence_key(seed_, split, iter, static_cast<uint64_t>(first + r)), n,
                      x.data());
      std::copy(x.begin(), x.begin() + seq_len, inputs + static_cast<int64_t>(r) * seq_len);
      std::copy(x.begin() + 1, x.end(), targets + static_cast<int64_t>(r) * seq_len);
    }
  }

 private:
  MarkovChain chain_;
  uint64_t seed_;
};

// The synthetic chain's documents for masked-LM samples: kSyntheticDocuments documents, each of
// seq_len/2 … 2·seq_len tokens (a length and a content keyed by (seed, document)); the last
// val_fraction of them are the validation split, as any corpus's.
constexpr int64_t kSyntheticDocuments = 2048;

class MarkovCorpus final : public TokenCorpus {
 public:
  MarkovCorpus(const SyntheticDataConfig& cfg, uint64_t seed, int seq_len,
               const std::string& config_file)
      : chain_(cfg, config_file), seed_(mix64(seed ^ 0x444F43554D454E54ull)) {
    const uint64_t lo = static_cast<uint64_t>(std::max(2, seq_len / 2));
    const uint64_t span = static_cast<uint64_t>(2 * seq_len) - lo + 1;
    start_.resize(kSyntheticDocuments + 1);
    for (int64_t d = 0; d < kSyntheticDocuments; ++d) {
      const uint64_t len = lo + stream_word(key(d), 1u << 30) % span;
      start_[static_cast<size_t>(d) + 1] =
          start_[static_cast<size_t>(d)] + static_cast<int64_t>(len);
    }
  }

  int vocab() const { return chain_.vocab(); }
  const MarkovAnalysis& analysis() const { return chain_.analysis(); }

  std::string path() const override { return "synthetic"; }
  int64_t num_documents() const override { return kSyntheticDocuments; }
  int64_t document_length(int64_t d) const override {
    return start_[static_cast<size_t>(d) + 1] - start_[static_cast<size_t>(d)];
  }
  int64_t num_tokens() const override { return start_.back(); }
  int token_bytes() const override { return 4; }
  void read(int64_t d, int64_t offset, int64_t count, int32_t* out) const override {
    thread_local std::vector<int32_t> doc;
    doc.resize(static_cast<size_t>(document_length(d)));
    chain_.generate(key(d), static_cast<int>(doc.size()), doc.data());
    std::copy_n(doc.begin() + offset, count, out);
  }
  std::string locate(int64_t d, int64_t offset) const override {
    return "synthetic document " + std::to_string(d) + " token " + std::to_string(offset);
  }

 private:
  uint64_t key(int64_t d) const { return mix64(seed_ ^ static_cast<uint64_t>(d)); }

  MarkovChain chain_;
  uint64_t seed_;
  std::vector<int64_t> start_;  // [d] the first token of document d; [D] = all
};

// A file's tokens (bytes of a text file or uint16 of a .bin) split into train = [0, n_train)
// and val = [n_train, n); a sequence is a window of seq_len + 1 consecutive tokens of its split.
struct TokenFile {
  std::string path;
  uint64_t header_bytes = 0;  // byte offset of token 0 in the file
  uint64_t token_bytes = 1;   // bytes per token in the file
  uint64_t n_train = 0;
  uint64_t n_val = 0;

  // Throws if a split cannot hold one sequence, naming the byte where that split starts.
  void check_splits(int seq_len) const {
    check_split("train", 0, n_train, seq_len);
    check_split("val", n_train, n_val, seq_len);
  }

 private:
  void check_split(const char* name, uint64_t begin, uint64_t len, int seq_len) const {
    const uint64_t need = static_cast<uint64_t>(seq_len) + 1;
    if (len >= need) return;
    const char* unit = token_bytes == 1 ? " bytes" : " tokens";
    throw InputError(path, byte_at(header_bytes + begin * token_bytes),
                     std::string("at least seq_len + 1 = ") + std::to_string(need) + unit +
                         " in the " + name + " split for one sequence, found " +
                         std::to_string(len) + " (train " + std::to_string(n_train) + ", val " +
                         std::to_string(n_val) + unit + ")");
  }
};

template <typename T>
class WindowSource final : public DataSource {
 public:
  WindowSource(TokenFile file, std::vector<T> tokens, int vocab, std::string description,
               uint64_t seed)
      : file_(std::move(file)),
        tokens_(std::move(tokens)),
        vocab_(vocab),
        description_(std::move(description)),
        seed_(seed) {}

  int vocab_size() const override { return vocab_; }
  std::string describe() const override { return description_; }

  void sample(Split split, uint64_t iter, int64_t first, int count, int seq_len, int32_t* inputs,
              int32_t* targets) const override {
    check_sample_args(first, count, seq_len);
    file_.check_splits(seq_len);
    const uint64_t begin = split == Split::kTrain ? 0 : file_.n_train;
    const uint64_t len = split == Split::kTrain ? file_.n_train : file_.n_val;
    const uint64_t starts = len - static_cast<uint64_t>(seq_len);  // windows that fit
    for (int r = 0; r < count; ++r) {
      const uint64_t key = sequence_key(seed_, split, iter, static_cast<uint64_t>(first + r));
      const T* w = tokens_.data() + begin + stream_word(key, 0) % starts;
      int32_t* in = inputs + static_cast<int64_t>(r) * seq_len;
      int32_t* tg = targets + static_cast<int64_t>(r) * seq_len;
      for (int i = 0; i < seq_len; ++i) {
        in[i] = static_cast<int32_t>(w[i]);
        tg[i] = static_cast<int32_t>(w[i + 1]);
      }
    }
  }

 private:
  TokenFile file_;
  std::vector<T> tokens_;
  int vocab_;
  std::string description_;
  uint64_t seed_;
};

// ", N invalid UTF-8 sequence(s) read as U+FFFD (the first at byte B)" for a text the tokenizer
// read with replacements, else "".
std::string replaced_utf8(std::string_view text) {
  size_t first = 0;
  const int64_t n = count_invalid_utf8(text, &first);
  if (n == 0) return "";
  return ", " + std::to_string(n) + " invalid UTF-8 sequence(s) read as U+FFFD (the first at " +
         byte_at(first) + ")";
}

// The bytes of the text file `path`; a missing file or one that is not a regular file is the
// config's fault (data.path), so the error names the config file.
std::vector<uint8_t> read_data_file(const std::string& path, const std::string& config_file) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    throw InputError(config_file, "data.path",
                     "an existing file, cannot find '" + path + "'" +
                         (ec ? ": " + ec.message() : std::string()));
  }
  if (!std::filesystem::is_regular_file(status)) {
    throw InputError(config_file, "data.path", "a regular file, '" + path + "' is not one");
  }
  return read_input_bytes(path, kMaxTextFileBytes);
}

void split_sizes(TokenFile* f, uint64_t n, double val_fraction) {
  // The train split is the largest whole prefix not above (1 - val_fraction) of the file.
  f->n_train = static_cast<uint64_t>(std::floor(static_cast<double>(n) * (1.0 - val_fraction)));
  f->n_train = std::min(f->n_train, n);
  f->n_val = n - f->n_train;
}

std::unique_ptr<DataSource> make_text_source(const DataConfig& data, uint64_t seed, int seq_len,
                                             const std::string& config_file) {
  const std::string& path = *data.path;
  std::vector<uint8_t> bytes = read_data_file(path, config_file);
  const uint64_t size = bytes.size();

  // Byte tokens are the file's bytes, so it must be UTF-8 as it stands; a tokenizer reads
  // invalid UTF-8 as U+FFFD (Python's errors="replace"), as strata data prepare does, and the
  // description counts it.
  const size_t bad = data_internal::first_invalid_utf8(bytes.data(), bytes.size());
  if (bad != bytes.size() && !data.tokenizer) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", bytes[bad]);
    throw InputError(path, byte_at(bad),
                     std::string("valid UTF-8 (data.source \"text\"), found an invalid or "
                                 "truncated sequence starting with byte ") +
                         hex);
  }

  TokenFile f;
  f.path = path;
  if (data.tokenizer) {
    // Byte-level BPE over the whole file (one document), then windows of its ids as for bytes.
    const std::unique_ptr<Tokenizer> tok = Tokenizer::load(*data.tokenizer);
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    std::vector<int32_t> ids = tok->encode(text);
    const std::string replaced = replaced_utf8(text);
    bytes = std::vector<uint8_t>();
    split_sizes(&f, ids.size(), data.val_fraction);
    f.check_splits(seq_len);
    std::string description = "text " + path + " (" + std::to_string(size) + " bytes) as " +
                              std::to_string(ids.size()) + " tokens of " + *data.tokenizer +
                              " (vocab " + std::to_string(tok->vocab_size()) + "; train " +
                              std::to_string(f.n_train) + ", val " + std::to_string(f.n_val) + ")" +
                              replaced;
    return std::make_unique<WindowSource<int32_t>>(std::move(f), std::move(ids), tok->vocab_size(),
                                                   std::move(description), seed);
  }
  split_sizes(&f, size, data.val_fraction);
  f.check_splits(seq_len);
  std::string description = "text " + path + " (" + std::to_string(size) + " bytes, train " +
                            std::to_string(f.n_train) + ", val " + std::to_string(f.n_val) + ")";
  return std::make_unique<WindowSource<uint8_t>>(std::move(f), std::move(bytes), 256,
                                                 std::move(description), seed);
}

// A text file's paragraphs as masked-LM documents: runs of lines separated by one or more blank
// lines (a line holding only "\r" counts as blank), as bytes or through data.tokenizer.
MaskedLmCorpus text_documents(const DataConfig& data, const std::string& config_file,
                              std::string* description) {
  const std::string& path = *data.path;
  const std::vector<uint8_t> bytes = read_data_file(path, config_file);
  const size_t bad = data_internal::first_invalid_utf8(bytes.data(), bytes.size());
  if (bad != bytes.size() && !data.tokenizer)
    throw InputError(path, byte_at(bad), "valid UTF-8 (data.source \"text\" as bytes)");
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::vector<std::string_view> paragraphs;
  size_t begin = 0, line = 0;
  bool blank_seen = false;
  while (line < text.size()) {
    size_t end = text.find('\n', line);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view l = text.substr(line, end - line);
    const bool blank = l.empty() || l == "\r";
    if (blank && !blank_seen && line > begin)
      paragraphs.push_back(text.substr(begin, line - begin));
    if (blank) begin = end + 1;
    blank_seen = blank;
    line = end + 1;
  }
  if (begin < text.size()) paragraphs.push_back(text.substr(begin));
  std::vector<int32_t> tokens;
  std::vector<int64_t> start = {0};
  int64_t vocab = 256;
  if (data.tokenizer) {
    const std::unique_ptr<Tokenizer> tok = Tokenizer::load(*data.tokenizer);
    vocab = tok->vocab_size();
    for (std::string_view p : paragraphs) {
      const std::vector<int32_t> ids = tok->encode(p);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      start.push_back(static_cast<int64_t>(tokens.size()));
    }
  } else {
    for (std::string_view p : paragraphs) {
      for (char c : p) tokens.push_back(static_cast<uint8_t>(c));
      start.push_back(static_cast<int64_t>(tokens.size()));
    }
  }
  *description = "text " + path + " (" + std::to_string(bytes.size()) + " bytes" +
                 (data.tokenizer ? ", " + *data.tokenizer : std::string()) + ") in paragraphs" +
                 (data.tokenizer ? replaced_utf8(text) : std::string());
  return {std::make_shared<MemoryCorpus>(path, std::move(tokens), std::move(start)), 1, vocab};
}

void check_synthetic(const SyntheticDataConfig& s, const std::string& config_file) {
  if (s.order < 1 || s.order > 4) {
    throw InputError(config_file, "data.synthetic.order",
                     "an integer in 1..4, found " + std::to_string(s.order));
  }
  if (s.vocab_size < 2 || s.vocab_size > 65536) {
    throw InputError(config_file, "data.synthetic.vocab_size",
                     "an integer in 2..65536, found " + std::to_string(s.vocab_size));
  }
  // V^k and V^(k+1) stop growing once past the limit, so they cannot overflow.
  int64_t contexts = 1;
  for (int i = 0; i < s.order && contexts <= kMaxContexts; ++i) contexts *= s.vocab_size;
  const std::string power = std::to_string(s.vocab_size) + "^" + std::to_string(s.order);
  if (contexts > kMaxContexts) {
    throw InputError(config_file, "data.synthetic",
                     "vocab_size^order at most 2^22 = " + std::to_string(kMaxContexts) +
                         " contexts, found " + power + (s.order > 1 ? " > 2^22" : "") +
                         " (lower data.synthetic.order or data.synthetic.vocab_size)");
  }
  if (contexts * s.vocab_size > kMaxTransitions) {
    throw InputError(config_file, "data.synthetic",
                     "vocab_size^(order+1) at most 2^24 = " + std::to_string(kMaxTransitions) +
                         " transition probabilities, found " + std::to_string(s.vocab_size) + "^" +
                         std::to_string(s.order + 1) + " = " +
                         std::to_string(contexts * s.vocab_size) +
                         " (lower data.synthetic.order or data.synthetic.vocab_size)");
  }
}

}  // namespace

std::unique_ptr<DataSource> make_data_source(const DataConfig& data, uint64_t seed,
                                             const SamplingShape& shape,
                                             const std::string& config_file) {
  const int seq_len = shape.seq_len;
  if (seq_len < 1) {
    throw InputError(config_file, "model.seq_len", "at least 1, found " + std::to_string(seq_len));
  }
  if (data.source == "synthetic") {
    check_synthetic(data.synthetic, config_file);
    if (shape.masked_lm) {
      auto corpus = std::make_shared<MarkovCorpus>(data.synthetic, seed, seq_len, config_file);
      const std::string description =
          "synthetic Markov chain documents (" + std::to_string(kSyntheticDocuments) + ", vocab " +
          std::to_string(corpus->vocab()) + ", order " + std::to_string(data.synthetic.order) + ")";
      return make_masked_lm_source({{corpus, 1, corpus->vocab()}}, data, seed, shape, description,
                                   config_file);
    }
    return std::make_unique<SyntheticSource>(data.synthetic, seed, config_file);
  }
  if (data.source != "text" && data.source != "tokens" && data.source != "indexed") {
    throw InputError(
        config_file, "data.source",
        "one of \"synthetic\", \"text\", \"tokens\", \"indexed\", found \"" + data.source + "\"");
  }
  if ((!data.path || data.path->empty()) && !data.blend) {
    throw InputError(config_file, "data.path",
                     "a file path (required when data.source is \"" + data.source + "\")");
  }
  if (!(data.val_fraction > 0 && data.val_fraction < 1)) {
    throw InputError(config_file, "data.val_fraction",
                     "a number in (0, 1), found " + fmt("%g", data.val_fraction));
  }
  if (shape.masked_lm) {
    std::string description;
    std::vector<MaskedLmCorpus> corpora;
    if (data.source == "text")
      corpora.push_back(text_documents(data, config_file, &description));
    else
      corpora = open_dataset_corpora(data, shape, config_file, &description);
    return make_masked_lm_source(corpora, data, seed, shape, description, config_file);
  }
  if (data.source == "text") return make_text_source(data, seed, seq_len, config_file);
  return make_corpus_source(data, seed, shape, config_file);
}

void DataSource::sample_batch(Split split, uint64_t iter, int64_t first, int count, int seq_len,
                              SampleBatch* out) const {
  const size_t n = static_cast<size_t>(count) * static_cast<size_t>(seq_len);
  out->inputs.resize(n);
  out->targets.resize(n);
  sample(split, iter, first, count, seq_len, out->inputs.data(), out->targets.data());
}

std::unique_ptr<DataSource> make_data_source(const DataConfig& data, uint64_t seed, int seq_len,
                                             const std::string& config_file) {
  SamplingShape shape;
  shape.seq_len = seq_len;
  return make_data_source(data, seed, shape, config_file);
}

}  // namespace strata
