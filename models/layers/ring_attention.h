// ring_attention.h — context parallelism's attention core: each sequence is split over the c
// ranks of a context group, and the keys and values travel around the group's ring while every
// rank attends its own queries to them (Liu et al., Ring Attention; Megatron-Core's
// context_parallel_size and its causal load balance).
//
// The split (ContextChunks): a sequence of S positions is cut into 2c chunks of S/(2c); context
// rank i holds chunks i and 2c−1−i, in that order, as its S/c rows — one early and one late
// chunk, so that causal attention's work is the same on every rank. Everything but the attention
// core is per position and runs on those rows alone; positions (learned or rotary) are the
// chunks' real ones.
//
// Forward, at rank i, c steps: step s attends the rank's queries to the keys and values of rank
// (i − s) mod c, while the block held is sent on to rank i + 1 and the next one received from
// rank i − 1 (one batch of send and receive, overlapped with the block's attention). Each step's
// partial output is merged into the running one by the log-sum-exp of its rows
// (Backend::attention_block_merge). Causal masking per pair of chunks: step 0 is the rank's own
// rows with the causal mask (chunk i then 2c−1−i in increasing position, so the row order is the
// position order); from rank j < i only its first chunk is seen, by every query (a full block);
// from rank j > i both its chunks are seen by the second chunk's queries only (a full block of
// half the queries); the other pairs lie wholly in the future and are skipped. Bidirectional
// attention (BERT) sees every chunk; with padded sequences each chunk is its own block with the
// key lengths taken from its real offset. Grouped-query attention sends only the KVH key/value
// heads.
//
// Backward: the key/value blocks go round the ring again, and with each the f32 gradient of its
// keys and values: a rank adds its blocks' part to the gradient that arrives with the block
// (sent by the rank before, overlapped with this step's attention) and sends the sum on; after c
// steps each rank receives the complete gradient of its own keys and values. The query gradient
// accumulates in place (f32). The backward takes the merged rows' lse (saved by the forward) and
// recomputes each block's probabilities from it.
//
// Transfers run on the context group with the watchdog naming them "ring step k of c" (and the
// peer); the key/values go as tag 1 and their gradients as tag 2.
//
// Thread-safety: as the model.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/comm/comm.h"

namespace strata {

// The positions a context rank holds of each sequence (see above).
struct ContextChunks {
  int size = 1;         // c
  int rank = 0;         // i
  int64_t seq_len = 0;  // S, the whole sequence (divisible by 2c)

  int64_t chunk() const { return seq_len / (2 * size); }
  int64_t local() const { return seq_len / size; }
  // Chunk k of the rank's rows (k = 0, 1): chunk `rank`, then chunk 2c−1−rank of the sequence.
  int64_t chunk_index(int k) const { return k == 0 ? rank : 2 * size - 1 - rank; }
  // The position in the sequence of the rank's row r (0 ≤ r < local()).
  int64_t position(int64_t r) const {
    const int64_t n = chunk();
    return chunk_index(r < n ? 0 : 1) * n + r % n;
  }
  std::vector<int64_t> positions() const;
  // The rank's rows of a (B, S, width) row-major array, as (B, S/c, width).
  template <class T>
  std::vector<T> take(const std::vector<T>& whole, int64_t B, int64_t width = 1) const {
    std::vector<T> out(static_cast<size_t>(B * local() * width));
    const int64_t n = chunk() * width;
    for (int64_t b = 0; b < B; ++b)
      for (int k = 0; k < 2; ++k) {
        const T* from = whole.data() + (b * seq_len + chunk_index(k) * chunk()) * width;
        std::copy(from, from + n, out.data() + (b * local() + k * chunk()) * width);
      }
    return out;
  }
};

// The rank's split in context group `cp` for a local sequence of `local_len` rows.
ContextChunks context_chunks(const Communicator& cp, int64_t local_len);

// Where a ring runs: the backend, the context group, the activations' type (the key/value blocks
// travel in it; their gradients in f32).
struct Ring {
  Backend& be;
  Communicator& cp;
  DType act = DType::kF32;
  // false: every step's blocks on the blocks at hand, nothing sent (bench_context's time of the
  // attention alone; the result is not the attention).
  bool transfer = true;
  // When given, the seconds spent waiting for transfers are added to it (the part of the ring's
  // communication its attention did not hide).
  double* waited_s = nullptr;
};

// out (B, S_l, NH·HS) and lse (B, NH, S_l) f32 (assigned) of the rank's queries in qkv
// (B, S_l, (NH + 2·KVH)·HS) over the keys of the whole sequences. causal: decoder attention;
// key_lengths (B) i32 or null: the sequences' real lengths (keys past them are padding).
// Collective over ring.cp.
void ring_attention_forward(const Ring& ring, Tensor& out, Tensor& lse, const Tensor& qkv,
                            int num_heads, int num_kv_heads, bool causal,
                            const Tensor* key_lengths);

// dqkv (qkv's layout, assigned) from dout (B, S_l, NH·HS) and the forward's out and lse.
// Collective over ring.cp.
void ring_attention_backward(const Ring& ring, Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                             const Tensor& out, const Tensor& lse, int num_heads, int num_kv_heads,
                             bool causal, const Tensor* key_lengths);

}  // namespace strata
