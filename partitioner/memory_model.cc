#include "partitioner/memory_model.h"

#include <algorithm>

namespace strata {

namespace {

double element_bytes(const MemoryOptions& o) {
  return o.precision == "fp32" ? 4.0 : 2.0;
}

RankShape rank_shape(const ParallelLayout& c) {
  return {c.tensor, c.sequence_parallel, c.expert};
}

}  // namespace

PartWork context_share(PartWork w, int context) {
  if (context <= 1) return w;
  const double c = context;
  for (GemmShape& g : w.gemms) g.m /= c;  // every GEMM's rows are tokens (models/layers/work.h)
  w.attention_flops /= c;
  w.attention.seq /= c;
  w.logits /= c;
  w.elementwise_fwd /= c;
  w.elementwise_bwd /= c;
  w.f32_fwd /= c;
  w.f32_bwd /= c;
  for (Collective& x : w.collectives_fwd) x.elements /= c;
  for (Collective& x : w.collectives_bwd) x.elements /= c;
  return w;
}

ActivationElems context_share(ActivationElems a, int context) {
  if (context <= 1) return a;
  a.saved /= context;
  a.transient /= context;
  a.freed_before_layers /= context;
  return a;
}

double ring_block_elems(const ModelDescription& m, const ParallelLayout& c) {
  if (c.context <= 1) return 0;
  double most = 0;
  for (int kind = 0; kind < m.layer_kinds(); ++kind) {
    const AttentionShape a = m.layer_work(c.micro_batch_size, rank_shape(c), kind).attention;
    most = std::max(most, a.batch * (a.seq / c.context) * 2 * a.kv_heads * a.head_size);
  }
  return most;
}

double ring_buffer_bytes(const ModelDescription& m, const ParallelLayout& c, double element_bytes) {
  return ring_block_elems(m, c) * (2 * element_bytes + 4 * 4.0);
}

double layer_activation_bytes(const ModelDescription& m, const ParallelLayout& c,
                              const MemoryOptions& o, int kind) {
  return context_share(m.layer_activations(c.micro_batch_size, rank_shape(c), c.recompute,
                                           o.flash_attention || c.context > 1, kind),
                       c.context)
             .saved *
         element_bytes(o);
}

std::vector<MemoryBreakdown> stage_memory(const ModelDescription& m, const ParallelLayout& c,
                                          const MemoryOptions& o,
                                          const std::vector<int>& inflight) {
  const int p = c.pipeline, v = c.virtual_stages, pieces = p * v;
  const double eb = element_bytes(o);
  const bool bf16 = o.precision != "fp32";
  const double param_b = bf16 ? 2 : 4, grad_b = 4, opt_b = bf16 ? 12 : 8;
  const int b = c.micro_batch_size;
  const RankShape r = rank_shape(c);
  std::vector<ActivationElems> kinds;  // [kind] one layer's
  for (int kind = 0; kind < m.layer_kinds(); ++kind)
    // Ring attention keeps each row's log-sum-exp, as a fused kernel does, on every backend.
    kinds.push_back(context_share(
        m.layer_activations(b, r, c.recompute, o.flash_attention || c.context > 1, kind),
        c.context));
  // Per-token figures of a piece (its input, the boundary, the sequence-parallel gather, the
  // attention's f32 scratch): a rank holds S/c tokens of each sequence.
  const double cp = c.context;
  const std::vector<int> first = first_layers(c.layers_per_piece);
  std::vector<MemoryBreakdown> out(static_cast<size_t>(p));
  for (int st = 0; st < p; ++st) {
    MemoryBreakdown& mb = out[static_cast<size_t>(st)];
    RankParameters held;
    std::vector<int> held_kinds(kinds.size(), 0);  // [kind] the stage's layers
    bool last = false;
    for (int ch = 0; ch < v; ++ch) {
      const int k = ch * p + st;
      const int nl = c.layers_per_piece[static_cast<size_t>(k)];
      const int at = first[static_cast<size_t>(k)];
      const RankParameters piece = rank_parameters(m, c.tensor, c.expert, k, pieces, at, nl);
      held.dense += piece.dense;
      held.expert += piece.expert;
      const std::vector<int> n = layer_kind_counts(m, at, nl);
      for (size_t kind = 0; kind < n.size(); ++kind) held_kinds[kind] += n[kind];
      last = last || k == pieces - 1;
    }
    // The stage's layers' activations, and the largest backward working set among them.
    ActivationElems layer;
    for (size_t kind = 0; kind < kinds.size(); ++kind) {
      if (held_kinds[kind] == 0) continue;
      layer.saved += kinds[kind].saved * held_kinds[kind];
      layer.transient = std::max(layer.transient, kinds[kind].transient);
    }
    const double n = static_cast<double>(held.total());
    mb.parameters = n * param_b * (c.schedule == ScheduleKind::kTwoBW ? 2 : 1);
    // 2bw accumulates the next batch's gradients in a second buffer while the last batch's
    // step completes (launch/train/pipeline_stage.h).
    mb.gradients = n * grad_b * (c.schedule == ScheduleKind::kTwoBW ? 2 : 1);
    // ZeRO-1 shards the dense parameters' state over d ranks, the experts' over the d/e of the
    // expert-data-parallel group.
    const int64_t sharded = held.dense + held.expert * (c.distributed_optimizer ? c.expert : 1);
    mb.optimizer = static_cast<double>(sharded) * opt_b /
                   (c.distributed_optimizer ? gradient_reduction_ranks(c) : 1);

    const int pairs = std::max(1, inflight.empty() ? 1 : inflight[static_cast<size_t>(st)]);
    // A pair holds one chunk: 1/v of the stage's layers, plus its input (the embedding output
    // on the first piece, the received activation elsewhere) and the token ids.
    const double per_pair = layer.saved / v + m.piece_input_elems(b, r) / cp;
    double saved = pairs * per_pair;
    // The first stage keeps what the embedding saves besides its output in every pair.
    if (st == 0) saved += pairs * context_share(m.embedding_activations(b, r), c.context).saved;
    double transient = layer.transient;
    if (last) {
      const ActivationElems head = context_share(m.head_activations(b, r), c.context);
      const int head_pairs = c.schedule == ScheduleKind::kGPipe ? pairs : 1;
      saved += head_pairs * head.saved;
      // The head's backward runs first; a layer's backward comes after the head freed part of
      // what it kept (the logits).
      transient = std::max(head.transient, layer.transient - head.freed_before_layers);
    }
    mb.activations = (saved + transient) * eb;
    // The ring attention's key/value (and in the backward their gradients') buffers.
    const double ring = ring_buffer_bytes(m, c, eb);
    if (o.cpu_threads > 0 && c.context > 1) {
      // The ring's blocks, and its backward's f32 query gradient and row terms (the CPU block
      // kernels' per-thread scores are their own, outside the allocator).
      mb.buffers = ring + 4.0 * m.attention_scratch_f32(b, r) / cp;
    } else if (o.cpu_threads > 0) {
      // The CPU kernels' scores of one S² block per thread.
      mb.buffers = o.cpu_threads * m.cpu_attention_scratch_f32_per_thread() * 4.0;
    } else {
      // Two gradient buckets in flight, the p2p send/receive buffers, the sequence-parallel
      // all-gather buffer, the GEMM workspace, and the fused attention backward's f32 scratch.
      const double buckets = gradient_reduction_ranks(c) > 1 ? 2 * o.bucket_mb * 1024 * 1024 : 0;
      const double p2p = p > 1 ? 2 * m.boundary_elems(b, r) / cp * eb : 0;
      const double gather = m.sequence_gather_elems(b, r) / cp * eb;
      const double attn_scratch = o.flash_attention ? 4.0 * m.attention_scratch_f32(b, r) / cp : 0;
      mb.buffers =
          buckets + p2p + gather + o.workspace_bytes + attn_scratch + ring + o.reserve_bytes;
    }
  }
  return out;
}

}  // namespace strata
