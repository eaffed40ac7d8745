#include "models/layers/ring_attention.h"

#include <chrono>
#include <string>
#include <utility>

#include "runtime/base/behaviour.h"
#include "runtime/base/check.h"

namespace strata {

// The planner prices the ring as this file runs it (runtime/base/behaviour.h): every step's
// transfer is started before the step's blocks and waited for after them, and the key/value
// gradients travel in f32.
static_assert(behaviour::kRingOverlapsAttention, "ring_attention_forward/backward overlap");
static_assert(behaviour::kRingGradWireBytes == sizeof(float), "the dk/dv blocks are f32");

namespace {

constexpr int kKeyValueTag = 1;
constexpr int kGradientTag = 2;

using Block = Backend::AttentionBlock;

// The blocks of step `step` (the keys and values of rank `src`), at context rank ctx.rank.
std::vector<Block> step_blocks(const ContextChunks& ctx, int src, int step, int NH, int KVH,
                               bool causal, const Tensor* key_lengths) {
  const int64_t n = ctx.chunk(), all = ctx.local();
  Block b;
  b.num_heads = NH;
  b.num_kv_heads = KVH;
  if (causal) {
    if (step == 0) {  // the rank's own rows: their order is the positions' order
      b.q_rows = {0, all};
      b.k_rows = {0, all};
      b.causal = true;
    } else if (src < ctx.rank) {  // its first chunk lies before both of ours
      b.q_rows = {0, all};
      b.k_rows = {0, n};
    } else {  // both its chunks lie between ours
      b.q_rows = {n, n};
      b.k_rows = {0, all};
    }
    return {b};
  }
  b.q_rows = {0, all};
  if (!key_lengths) {
    b.k_rows = {0, all};
    return {b};
  }
  // Padded sequences: each chunk of keys with its own offset in the sequence.
  ContextChunks from = ctx;
  from.rank = src;
  b.key_lengths = key_lengths;
  Block second = b;
  b.k_rows = {0, n};
  b.k_offset = from.chunk_index(0) * n;
  second.k_rows = {n, n};
  second.k_offset = from.chunk_index(1) * n;
  return {b, second};
}

// Waits for r, adding the time to ring.waited_s when asked.
void wait(const Ring& ring, Request& r) {
  if (!ring.waited_s) return r.wait();
  const auto t0 = std::chrono::steady_clock::now();
  r.wait();
  *ring.waited_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string ring_step(int step, int c) {
  return "ring step " + std::to_string(step) + " of " + std::to_string(c);
}

// Sends `send` to the next rank of the ring and receives `recv` from the one before.
Request pass_on(Communicator& cp, const Tensor& send, Tensor& recv, int tag,
                const std::string& what) {
  const int c = cp.size(), r = cp.rank();
  P2POp out =
      P2POp::send(send.data(), static_cast<size_t>(send.numel()), send.dtype(), (r + 1) % c, tag);
  P2POp in = P2POp::recv(recv.data(), static_cast<size_t>(recv.numel()), recv.dtype(),
                         (r + c - 1) % c, tag);
  out.what = in.what = what;
  return cp.ibatch({out, in});
}

// What both passes start from: the rank's split, the sizes, and its own key/value block (the
// first to attend to and to send) with the buffer the next one arrives in.
struct RingStart {
  ContextChunks ctx;
  int64_t B = 0, S = 0, HS = 0;
  Tensor kv, next;
};
RingStart start(const Ring& ring, const Tensor& qkv, int NH, int KVH) {
  RingStart r;
  r.B = qkv.size(0);
  r.S = qkv.size(1);
  r.ctx = context_chunks(ring.cp, r.S);
  r.HS = qkv.size(2) / (NH + 2 * int64_t{KVH});
  r.kv = ring.be.empty({r.B, r.S, 2 * KVH * r.HS}, MemCategory::kActivations, ring.act);
  ring.be.attention_kv_extract(r.kv, qkv, NH, KVH);
  if (r.ctx.size > 1) r.next = ring.be.empty(r.kv.shape(), MemCategory::kActivations, ring.act);
  return r;
}

}  // namespace

std::vector<int64_t> ContextChunks::positions() const {
  std::vector<int64_t> p(static_cast<size_t>(local()));
  for (int64_t r = 0; r < local(); ++r) p[static_cast<size_t>(r)] = position(r);
  return p;
}

ContextChunks context_chunks(const Communicator& cp, int64_t local_len) {
  ContextChunks c;
  c.size = cp.size();
  c.rank = cp.rank();
  c.seq_len = local_len * c.size;
  STRATA_CHECK(local_len % 2 == 0,
               "context rank's " << local_len << " positions are not two equal chunks");
  return c;
}

void ring_attention_forward(const Ring& ring, Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                            int KVH, bool causal, const Tensor* key_lengths) {
  Backend& be = ring.be;
  Communicator& cp = ring.cp;
  RingStart r = start(ring, qkv, NH, KVH);
  const ContextChunks& ctx = r.ctx;
  const int c = ctx.size;
  const int64_t S = r.S;
  Tensor &kv = r.kv, &next = r.next;
  Tensor out_b, lse_b;  // a block's result before its merge
  bool first = true;
  for (int step = 0; step < c; ++step) {
    const int src = (ctx.rank - step + c) % c;
    Request moving;
    if (step + 1 < c && ring.transfer)
      moving = pass_on(cp, kv, next, kKeyValueTag, ring_step(step + 1, c));
    for (const Block& b : step_blocks(ctx, src, step, NH, KVH, causal, key_lengths)) {
      if (first) {  // the first block covers every query row: it initialises out and lse
        STRATA_CHECK(b.q_rows.begin == 0 && b.q_rows.count == S, "ring attention's first block");
        be.attention_block_forward(out, lse, qkv, kv, b);
        first = false;
        continue;
      }
      if (!out_b.defined()) {
        out_b = be.empty(out.shape(), MemCategory::kActivations, ring.act);
        lse_b = be.empty(lse.shape(), MemCategory::kActivations);
      }
      be.attention_block_forward(out_b, lse_b, qkv, kv, b);
      be.attention_block_merge(out, lse, out_b, lse_b, b);
    }
    if (step + 1 < c && ring.transfer) {
      wait(ring, moving);
      std::swap(kv, next);
    }
  }
}

void ring_attention_backward(const Ring& ring, Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                             const Tensor& out, const Tensor& lse, int NH, int KVH, bool causal,
                             const Tensor* key_lengths) {
  Backend& be = ring.be;
  Communicator& cp = ring.cp;
  RingStart r = start(ring, qkv, NH, KVH);
  const ContextChunks& ctx = r.ctx;
  const int c = ctx.size;
  Tensor &kv = r.kv, &next = r.next;
  Tensor delta = be.empty(lse.shape(), MemCategory::kActivations);
  be.attention_block_delta(delta, dout, out, NH);
  Tensor dq = be.zeros({r.B, r.S, NH * r.HS}, MemCategory::kActivations);
  // The gradient of the block at hand (this rank's part, then with what arrived: sent on), two
  // of each so that one is in flight while the other is written.
  Tensor part[2], arrived[2];
  for (int k = 0; k < (c > 1 ? 2 : 1); ++k) {
    part[k] = be.empty(kv.shape(), MemCategory::kActivations);
    if (c > 1) arrived[k] = be.empty(kv.shape(), MemCategory::kActivations);
    if (c > 1 && !ring.transfer) be.zero(arrived[k]);  // nothing arrives: add zeros
  }
  Request grads;  // the gradient sent on at the previous step, and the one arriving
  for (int step = 0; step < c; ++step) {
    const int src = (ctx.rank - step + c) % c;
    Request moving;
    if (step + 1 < c && ring.transfer)
      moving = pass_on(cp, kv, next, kKeyValueTag, ring_step(step + 1, c));
    Tensor& mine = part[step % 2];
    be.zero(mine);
    for (const Block& b : step_blocks(ctx, src, step, NH, KVH, causal, key_lengths))
      be.attention_block_backward(dq, mine, dout, qkv, kv, lse, delta, b);
    if (step > 0) {  // the ranks before have added theirs: the sum goes on
      wait(ring, grads);
      be.add_inplace(mine, arrived[(step - 1) % 2]);
    }
    if (c > 1 && ring.transfer)
      grads = pass_on(cp, mine, arrived[step % 2], kGradientTag,
                      step + 1 < c ? ring_step(step + 1, c) : "ring gradient home");
    if (step + 1 < c && ring.transfer) {
      wait(ring, moving);
      std::swap(kv, next);
    }
  }
  // After c steps the gradient of this rank's own keys and values has come home.
  const Tensor* own = &part[0];
  if (c > 1) {
    wait(ring, grads);
    own = &arrived[(c - 1) % 2];
  }
  be.attention_qkv_assemble(dqkv, dq, *own, NH, KVH);
}

}  // namespace strata
