// data_internal.h — the pieces of data.cc that tests check on their own: the counter-based
// hash behind every sampling decision, the Markov-chain analysis (stationary distribution,
// entropy rate, loss floor) on any transition table, the synthetic chain's table, and the
// UTF-8 check. Not part of the public contract (data.h); only data.cc and tests include it.
//
// Layout of a Markov chain of order k over V tokens:
//   a context is the last k tokens (x_{t-k+1}, ..., x_t), numbered oldest digit first:
//     context = sum_j x_{t-k+1+j} * V^(k-1-j), in [0, V^k);
//   transitions is (V^k, V) row-major: transitions[context * V + v] = P(x_{t+1} = v | context),
//   each row summing to 1. The context after emitting v is (context mod V^(k-1)) * V + v.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/base/rng.h"  // mix64: the hash behind every sampling decision
#include "runtime/data/data_source.h"

namespace strata::data_internal {

// The key of sequence g of batch iter of split: a pure function of the four, so a sequence's
// content never depends on which rank draws it or in what order.
uint64_t sequence_key(uint64_t seed, Split split, uint64_t iter, uint64_t g);

// Word i of the stream started by key (splitmix64's sequence from state key).
uint64_t stream_word(uint64_t key, uint64_t i);

// A uniform double in [0, 1) from the top 53 bits of w.
double unit_double(uint64_t w);

struct MarkovAnalysis {
  std::vector<double> stationary;  // [context] stationary distribution over the V^k contexts
  double entropy_rate = 0;         // sum_ctx pi(ctx) H(P(.|ctx)), nats/token
  // [i], i in [0, k-1): H(X_{i+1} | X_0..X_i) of the stationary process; positions i >= k-1
  // see a full context and cost entropy_rate.
  std::vector<double> short_context_entropy;
  int iterations = 0;  // power-iteration steps taken
};

// Power iteration from the uniform distribution until the L1 change of one step is below
// 1e-12 (in double), then the entropies. Throws std::runtime_error if the chain does not settle
// within max_iterations steps (a nearly periodic or nearly reducible chain).
MarkovAnalysis analyze_markov(const std::vector<double>& transitions, int vocab, int order,
                              int max_iterations = 1000000);

// analyze_markov(...).entropy_rate.
double markov_entropy_rate(const std::vector<double>& transitions, int vocab, int order);

// Best achievable mean loss over the seq_len target positions of a sequence that starts in the
// stationary distribution: position i predicts token i+1 from tokens 0..i.
double markov_loss_floor(const MarkovAnalysis& a, int seq_len);

// The synthetic source's transition table (layout above): row ctx is softmax(2.5 * z) with
// z ~ N(0, 1) drawn from a stream keyed by (seed, ctx).
std::vector<double> synthetic_transitions(int vocab, int order, uint64_t seed);

// Offset of the first byte of the first invalid UTF-8 sequence (bad lead byte, bad or missing
// continuation byte, overlong form, surrogate, code point above U+10FFFF); n when all is valid.
size_t first_invalid_utf8(const uint8_t* s, size_t n);

}  // namespace strata::data_internal
