// rng.h — counter-based random numbers: every value is a pure function of (key, index).
//
// Parameter initialisation uses these so that element i of a named parameter has the same value
// whichever rank initialises it and however the tensor is sharded: a rank holding a shard
// evaluates the same function at the shard's global indices (docs/contracts.md: the model depends
// on the seed alone). No generator state is carried between calls.
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace strata {

// SplitMix64 finaliser: a bijective 64-bit mix with good avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a of a name, to key a stream by a parameter's name.
inline uint64_t hash_name(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Uniform in (0, 1): 53 random bits, never 0.
inline double uniform01(uint64_t key, uint64_t index) {
  const uint64_t r = mix64(key ^ mix64(index));
  return (static_cast<double>(r >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal by Box–Muller from two uniforms of the stream `key` at `index`.
inline double normal01(uint64_t key, uint64_t index) {
  const double u1 = uniform01(key, 2 * index);
  const double u2 = uniform01(key, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace strata
