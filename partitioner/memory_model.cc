#include "partitioner/memory_model.h"

#include <algorithm>

namespace strata {

const char* to_string(RecomputeKind r) {
  switch (r) {
    case RecomputeKind::kNone: return "none";
    case RecomputeKind::kSelective: return "selective";
    case RecomputeKind::kFull: return "full";
  }
  return "?";
}

bool parse_recompute_kind(const std::string& s, RecomputeKind* out) {
  if (s == "none") *out = RecomputeKind::kNone;
  else if (s == "selective") *out = RecomputeKind::kSelective;
  else if (s == "full") *out = RecomputeKind::kFull;
  else return false;
  return true;
}

int64_t padded_vocab(const ModelSpec& m, int tensor) {
  const int64_t mult = 128LL * tensor;
  return (m.vocab_size + mult - 1) / mult * mult;
}

int64_t model_parameters(const ModelSpec& m) {
  const int64_t h = m.hidden_size, f = m.ffn_hidden_size, L = m.num_layers;
  // Per layer: c_attn 3h·h + 3h, c_proj h·h + h, c_fc f·h + f, mlp.c_proj h·f + h, 2 LayerNorms.
  const int64_t layer = 4 * h * h + 2 * h * f + f + 9 * h;
  const int64_t emb = int64_t{m.vocab_size} * h + int64_t{m.seq_len} * h;
  const int64_t head = 2 * h + (m.tie_embeddings ? 0 : int64_t{m.vocab_size} * h);
  return L * layer + emb + head;
}

int64_t layer_parameters_per_rank(const ModelSpec& m, int t) {
  const int64_t h = m.hidden_size, f = m.ffn_hidden_size;
  // Column-parallel c_attn (weight and bias) and c_fc, row-parallel c_proj weights are split;
  // the row-parallel biases (2h) and LayerNorms (4h) are replicated.
  return (4 * h * h + 2 * h * f + 3 * h + f) / t + 6 * h;
}

int64_t piece_parameters_per_rank(const ModelSpec& m, int t, int piece, int pieces, int layers) {
  const int64_t h = m.hidden_size;
  int64_t n = int64_t{layers} * layer_parameters_per_rank(m, t);
  const int64_t wte = padded_vocab(m, t) / t * h;  // vocab-parallel
  if (piece == 0) n += wte + int64_t{m.seq_len} * h;
  if (piece == pieces - 1) {
    n += 2 * h;  // ln_f
    // The head: its own matrix, or with tied embeddings on another piece a copy of wte.
    if (!m.tie_embeddings || pieces > 1) n += wte;
  }
  return n;
}

namespace {

double element_bytes(const MemoryOptions& o) { return o.precision == "fp32" ? 4.0 : 2.0; }

// Per-layer saved elements (see BlockActs in models/gpt.cc, which this mirrors).
struct LayerElems {
  double saved;      // kept from forward to backward
  double transient;  // the backward pass's working set of one layer on top of `saved`
};

LayerElems layer_elems(const ModelSpec& m, const PlanConfig& c, const MemoryOptions& o) {
  const double b = c.micro_batch_size, s = m.seq_len, h = m.hidden_size, f = m.ffn_hidden_size;
  const double t = c.tensor, a = m.num_heads;
  const double sl = c.sequence_parallel ? s / t : s;  // sequence-sharded regions
  const double bsh_l = b * sl * h;
  const double stats = 4 * b * sl;                      // 2 LayerNorms × (mean, rstd)
  const double probs = o.flash_attention ? b * a / t * s  // log-sum-exp per row
                                         : b * a / t * s * s;
  const double core = probs + b * s * h / t;  // softmax probabilities + attention output
  const double full_block = 4 * bsh_l + stats + 3 * b * s * h / t + core + 2 * b * s * f / t;
  // Backward of one layer: d(gelu) and d(fc) together, the residual gradient, and with
  // sequence parallelism the gathered full-sequence copy of a LayerNorm output. (A GPU that
  // runs c_proj's input gradient and GELU's as one GEMM never holds d(gelu): one (b, s, f/t)
  // buffer less than this, which the prediction keeps as margin for when cuBLASLt declines.)
  const double grads = 2 * b * s * f / t + bsh_l + (c.sequence_parallel ? b * s * h : 0);
  switch (c.recompute) {
    case RecomputeKind::kNone: return {full_block, grads};
    case RecomputeKind::kSelective: return {full_block - core, grads + core};
    case RecomputeKind::kFull: return {bsh_l, grads + full_block};
  }
  return {full_block, grads};
}

}  // namespace

double layer_activation_bytes(const ModelSpec& m, const PlanConfig& c, const MemoryOptions& o) {
  return layer_elems(m, c, o).saved * element_bytes(o);
}

std::vector<MemoryBreakdown> stage_memory(const ModelSpec& m, const PlanConfig& c,
                                          const MemoryOptions& o, const std::vector<int>& inflight) {
  const int p = c.pipeline, v = c.virtual_stages, pieces = p * v;
  const double eb = element_bytes(o);
  const bool bf16 = o.precision != "fp32";
  const double param_b = bf16 ? 2 : 4, grad_b = 4, opt_b = bf16 ? 12 : 8;
  const LayerElems le = layer_elems(m, c, o);
  const double b = c.micro_batch_size, s = m.seq_len, h = m.hidden_size, t = c.tensor;
  const double sl = c.sequence_parallel ? s / t : s;
  const double vl = static_cast<double>(padded_vocab(m, c.tensor)) / t;
  std::vector<MemoryBreakdown> out(static_cast<size_t>(p));
  for (int st = 0; st < p; ++st) {
    MemoryBreakdown& mb = out[static_cast<size_t>(st)];
    double n = 0;
    int layers = 0;
    bool first = false, last = false;
    for (int ch = 0; ch < v; ++ch) {
      const int k = ch * p + st;
      const int nl = c.layers_per_piece[static_cast<size_t>(k)];
      n += static_cast<double>(piece_parameters_per_rank(m, c.tensor, k, pieces, nl));
      layers += nl;
      first = first || k == 0;
      last = last || k == pieces - 1;
    }
    mb.parameters = n * param_b * (c.schedule == ScheduleKind::kTwoBW ? 2 : 1);
    mb.gradients = n * grad_b;
    mb.optimizer = n * opt_b / (c.distributed_optimizer ? c.data : 1);

    const int pairs = std::max(1, inflight.empty() ? 1 : inflight[static_cast<size_t>(st)]);
    // A pair holds one chunk: 1/v of the stage's layers, plus its input (the embedding output
    // on the first piece, the received activation elsewhere) and the token ids.
    double per_pair = le.saved * layers / v + b * sl * h + 2 * b * s;
    double saved = pairs * per_pair;
    double transient = le.transient;
    if (last) {
      // ln_f output and statistics, the logits (b·s, V/t) and their row statistics.
      const double logits = b * s * vl;
      const double head = b * sl * h + 2 * b * sl + logits + 2 * b * s;
      const int head_pairs = c.schedule == ScheduleKind::kGPipe ? pairs : 1;
      saved += head_pairs * head;
      // The head's backward: d(logits) beside the logits, d(ln_f) over the full sequence and
      // the residual gradient; a layer's backward comes after the logits are freed.
      const double head_transient = logits + b * s * h + b * sl * h;
      transient = std::max(head_transient, le.transient - logits);
    }
    mb.activations = (saved + transient) * eb;
    if (o.cpu_threads > 0) {
      mb.buffers = o.cpu_threads * s * s * 4.0;
    } else {
      // Two gradient buckets in flight, the p2p send/receive buffers, the sequence-parallel
      // all-gather buffer, the GEMM workspace, and the fused attention backward's f32 scratch
      // (a dq accumulator of the local heads and one row sum per query row; cuDNN's workspace
      // holds the same two).
      const double buckets = c.data > 1 ? 2 * o.bucket_mb * 1024 * 1024 : 0;
      const double p2p = p > 1 ? 2 * b * sl * h * eb : 0;
      const double gather = c.sequence_parallel ? b * s * h * eb : 0;
      const double a = m.num_heads;
      const double attn_scratch = o.flash_attention ? 4.0 * (b * s * h / t + b * a / t * s) : 0;
      mb.buffers = buckets + p2p + gather + o.workspace_bytes + attn_scratch + o.reserve_bytes;
    }
  }
  return out;
}

}  // namespace strata
