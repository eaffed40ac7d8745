// The CUDA backend against the CPU backend (its reference): every op on random inputs of shapes
// that are not multiples of any tile size, then a whole training run. Skips visibly without a
// CUDA device (and in builds without CUDA, where cuda_device_count() is 0).
//
// Tolerances, fp32: 1e-4 relative to the largest magnitude of the result. Both sides compute in
// float; the GPU sums in a different order (cuBLAS tiling, block reductions, atomicAdd for
// weight gradients), which moves results by ~1e-6 relative; 1e-4 leaves room for K up to a few
// thousand terms and still catches any wrong term.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "models/registry.h"
#include "runtime/backend/backend.h"
#include "runtime/base/error.h"
#include "runtime/base/rng.h"
#include "runtime/comm/comm.h"
#include "tests/backend_test_util.h"

namespace strata {
namespace {

using namespace backend_test;

bool have_device() {
  return cuda_device_count() > 0;
}

// Runs `op` on the CPU and on the GPU backend with the same inputs, compares named outputs.
struct Pair {
  std::unique_ptr<Backend> cpu = make_backend("cpu", 1);
  std::unique_ptr<Backend> gpu = make_backend("cuda", 1);
};

class CudaBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaBackend, MatmulForwardAndBackward) {
  Pair p;
  const int N = 37, C = 45, OC = 29;
  const auto x = random(N * C, 1), w = random(OC * C, 2), b = random(OC, 3), g = random(N * OC, 4);
  std::vector<std::vector<float>> out[2];
  Backend* bes[2] = {p.cpu.get(), p.gpu.get()};
  for (int k = 0; k < 2; ++k) {
    Backend& be = *bes[k];
    Tensor X = put(be, {N, C}, x), W = put(be, {OC, C}, w), B = put(be, {OC}, b);
    Tensor Y = be.empty({N, OC}, MemCategory::kActivations);
    be.matmul_forward(Y, X, W, &B);
    Tensor G = put(be, {N, OC}, g), dX = be.zeros({N, C}, MemCategory::kActivations);
    Tensor dW = be.zeros({OC, C}, MemCategory::kActivations),
           dB = be.zeros({OC}, MemCategory::kActivations);
    be.matmul_backward(&dX, dW, &dB, G, X, W);
    out[k] = {get(be, Y), get(be, dX), get(be, dW), get(be, dB)};
  }
  const char* names[] = {"out", "dinp", "dweight", "dbias"};
  for (int i = 0; i < 4; ++i) expect_close(names[i], out[1][i], out[0][i], 1e-4);
}

TEST_F(CudaBackend, LayerNormGeluAttentionEmbeddingCrossEntropyAdamW) {
  Pair p;
  const int B = 2, S = 19, NH = 3, HS = 7, C = NH * HS, V = 50, Vp = 64;
  const auto x = random(B * S * C, 10), lw = random(C, 11), lb = random(C, 12);
  const auto g = random(B * S * C, 13), qkv = random(B * S * 3 * C, 14);
  const auto wte = random(Vp * C, 15), wpe = random(S * C, 16), logits = random(B * S * Vp, 17, 3);
  std::vector<int32_t> tok(B * S);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>(mix64(i) % V);
  std::vector<float> ce_weights(B * S);  // (B·S): 0, 1, 0.25, 0, 1, 0.25, ...
  for (size_t i = 0; i < ce_weights.size(); ++i)
    ce_weights[i] = i % 3 == 0 ? 0.f : i % 3 == 1 ? 1.f : 0.25f;
  std::vector<std::vector<float>> out[2];
  Backend* bes[2] = {p.cpu.get(), p.gpu.get()};
  for (int k = 0; k < 2; ++k) {
    Backend& be = *bes[k];
    const MemCategory a = MemCategory::kActivations;
    std::vector<std::vector<float>>& o = out[k];
    // LayerNorm
    Tensor X = put(be, {B, S, C}, x), W = put(be, {C}, lw), Bi = put(be, {C}, lb);
    Tensor Y = be.empty({B, S, C}, a), M = be.empty({B, S}, a), R = be.empty({B, S}, a);
    be.layernorm_forward(Y, M, R, X, W, Bi);
    Tensor G = put(be, {B, S, C}, g), dX = be.zeros({B, S, C}, a);
    Tensor dW = be.zeros({C}, a), dB = be.zeros({C}, a);
    be.layernorm_backward(dX, dW, dB, G, X, W, M, R);
    o.push_back(get(be, Y));
    o.push_back(get(be, dX));
    o.push_back(get(be, dW));
    o.push_back(get(be, dB));
    // GELU
    Tensor Gl = be.empty({B, S, C}, a), dG = be.zeros({B, S, C}, a);
    be.gelu_forward(Gl, X);
    be.gelu_backward(dG, X, G);
    o.push_back(get(be, Gl));
    o.push_back(get(be, dG));
    // Attention
    Tensor Q = put(be, {B, S, 3 * C}, qkv), O = be.empty({B, S, C}, a);
    // The saved state is each backend's own (CPU: probabilities, CUDA: log-sum-exp rows), so
    // only the output and the gradient are compared.
    Tensor Att = be.empty(be.attention_saved_shape(B, NH, S), a);
    Tensor dQ = be.zeros({B, S, 3 * C}, a);
    be.attention_forward(O, Att, Q, NH, NH);
    be.attention_backward(dQ, G, Q, O, Att, NH, NH);
    o.push_back(get(be, O));
    o.push_back(get(be, dQ));
    // Embedding (a vocabulary shard starting at 10)
    Tensor T = put_i32(be, {B, S}, tok), E = put(be, {Vp, C}, wte), P = put(be, {S, C}, wpe);
    Tensor Em = be.empty({B, S, C}, a), dE = be.zeros({Vp, C}, a), dP = be.zeros({S, C}, a);
    be.embedding_forward(Em, T, E, &P, 10);
    be.embedding_backward(dE, &dP, G, T, 10);
    o.push_back(get(be, Em));
    o.push_back(get(be, dE));
    o.push_back(get(be, dP));
    // Cross-entropy with padding columns
    const int Nr = B * S;
    Tensor L = put(be, {Nr, Vp}, logits), mx = be.empty({Nr}, a), se = be.empty({Nr}, a);
    Tensor tl = be.empty({Nr}, a), ls = be.empty({Nr}, a), dL = be.empty({Nr, Vp}, a);
    be.ce_row_stats(mx, se, L, V);
    be.ce_target_logit(tl, L, T, 0, V);
    be.ce_losses(ls, mx, se, tl, nullptr);
    be.ce_backward(dL, L, mx, se, T, 0.5f, 0, V, nullptr);
    o.push_back(get(be, ls));
    o.push_back(get(be, dL));
    // ... weighted by a loss mask (zeros, ones and fractions)
    Tensor Wm = put(be, {Nr}, ce_weights), lsw = be.empty({Nr}, a), dLw = be.empty({Nr, Vp}, a);
    be.ce_losses(lsw, mx, se, tl, &Wm);
    be.ce_backward(dLw, L, mx, se, T, 0.5f, 0, V, &Wm);
    o.push_back(get(be, lsw));
    o.push_back(get(be, dLw));
    // Reductions and AdamW
    o.push_back({static_cast<float>(be.sum_squares(X)), static_cast<float>(be.sum(X))});
    Tensor Pm = put(be, {B, S, C}, x), Mm = be.zeros({B, S, C}, a), Vv = be.zeros({B, S, C}, a);
    for (int step = 1; step <= 3; ++step)
      be.adamw_update_multi({{Pm, G, Mm, Vv, true}}, {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step});
    o.push_back(get(be, Pm));
    // Sequence-parallel layout changes (t = 1 is trivially the identity; use t = 1 here since
    // S = 19 is prime: the round trip is what matters)
    Tensor Ch = be.empty({1, B, S, C}, a), Back = be.empty({B, S, C}, a);
    be.seq_deinterleave(Ch, X, 1);
    be.seq_interleave(Back, Ch, 1);
    o.push_back(get(be, Back));
  }
  for (size_t i = 0; i < out[0].size(); ++i)
    expect_close("result " + std::to_string(i), out[1][i], out[0][i], 1e-4);
}

// The Llama-family ops and grouped-query attention on the GPU against the CPU backend, f32.
TEST_F(CudaBackend, LlamaOpsAndGroupedQueryAttentionMatchTheCpuBackend) {
  Pair p;
  const int B = 2, S = 19, NH = 4, KVH = 2, HS = 8, C = 45, F = 29;
  const int W = (NH + 2 * KVH) * HS, N = B * S;
  const auto x = random(N * C, 50, 2.f), w = random(C, 51), g = random(N * C, 52);
  const auto qkv = random(N * W, 53), go = random(N * NH * HS, 54);
  const auto gu = random(N * 2 * F, 55, 4.f), gf = random(N * F, 56);
  std::vector<float> table((S + 2) * HS);  // (S_max, HS): [cos | sin] of angles s·0.1·(i + 1)
  for (int s = 0; s < S + 2; ++s)
    for (int i = 0; i < HS / 2; ++i) {
      table[s * HS + i] = std::cos(0.1f * s * (i + 1));
      table[s * HS + HS / 2 + i] = std::sin(0.1f * s * (i + 1));
    }
  std::vector<std::vector<float>> out[2];
  Backend* bes[2] = {p.cpu.get(), p.gpu.get()};
  for (int k = 0; k < 2; ++k) {
    Backend& be = *bes[k];
    const MemCategory a = MemCategory::kActivations;
    std::vector<std::vector<float>>& o = out[k];
    // RMSNorm
    Tensor X = put(be, {N, C}, x), Wt = put(be, {C}, w), G = put(be, {N, C}, g);
    Tensor Y = be.empty({N, C}, a), R = be.empty({N}, a);
    Tensor dX = be.zeros({N, C}, a), dW = be.zeros({C}, a);
    be.rmsnorm_forward(Y, R, X, Wt, 1e-5f);
    be.rmsnorm_backward(dX, dW, G, X, Wt, R);
    o.insert(o.end(), {get(be, Y), get(be, R), get(be, dX), get(be, dW)});
    // RoPE, then grouped-query attention on the rotated qkv, then RoPE's backward on its dqkv
    Tensor T = put(be, {S + 2, HS}, table), Q = put(be, {B, S, W}, qkv);
    be.rope_forward(Q, T, NH, KVH);
    o.push_back(get(be, Q));
    Tensor O = be.empty({B, S, NH * HS}, a), Go = put(be, {B, S, NH * HS}, go);
    Tensor Att = be.empty(be.attention_saved_shape(B, NH, S), a), dQ = be.zeros({B, S, W}, a);
    be.attention_forward(O, Att, Q, NH, KVH);
    be.attention_backward(dQ, Go, Q, O, Att, NH, KVH);
    o.push_back(get(be, O));
    o.push_back(get(be, dQ));
    be.rope_backward(dQ, T, NH, KVH);
    o.push_back(get(be, dQ));
    // SwiGLU
    Tensor GU = put(be, {N, 2 * F}, gu), Gf = put(be, {N, F}, gf);
    Tensor Sy = be.empty({N, F}, a), dGU = be.empty({N, 2 * F}, a);
    be.swiglu_forward(Sy, GU);
    be.swiglu_backward(dGU, Gf, GU);
    o.push_back(get(be, Sy));
    o.push_back(get(be, dGU));
  }
  const char* names[] = {"rmsnorm out", "rmsnorm rstd",   "rmsnorm dinp", "rmsnorm dweight",
                         "rope qkv",    "gqa out",        "gqa dqkv",     "rope dqkv",
                         "swiglu out",  "swiglu dgate_up"};
  for (size_t i = 0; i < out[0].size(); ++i) expect_close(names[i], out[1][i], out[0][i], 1e-4);
}

// The per-head RMSNorm of the query and key heads (Qwen3's q_norm and k_norm) on the GPU against
// the CPU backend, forward then backward in place, grouped-query, in f32 (1e-4, as above) and in
// bf16 activations and weights with f32 statistics and weight gradients: there both backends
// compute in f32 from the same bf16 inputs and round each stored result once, so they differ by
// at most about one bf16 ulp (2^-8 relative) where their f32 sums differ in the last bits: 1e-2
// of the largest magnitude; rstd and the weight gradients, f32 sums, 1e-4.
TEST_F(CudaBackend, QkRmsNormMatchesTheCpuBackend) {
  Pair p;
  const int B = 2, S = 19, NH = 4, KVH = 2, HS = 24, W = (NH + 2 * KVH) * HS, N = B * S;
  const auto x = random(N * W, 60, 2.f), g = random(N * W, 61);
  const auto qw = random(HS, 62), kw = random(HS, 63);
  for (const DType t : {DType::kF32, DType::kBF16}) {
    std::vector<std::vector<float>> out[2];
    Backend* bes[2] = {p.cpu.get(), p.gpu.get()};
    for (int k = 0; k < 2; ++k) {
      Backend& be = *bes[k];
      const MemCategory a = MemCategory::kActivations;
      Tensor Q = put(be, {B, S, W}, x, t), X = put(be, {B, S, W}, x, t);
      Tensor G = put(be, {B, S, W}, g, t), Qw = put(be, {HS}, qw, t), Kw = put(be, {HS}, kw, t);
      Tensor R = be.empty({N * (NH + KVH)}, a), dQw = be.zeros({HS}, a), dKw = be.zeros({HS}, a);
      be.qk_rmsnorm_forward(Q, R, Qw, Kw, NH, KVH, 1e-6f);
      be.qk_rmsnorm_backward(G, dQw, dKw, X, Qw, Kw, R, NH, KVH);
      out[k] = {get(be, Q), get(be, R), get(be, G), get(be, dQw), get(be, dKw)};
    }
    const char* names[] = {"qkv", "rstd", "dqkv", "dq_weight", "dk_weight"};
    const bool bf16 = t == DType::kBF16;
    for (size_t i = 0; i < out[0].size(); ++i) {
      const bool rounded_to_bf16 = bf16 && (i == 0 || i == 2);
      expect_close(std::string("qk_rmsnorm ") + names[i] + " " + to_string(t), out[1][i], out[0][i],
                   rounded_to_bf16 ? 1e-2 : 1e-4);
    }
  }
}

// ---- ring attention's blocks (context parallelism) against the CPU backend ----
// A sequence of S = 2L positions cut into two chunks of L, as a context rank holds them: the
// blocks (causal on each chunk's own keys, full from the first chunk to the second; bidirectional
// over padded keys between every pair, a key block wholly in the padding of one sequence among
// them), merged by their log-sum-exp, then the backward of each block into the f32 accumulators
// and the q/k/v gradient assembled from them. Every intermediate on the GPU against the CPU
// backend's, and the assembled whole against the CPU's single-rank attention op, in f32 (1e-4 of
// the largest magnitude, as above) and bf16 (2e-2: the GPU's tensor cores round P and dS to bf16
// where they become operands, and each stored block output once). L = 70 spans two key tiles
// and ends inside one; head size 24 takes the tensor cores' element-wise staging, 32 their
// 16-byte copies.
struct RingCaseCuda {
  bool causal;
  std::vector<int32_t> lengths;  // empty: no padding
  int HS;
};

TEST_F(CudaBackend, RingAttentionBlocksMatchTheCpuBackend) {
  Pair p;
  const int B = 2, L = 70, S = 2 * L, NH = 4, KVH = 2;
  const std::vector<RingCaseCuda> cases = {
      {true, {}, 24}, {false, {S, 60}, 24}, {true, {}, 32}, {false, {S, 100}, 32}};
  for (const RingCaseCuda& c : cases)
    for (const DType t : {DType::kF32, DType::kBF16}) {
      const int HS = c.HS, W = (NH + 2 * KVH) * HS, Q = NH * HS, KV = 2 * KVH * HS;
      const auto qkv = random(B * S * W, 70, 2.f), go = random(B * S * Q, 71);
      std::vector<std::vector<float>> out[2];
      Backend* bes[2] = {p.cpu.get(), p.gpu.get()};
      for (int k = 0; k < 2; ++k) {
        Backend& be = *bes[k];
        const MemCategory a = MemCategory::kActivations;
        Tensor X = put(be, {B, S, W}, qkv, t), Go = put(be, {B, S, Q}, go, t);
        Tensor lengths;
        if (!c.lengths.empty()) lengths = put_i32(be, {B}, c.lengths);
        Tensor Kv = be.empty({B, S, KV}, a, t);
        be.attention_kv_extract(Kv, X, NH, KVH);
        // The blocks of this layout: (query chunk, key chunk, mask).
        struct Blk {
          int q, k;
          bool causal;
        };
        std::vector<Blk> blocks;
        if (c.causal)
          blocks = {{0, 0, true}, {1, 1, true}, {1, 0, false}};
        else
          blocks = {{0, 0, false}, {0, 1, false}, {1, 0, false}, {1, 1, false}};
        auto block = [&](const Blk& b) {
          Backend::AttentionBlock blk;
          blk.num_heads = NH;
          blk.num_kv_heads = KVH;
          blk.q_rows = {b.q * L, L};
          blk.k_rows = {b.k * L, L};
          blk.causal = b.causal;
          blk.key_lengths = lengths.defined() ? &lengths : nullptr;
          blk.k_offset = b.k * L;
          return blk;
        };
        Tensor O = be.empty({B, S, Q}, a, t), Lse = be.empty({B, NH, S}, a);
        Tensor Ob = be.empty({B, S, Q}, a, t), Lb = be.empty({B, NH, S}, a);
        std::vector<bool> first(2, true);
        for (const Blk& b : blocks) {
          // The first block of each query chunk is assigned, the others merged into it; the
          // first reads its keys inside the q/k/v, the others from the extracted block.
          const Backend::AttentionBlock blk = block(b);
          if (first[b.q]) {
            be.attention_block_forward(O, Lse, X, b.q == 0 ? X : Kv, blk);
            first[b.q] = false;
          } else {
            be.attention_block_forward(Ob, Lb, X, Kv, blk);
            be.attention_block_merge(O, Lse, Ob, Lb, blk);
          }
        }
        Tensor D = be.empty({B, NH, S}, a);
        be.attention_block_delta(D, Go, O, NH);
        Tensor dQ = be.zeros({B, S, Q}, a), dKv = be.zeros({B, S, KV}, a);
        for (const Blk& b : blocks)
          be.attention_block_backward(dQ, dKv, Go, X, Kv, Lse, D, block(b));
        Tensor dX = be.empty({B, S, W}, a, t);
        be.attention_qkv_assemble(dX, dQ, dKv, NH, KVH);
        // The single-rank attention op on the whole sequences.
        AttentionMask mask;
        mask.causal = c.causal;
        mask.key_lengths = lengths.defined() ? &lengths : nullptr;
        Tensor Ow = be.empty({B, S, Q}, a, t), Sw = be.empty(be.attention_saved_shape(B, NH, S), a);
        Tensor dXw = be.empty({B, S, W}, a, t);
        be.attention_forward(Ow, Sw, X, NH, KVH, mask);
        be.attention_backward(dXw, Go, X, Ow, Sw, NH, KVH, mask);
        out[k] = {get(be, Kv),  get(be, O),  get(be, Lse), get(be, D),  get(be, dQ),
                  get(be, dKv), get(be, dX), get(be, Ow),  get(be, dXw)};
      }
      const std::string what = std::string(c.causal ? "causal" : "padded") + " HS " +
                               std::to_string(HS) + " " + to_string(t) + " ";
      const char* names[] = {"kv", "out", "lse", "delta", "dq", "dkv", "dqkv"};
      const double tol = t == DType::kF32 ? 1e-4 : 2e-2;
      for (size_t i = 0; i < 7; ++i) expect_close(what + names[i], out[1][i], out[0][i], tol);
      // The blocks merged equal the single-rank op (the CPU's).
      expect_close(what + "out against the attention op", out[1][1], out[0][7], tol);
      expect_close(what + "dqkv against the attention op", out[1][6], out[0][8], tol);
    }
}

// ---- mixture of experts: every op against the CPU backend ----
// Integer results (top-k indices, the dispatch plan) must be equal; f32 results of f32 inputs
// within 1e-4 as above (the GPU sums over lanes in another order), bf16 results within 1e-2 (one
// rounding of the stored result), f32 results of bf16 inputs within 1e-3.

std::vector<int32_t> get_i32(Backend& be, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  be.download(v.data(), t);
  return v;
}

// k distinct experts per token, from the key.
std::vector<int32_t> moe_choices(int N, int k, int E, uint64_t key) {
  std::vector<int32_t> idx;
  for (int n = 0; n < N; ++n) {
    std::vector<int32_t> all(E);
    for (int e = 0; e < E; ++e) all[e] = e;
    for (int j = 0; j < k; ++j) {
      std::swap(all[j], all[j + mix64(key + static_cast<uint64_t>(n) * 977 + j) % (E - j)]);
      idx.push_back(all[j]);
    }
  }
  return idx;
}

// Routing forward and backward: expert counts below, at and above a warp's 32 lanes (E = 9, 40,
// 128 as Qwen3-MoE), renormalized or not, rows of tied logits, logits in f32 and bf16.
TEST_F(CudaBackend, MoeRoutingMatchesTheCpuBackend) {
  Pair p;
  struct Case {
    int N, E, k;
  };
  for (const Case c : {Case{37, 9, 2}, Case{21, 40, 5}, Case{13, 128, 8}})
    for (const DType t : {DType::kF32, DType::kBF16})
      for (const bool renormalize : {true, false}) {
        const std::string what = "N " + std::to_string(c.N) + " E " + std::to_string(c.E) + " k " +
                                 std::to_string(c.k) + " " + to_string(t) +
                                 (renormalize ? " renormalized" : "");
        auto logits = random(static_cast<size_t>(c.N) * c.E, 8000 + c.E, 2.f);
        for (int e = 0; e < c.E; ++e) logits[e] = 0.25f;  // row 0 all tied
        logits[c.E + c.E - 1] = logits[c.E + 3] = 9.f;    // row 1: the largest tied
        const auto dw = random(static_cast<size_t>(c.N) * c.k, 8100), de = random(c.E, 8101);
        std::vector<std::vector<float>> out[2];
        std::vector<int32_t> idx[2];
        Backend* bes[2] = {p.cpu.get(), p.gpu.get()};
        for (int b = 0; b < 2; ++b) {
          Backend& be = *bes[b];
          const MemCategory a = MemCategory::kActivations;
          Tensor L = put(be, {c.N, c.E}, logits, t), P = be.empty({c.N, c.E}, a);
          Tensor I = be.empty({c.N, c.k}, a, DType::kI32), W = be.empty({c.N, c.k}, a);
          be.moe_route(P, I, W, L, c.k, renormalize);
          Tensor dW = put(be, {c.N, c.k}, dw), dE = put(be, {c.E}, de);
          Tensor dL = put(be, {c.N, c.E}, std::vector<float>(logits.size(), NAN), t);
          out[b] = {get(be, P), get(be, W)};
          idx[b] = get_i32(be, I);
          be.moe_route_backward(dL, dW, dE, P, I, renormalize);
          out[b].push_back(get(be, dL));
        }
        EXPECT_EQ(idx[1], idx[0]) << what;
        expect_close(what + " probs", out[1][0], out[0][0], t == DType::kBF16 ? 1e-3 : 1e-4);
        expect_close(what + " topk_w", out[1][1], out[0][1], t == DType::kBF16 ? 1e-3 : 1e-4);
        expect_close(what + " dlogits", out[1][2], out[0][2], t == DType::kBF16 ? 1e-2 : 1e-4);
        EXPECT_EQ(idx[1][0], 0) << what;  // ties: the lower expert first
        EXPECT_EQ(idx[1][c.k], 3) << what;
        EXPECT_EQ(idx[1][c.k + 1], c.E - 1) << what;
      }
}

// The plan, dropless and with capacities that drop (weights with many ties: the token order
// decides), capacity 0; N·k from one chunk of the plan's counting to several, and to chunks of
// several steps (N·k > 256 · 512).
TEST_F(CudaBackend, MoeDispatchPlanMatchesTheCpuBackend) {
  Pair p;
  struct Case {
    int N, k, E;
  };
  for (const Case c : {Case{5, 2, 4}, Case{700, 2, 7}, Case{333, 8, 64}, Case{70001, 2, 16}}) {
    const std::vector<int32_t> idx = moe_choices(c.N, c.k, c.E, 8200 + c.N);
    auto w = random(idx.size(), 8300 + c.N);
    for (float& v : w) v = std::round(std::fabs(v) * 8) / 8;
    const int64_t fair = static_cast<int64_t>(c.N) * c.k / c.E;
    for (const int64_t capacity : {int64_t{-1}, fair, fair / 2 + 1, int64_t{0}}) {
      const std::string what = "N " + std::to_string(c.N) + " k " + std::to_string(c.k) + " E " +
                               std::to_string(c.E) + " capacity " + std::to_string(capacity);
      std::vector<int32_t> got[2][3];
      Backend* bes[2] = {p.cpu.get(), p.gpu.get()};
      for (int b = 0; b < 2; ++b) {
        Backend& be = *bes[b];
        const MemCategory a = MemCategory::kActivations;
        Tensor I = put_i32(be, {c.N, c.k}, idx), W = put(be, {c.N, c.k}, w);
        Tensor D = be.empty({c.N, c.k}, a, DType::kI32);
        Tensor C = be.empty({c.E}, a, DType::kI32), R = be.empty({c.E}, a, DType::kI32);
        be.moe_dispatch_plan(D, C, R, I, W, c.E, capacity);
        got[b][0] = get_i32(be, D), got[b][1] = get_i32(be, C), got[b][2] = get_i32(be, R);
      }
      EXPECT_EQ(got[1][0], got[0][0]) << what << " dest_row";
      EXPECT_EQ(got[1][1], got[0][1]) << what << " counts";
      EXPECT_EQ(got[1][2], got[0][2]) << what << " routed";
    }
  }
}

// Permute, unpermute and their backwards on a plan that drops, in f32 and bf16, with rows that
// move as 16-byte vectors (C = 64) and rows that do not (C = 13).
TEST_F(CudaBackend, MoePermutationsMatchTheCpuBackend) {
  Pair p;
  const int N = 53, k = 3, E = 6;
  const std::vector<int32_t> idx = moe_choices(N, k, E, 8400);
  auto w = random(idx.size(), 8401);
  for (float& v : w) v = std::fabs(v);
  for (const int C : {64, 13})
    for (const DType t : {DType::kF32, DType::kBF16}) {
      const std::string what = "C " + std::to_string(C) + " " + to_string(t);
      const auto x = random(static_cast<size_t>(N) * C, 8402), g = random(x.size(), 8403);
      std::vector<std::vector<float>> out[2];
      std::vector<int32_t> dest[2];
      Backend* bes[2] = {p.cpu.get(), p.gpu.get()};
      for (int b = 0; b < 2; ++b) {
        Backend& be = *bes[b];
        const MemCategory a = MemCategory::kActivations;
        Tensor I = put_i32(be, {N, k}, idx), W = put(be, {N, k}, w);
        Tensor D = be.empty({N, k}, a, DType::kI32);
        Tensor Cn = be.empty({E}, a, DType::kI32), Rt = be.empty({E}, a, DType::kI32);
        be.moe_dispatch_plan(D, Cn, Rt, I, W, E, 20);
        dest[b] = get_i32(be, D);
        const std::vector<int32_t> counts = get_i32(be, Cn);
        int64_t R = 0;
        for (const int32_t n : counts) R += n;
        Tensor X = put(be, {N, C}, x, t), G = put(be, {N, C}, g, t);
        Tensor XP = be.empty({R, C}, a, t), Out = be.empty({N, C}, a, t);
        Tensor dY = put(be, {R, C}, std::vector<float>(R * C, NAN), t);
        Tensor dW = put(be, {N, k}, std::vector<float>(idx.size(), NAN));
        Tensor dX = put(be, {N, C}, std::vector<float>(x.size(), NAN), t);
        be.moe_permute(XP, X, D);
        be.moe_unpermute(Out, XP, D, W);
        be.moe_unpermute_backward(dY, dW, G, XP, D, W);
        be.moe_permute_backward(dX, dY, D);
        out[b] = {get(be, XP), get(be, Out), get(be, dY), get(be, dW), get(be, dX)};
      }
      EXPECT_EQ(dest[1], dest[0]) << what;
      EXPECT_EQ(out[1][0], out[0][0]) << what << ": xp is a copy";
      const bool bf16 = t == DType::kBF16;
      const char* names[] = {"xp", "out", "dy", "dtopk_w", "dx"};
      for (int i = 1; i < 5; ++i)
        expect_close(what + " " + names[i], out[1][i], out[0][i],
                     i == 3 ? (bf16 ? 1e-3 : 1e-4) : (bf16 ? 1e-2 : 1e-4));
    }
}

TEST_F(CudaBackend, MoeProbSumsAndGroupedMatmulMatchTheCpuBackend) {
  Pair p;
  const int N = 1001, E = 70, I = 24, O = 40;
  const auto probs = random(static_cast<size_t>(N) * E, 8500);
  const std::vector<int64_t> rows = {9, 0, 17, 3, 0};
  const int G = static_cast<int>(rows.size());
  const int64_t R = 29;
  const auto x = random(R * I, 8501), w = random(static_cast<size_t>(G) * O * I, 8502);
  const auto g = random(R * O, 8503), dw0 = random(w.size(), 8504);
  for (const DType t : {DType::kF32, DType::kBF16}) {
    std::vector<std::vector<float>> out[2];
    Backend* bes[2] = {p.cpu.get(), p.gpu.get()};
    for (int b = 0; b < 2; ++b) {
      Backend& be = *bes[b];
      const MemCategory a = MemCategory::kActivations;
      Tensor P = put(be, {N, E}, probs), S = be.empty({E}, a);
      be.moe_prob_sums(S, P);
      Tensor X = put(be, {R, I}, x, t), Wt = put(be, {G, O, I}, w, t), Gr = put(be, {R, O}, g, t);
      Tensor Out = be.empty({R, O}, a, t), dX = be.empty({R, I}, a, t);
      Tensor dW = put(be, {G, O, I}, dw0);
      be.grouped_matmul_forward(Out, X, Wt, rows);
      be.grouped_matmul_backward_input(dX, Gr, Wt, rows);
      be.grouped_matmul_backward_weight(dW, Gr, X, rows);
      out[b] = {get(be, S), get(be, Out), get(be, dX), get(be, dW)};
    }
    const bool bf16 = t == DType::kBF16;
    const std::string ty = std::string(" ") + to_string(t);
    expect_close("prob sums" + ty, out[1][0], out[0][0], 1e-5);
    expect_close("grouped out" + ty, out[1][1], out[0][1], bf16 ? 1e-2 : 1e-4);
    expect_close("grouped dinp" + ty, out[1][2], out[0][2], bf16 ? 1e-2 : 1e-4);
    expect_close("grouped dweight" + ty, out[1][3], out[0][3], bf16 ? 1e-3 : 1e-4);
  }
}

// The losses of a 20-iteration training run of a tiny model (`preset`) on `device` in
// `precision`.
std::vector<double> training_losses(const std::string& device, const std::string& precision,
                                    const std::string& preset = "tiny") {
  RunContext ctx;
  ctx.verbose = false;
  return run_training(load_config("", {"model.preset=" + preset, "train.iterations=20",
                                       "train.micro_batch_size=4", "train.global_batch_size=8",
                                       "train.eval_interval=0", "train.threads=1",
                                       "device=" + device, "train.precision=" + precision}),
                      ctx)
      .losses;
}

// A whole training run on the GPU matches the CPU run's losses (fp32, 20 iterations, 1e-4).
TEST_F(CudaBackend, TrainingMatchesTheCpuRun) {
  const std::vector<double> cpu = training_losses("cpu", "fp32"),
                            gpu = training_losses("cuda", "fp32");
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * cpu[i]) << "iteration " << i;
}

// A preset's training run on the GPU against the CPU's, fp32 within 1e-4 and bf16 within 1e-2
// (tolerances and reasons as the GPT's, below), and learning.
void expect_training_matches_cpu(const char* preset) {
  for (const char* precision : {"fp32", "bf16"}) {
    const std::vector<double> cpu = training_losses("cpu", precision, preset),
                              gpu = training_losses("cuda", precision, preset);
    ASSERT_EQ(gpu.size(), cpu.size());
    const double tol = std::string(precision) == "fp32" ? 1e-4 : 1e-2;
    for (size_t i = 0; i < cpu.size(); ++i)
      EXPECT_NEAR(gpu[i], cpu[i], tol * cpu[i]) << preset << " " << precision << " iteration " << i;
    EXPECT_LT(gpu.back(), gpu.front()) << preset << " " << precision;
  }
}

// The Llama family: RMSNorm, rotary embeddings, SwiGLU and grouped-query attention (4 query heads
// over 2 key/value heads) through the CUDA kernels.
TEST_F(CudaBackend, LlamaTrainingMatchesTheCpuRun) {
  expect_training_matches_cpu("llama-tiny");
}

// BERT: bidirectional attention over padded keys, the erf GELU, tanh, token types, the tied
// masked-LM decoder with its bias and the sentence head, on masked-LM samples of the synthetic
// chain's documents, through the CUDA kernels.
TEST_F(CudaBackend, BertTrainingMatchesTheCpuRun) {
  expect_training_matches_cpu("bert-tiny");
}

// Generation over the key/value cache on the GPU picks the CPU's greedy tokens (fp32; the
// tiny Llama with grouped-query attention and rotary embeddings, a batch of two prompts) and its
// last logits agree within 1e-4 of their largest magnitude.
TEST_F(CudaBackend, GenerationMatchesTheCpu) {
  const ModelConfig m = load_config("", {"model.preset=llama-tiny", "model.init_std=0.3"}).model;
  std::vector<int32_t> tokens[2];
  std::vector<float> last[2];
  for (int k = 0; k < 2; ++k) {
    std::unique_ptr<Backend> be = make_backend(k == 0 ? "cpu" : "cuda", 1);
    ModelOptions o;
    o.seed = 3;
    std::unique_ptr<Model> model = build_model(m, o, *be);
    std::unique_ptr<GenerationState> st = model->start_generation(2, 24);
    std::vector<int32_t> step = {5, 9, 2, 7, 11, 3, 30, 1};  // two prompts of 4
    int T = 4;
    for (int n = 0; n < 20; ++n) {
      last[k] = model->decode(*st, step, T);
      for (int b = 0; b < 2; ++b) {
        const float* row = last[k].data() + b * m.vocab_size;
        step[static_cast<size_t>(b)] =
            static_cast<int32_t>(std::max_element(row, row + m.vocab_size) - row);
        tokens[k].push_back(step[static_cast<size_t>(b)]);
      }
      step.resize(2);
      T = 1;
    }
  }
  EXPECT_EQ(tokens[1], tokens[0]);
  expect_close("last logits", last[1], last[0], 1e-4);
}

// bf16 mixed precision on the GPU follows the CPU backend's bf16 (which rounds at the same
// points): both round every product to bf16 from f32 sums taken in different orders, so a loss
// may differ by a few bf16 ulps of the activations it came from: 1e-2 relative (1.5e-5 seen
// in the CUDA emulation build, whose GEMM is the CPU one), and falls.
TEST_F(CudaBackend, Bf16TrainingFollowsTheCpuBf16Run) {
  const std::vector<double> cpu = training_losses("cpu", "bf16"),
                            gpu = training_losses("cuda", "bf16");
  ASSERT_EQ(gpu.size(), cpu.size());
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], 1e-2 * cpu[i]) << "iteration " << i;
    worst = std::max(worst, std::abs(gpu[i] / cpu[i] - 1));
  }
  std::printf("  bf16 losses: largest relative difference %.2e\n", worst);
  EXPECT_LT(gpu.back(), gpu.front());
}

// Whether `e` is the backend's report that cuDNN refuses an attention shape.
bool is_cudnn_refusal(const std::exception& e) {
  return std::string(e.what()).find("cannot run causal attention") != std::string::npos;
}

// Runs `body`; a cuDNN that refuses the shape (an old version, an old GPU: the backend's error
// names why) skips the test with that reason — the kernel tests say which shapes it runs.
#define SKIP_IF_CUDNN_REFUSES(body)       \
  try {                                   \
    body;                                 \
  } catch (const std::runtime_error& e) { \
    if (!is_cudnn_refusal(e)) throw;      \
    GTEST_SKIP() << e.what();             \
  }

// train.attention_backend "cudnn": bf16 attention on cuDNN's fused flash attention gives what
// Strata's own flash kernels give — the output, the saved log-sum-exp (the same quantity, so a
// forward of one and a backward of the other agree) and the gradient, which the backend adds to
// dqkv as the interface says, although cuDNN itself overwrites. bf16 tolerances: 2e-2 of the
// largest magnitude for out and dqkv (both sides round their results to bf16 once, from f32
// sums in different orders), 1e-3 for the f32 log-sum-exp.
TEST_F(CudaBackend, CudnnAttentionMatchesStrataKernels) {
  std::unique_ptr<Backend> bes[2] = {make_backend("cuda", 1, "strata"),
                                     make_backend("cuda", 1, "cudnn")};
  const DType bf = DType::kBF16;
  const MemCategory a = MemCategory::kActivations;
  // cuDNN 9.14's backward runs S multiples of 128 only: those shapes come first, and a shape
  // it refuses is reported and passed over, so the others still run.
  std::string refused;
  int compared = 0;
  for (const auto [B, S, NH, HS] : {std::array<int, 4>{2, 128, 4, 64},
                                    {1, 256, 2, 128},
                                    {2, 77, 4, 64},
                                    {3, 1, 2, 32},
                                    {2, 130, 3, 16}}) {
    const std::string shape = "B " + std::to_string(B) + " S " + std::to_string(S) + " NH " +
                              std::to_string(NH) + " HS " + std::to_string(HS);
    SCOPED_TRACE(shape);
    const int C = NH * HS;
    const auto qkv = random(B * S * 3 * C, 21), g = random(B * S * C, 22);
    const auto init = random(B * S * 3 * C, 23, 0.5f);  // dqkv before: the gradient adds to it
    std::vector<float> out[2], lse[2], dqkv[2], cross;
    for (int k = 0; k < 2; ++k) {
      Backend& be = *bes[k];
      Tensor Q = put(be, {B, S, 3 * C}, qkv, bf), G = put(be, {B, S, C}, g, bf);
      Tensor O = be.empty({B, S, C}, a, bf);
      Tensor Att = be.empty(be.attention_saved_shape(B, NH, S), a);
      Tensor dQ = put(be, {B, S, 3 * C}, init, bf);
      try {
        be.attention_forward(O, Att, Q, NH, NH);
      } catch (const std::runtime_error& e) {
        if (k == 0 || !is_cudnn_refusal(e)) throw;
        refused += shape + ": " + e.what() + "\n";
        break;
      }
      be.attention_backward(dQ, G, Q, O, Att, NH, NH);
      out[k] = get(be, O);
      lse[k] = get(be, Att);
      dqkv[k] = get(be, dQ);
      if (k == 1) {  // cuDNN's forward state into Strata's backward
        Tensor dQs = put(*bes[0], {B, S, 3 * C}, init, bf);
        Tensor Qs = put(*bes[0], {B, S, 3 * C}, qkv, bf), Gs = put(*bes[0], {B, S, C}, g, bf);
        Tensor Os = put(*bes[0], {B, S, C}, out[1], bf);
        Tensor Atts = put(*bes[0], bes[0]->attention_saved_shape(B, NH, S), lse[1]);
        bes[0]->attention_backward(dQs, Gs, Qs, Os, Atts, NH, NH);
        cross = get(*bes[0], dQs);
      }
    }
    if (out[1].empty()) continue;  // refused
    ++compared;
    expect_close("out", out[1], out[0], 2e-2);
    expect_close("log-sum-exp", lse[1], lse[0], 1e-3);
    expect_close("dqkv", dqkv[1], dqkv[0], 2e-2);
    expect_close("dqkv, cuDNN forward then Strata backward", cross, dqkv[0], 2e-2);
  }
  EXPECT_NE(bes[1]->name().find("cuDNN"), std::string::npos) << bes[1]->name();
  if (!refused.empty())
    std::printf("cuDNN refused (compared %d shapes):\n%s", compared, refused.c_str());
  if (compared == 0) GTEST_SKIP() << "cuDNN refused every shape:\n" << refused;
}

// train.attention_backend "auto" runs bf16 attention on cuDNN for the shapes cuDNN runs and on
// Strata's kernels for the others, without an error: bit for bit the "cudnn" run where cuDNN
// takes the shape, and the "strata" run where it refuses it (cuDNN 9.14 refuses S = 77).
TEST_F(CudaBackend, AutoAttentionIsCudnnWhereItRunsElseStrata) {
  std::unique_ptr<Backend> strata = make_backend("cuda", 1, "strata");
  std::unique_ptr<Backend> cudnn = make_backend("cuda", 1, "cudnn");
  std::unique_ptr<Backend> automatic = make_backend("cuda", 1, "auto");
  const DType bf = DType::kBF16;
  for (const auto [B, S, NH, HS] : {std::array<int, 4>{2, 128, 4, 64}, {2, 77, 4, 64}}) {
    SCOPED_TRACE("S " + std::to_string(S));
    const int C = NH * HS;
    const auto qkv = random(B * S * 3 * C, 41), g = random(B * S * C, 42);
    auto run = [&](Backend& be, std::vector<float>* out) {
      Tensor Q = put(be, {B, S, 3 * C}, qkv, bf), G = put(be, {B, S, C}, g, bf);
      Tensor O = be.empty({B, S, C}, MemCategory::kActivations, bf);
      Tensor Att = be.empty(be.attention_saved_shape(B, NH, S), MemCategory::kActivations);
      Tensor dQ = be.zeros({B, S, 3 * C}, MemCategory::kActivations, bf);
      be.attention_forward(O, Att, Q, NH, NH);
      be.attention_backward(dQ, G, Q, O, Att, NH, NH);
      out[0] = get(be, O);
      out[1] = get(be, dQ);
    };
    std::vector<float> got[2], want[2];
    run(*automatic, got);
    bool cudnn_runs = true;
    try {
      run(*cudnn, want);
    } catch (const std::runtime_error& e) {
      if (!is_cudnn_refusal(e)) throw;
      cudnn_runs = false;
      run(*strata, want);
    }
    std::printf("S %d: auto ran %s\n", S, cudnn_runs ? "cuDNN" : "Strata's kernels");
    EXPECT_EQ(got[0], want[0]) << "out";
    EXPECT_EQ(got[1], want[1]) << "dqkv";
  }
  EXPECT_NE(automatic->name().find("cuDNN where it runs"), std::string::npos) << automatic->name();
}

// The Backend contract (runtime/backend/backend.h): an input gradient with one producer is
// assigned, never read. Each op runs into a buffer of NaN and into a zeroed one: an op that read
// its output (accumulated) would give NaN in the first. On the CPU backend everywhere and on the
// CUDA backend where a device (or the emulation) is there, in fp32 and bf16.
TEST(BackendContract, SingleProducerInputGradientsAreAssigned) {
  std::vector<std::string> devices = {"cpu"};
  if (have_device()) devices.push_back("cuda");
  const int B = 2, S = 19, NH = 3, HS = 8, C = NH * HS, N = B * S, F = 4 * C, V = 50;
  const auto x = random(N * C, 30), w = random(F * C, 31), g = random(N * F, 32);
  const auto pre = random(N * F, 36, 3);  // GELU inputs
  const auto qkv = random(N * 3 * C, 33), go = random(N * C, 34), logits = random(N * V, 35, 3);
  std::vector<int32_t> tok(static_cast<size_t>(N));
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>(mix64(i + 7) % V);
  for (const std::string& dev : devices)
    for (DType t : {DType::kF32, DType::kBF16}) {
      auto be = make_backend(dev, 1);
      const std::string what = dev + " " + to_string(t) + " ";
      // op writes the gradient it is given; returns it started from NaN and from zeros.
      auto run = [&](const Shape& shape, const std::function<void(Tensor&)>& op) {
        const int64_t n = shape_numel(shape);
        Tensor from_nan = put(*be, shape, std::vector<float>(static_cast<size_t>(n), NAN), t);
        Tensor from_zero = be->zeros(shape, MemCategory::kActivations, t);
        op(from_nan);
        op(from_zero);
        return std::array<std::vector<float>, 2>{get(*be, from_nan), get(*be, from_zero)};
      };
      auto check = [&](const std::string& name, const std::array<std::vector<float>, 2>& r) {
        // The two runs differ only in the starting values; GPU atomics may reorder sums.
        expect_close(what + name, r[0], r[1], t == DType::kBF16 ? 1e-2 : 1e-5, "from NaN",
                     "from zeros");
      };
      const Tensor X = put(*be, {N, C}, x, t), W = put(*be, {F, C}, w, t);
      const Tensor G = put(*be, {N, F}, g, t), Pre = put(*be, {N, F}, pre, t);
      check("matmul_backward_input dinp",
            run({N, C}, [&](Tensor& d) { be->matmul_backward_input(d, G, W); }));
      check("matmul_backward dinp", run({N, C}, [&](Tensor& d) {
              Tensor dw = be->zeros({F, C}, MemCategory::kGradients);
              Tensor db = be->zeros({F}, MemCategory::kGradients);
              be->matmul_backward(&d, dw, &db, G, X, W);
            }));
      check("gelu_backward dinp", run({N, F}, [&](Tensor& d) { be->gelu_backward(d, Pre, G); }));
      const Tensor Wt = put(*be, {C, F}, w, t);  // a (F -> C) layer after the GELU
      check("matmul_backward_input_gelu dpre",
            run({N, F}, [&](Tensor& d) { be->matmul_backward_input_gelu(d, X, Wt, Pre); }));
      const Tensor Q = put(*be, {B, S, 3 * C}, qkv, t), Go = put(*be, {B, S, C}, go, t);
      Tensor O = be->empty({B, S, C}, MemCategory::kActivations, t);
      Tensor saved = be->empty(be->attention_saved_shape(B, NH, S), MemCategory::kActivations);
      be->attention_forward(O, saved, Q, NH, NH);
      check("attention_backward dqkv", run({B, S, 3 * C}, [&](Tensor& d) {
              be->attention_backward(d, Go, Q, O, saved, NH, NH);
            }));
      // Grouped-query attention (2 query heads per key/value head) and SwiGLU.
      {
        const int gNH = 4, gKVH = 2, gW = (gNH + 2 * gKVH) * HS;
        const Tensor Qg = put(*be, {B, S, gW}, random(N * gW, 37), t);
        const Tensor Gg = put(*be, {B, S, gNH * HS}, random(N * gNH * HS, 38), t);
        Tensor Og = be->empty({B, S, gNH * HS}, MemCategory::kActivations, t);
        Tensor sg = be->empty(be->attention_saved_shape(B, gNH, S), MemCategory::kActivations);
        be->attention_forward(Og, sg, Qg, gNH, gKVH);
        check("attention_backward dqkv (grouped-query)", run({B, S, gW}, [&](Tensor& d) {
                be->attention_backward(d, Gg, Qg, Og, sg, gNH, gKVH);
              }));
        const Tensor GU = put(*be, {N, 2 * F}, random(N * 2 * F, 39, 3), t);
        check("swiglu_backward dgate_up",
              run({N, 2 * F}, [&](Tensor& d) { be->swiglu_backward(d, G, GU); }));
      }
      const Tensor L = put(*be, {N, V}, logits, t), T = put_i32(*be, {B, S}, tok);
      Tensor mx = be->empty({N}, MemCategory::kActivations);
      Tensor se = be->empty({N}, MemCategory::kActivations);
      be->ce_row_stats(mx, se, L, V);
      check("ce_backward dlogits",
            run({N, V}, [&](Tensor& d) { be->ce_backward(d, L, mx, se, T, 0.5f, 0, V, nullptr); }));
      // Weighted, with zero-weight rows (whose dlogits rows are stored as zeros, never read).
      std::vector<float> ce_w(static_cast<size_t>(N));
      for (size_t i = 0; i < ce_w.size(); ++i) ce_w[i] = static_cast<float>(i % 3) * 0.5f;
      const Tensor Wm = put(*be, {N}, ce_w);
      check("ce_backward dlogits (weighted)",
            run({N, V}, [&](Tensor& d) { be->ce_backward(d, L, mx, se, T, 0.5f, 0, V, &Wm); }));
    }
}

// Without a GPU, asking the factory for cuDNN attention names the key instead of running the
// CPU's attention under another name.
TEST(BackendFactory, CudnnAttentionNeedsTheCudaDevice) {
  std::vector<const char*> cpu_devices = {"cpu"};
  if (backend_device("auto") == Device::kCPU) cpu_devices.push_back("auto");  // no GPU seen
  for (const char* device : cpu_devices) {
    try {
      make_backend(device, 1, "cudnn");
      ADD_FAILURE() << device << ": expected an InputError";
    } catch (const InputError& e) {
      EXPECT_EQ(e.where(), "train.attention_backend") << e.what();
    }
  }
  EXPECT_EQ(make_backend("cpu", 1, "strata")->device(), Device::kCPU);
}

// A bf16 training run with its attention on cuDNN follows the run on Strata's kernels: the
// same model and data, attention summed in another order, so losses within 2e-2 relative.
TEST_F(CudaBackend, TrainingWithCudnnAttentionMatchesStrataAttention) {
  auto run = [](const char* attention) {
    RunContext ctx;
    ctx.verbose = false;
    return run_training(
        // seq 128: cuDNN 9.14's backward runs multiples of 128 only.
        load_config("", {"model.preset=tiny", "model.seq_len=128", "train.iterations=20",
                         "train.micro_batch_size=4", "train.global_batch_size=8",
                         "train.eval_interval=0", "train.precision=bf16", "device=cuda",
                         std::string("train.attention_backend=") + attention}),
        ctx);
  };
  TrainResult cudnn;
  SKIP_IF_CUDNN_REFUSES(cudnn = run("cudnn"));  // first: a refusal comes before any training
  const TrainResult strata = run("strata");
  ASSERT_EQ(cudnn.losses.size(), strata.losses.size());
  for (size_t i = 0; i < strata.losses.size(); ++i)
    EXPECT_NEAR(cudnn.losses[i], strata.losses[i], 2e-2 * strata.losses[i]) << "iteration " << i;
  EXPECT_LT(cudnn.losses.back(), cudnn.losses.front());
}

// The planner's memory prediction holds on the GPU too: the caching allocator's measured peak
// (cached-but-free blocks not counted, as on the CPU) within 10% of the prediction less its
// reserve for the CUDA context and NCCL, which never pass through the allocator. Activations
// dominate at these sizes, so the cuBLASLt workspace (32 MiB) is a few percent of the total.
TEST_F(CudaBackend, TrainingPeakMemoryWithinTenPercentOfThePrediction) {
  const double reserve = 1024.0 * 1024.0 * 1024.0;  // memory_options() for a GPU, cmd_plan.cc
#ifdef STRATA_CUDA_EMULATION
  // The emulator runs every GPU thread on the CPU: a quarter of the sequence and half the
  // micro-batch, where activations still outweigh the fixed buffers.
  const std::string seq = "model.seq_len=128", micro = "train.micro_batch_size=4",
                    global = "train.global_batch_size=8";
#else
  const std::string seq = "model.seq_len=512", micro = "train.micro_batch_size=8",
                    global = "train.global_batch_size=16";
#endif
  for (const char* variant : {"fp32", "bf16", "bf16 selective"}) {
    const std::string v = variant;
    const Config cfg =
        load_config("", {"model.preset=tiny", "model.num_layers=4", "model.hidden_size=512",
                         "model.num_heads=8", "model.ffn_hidden_size=2048", seq, micro, global,
                         "train.iterations=2", "train.eval_interval=0", "log.interval=1000",
                         "device=cuda", "train.precision=" + v.substr(0, 4),
                         std::string("train.recompute=") +
                             (v.find("selective") != std::string::npos ? "selective" : "none")});
    RunContext ctx;
    ctx.verbose = false;
    const TrainResult r = run_training(cfg, ctx);
    const nlohmann::json plan = planner_prediction(cfg, 1);
    const double predicted =
        plan.at("predicted").at("memory_bytes_per_stage").at(0).at("total").get<double>() - reserve;
    const double measured = static_cast<double>(r.memory.total_peak);
    std::printf("  %-15s predicted %.1f MiB, measured %.1f MiB (%+.1f%%)\n", variant,
                predicted / (1 << 20), measured / (1 << 20), 100 * (predicted / measured - 1));
    EXPECT_NEAR(predicted / measured, 1.0, 0.10) << variant;
  }
}

}  // namespace
}  // namespace strata
