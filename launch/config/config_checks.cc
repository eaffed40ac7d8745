// config_checks.cc — the checks that combine several keys of a config and hold whatever the
// world size (config_schema.h's check_consistency); each error is reported at the key set last.
// The checks that need the world size are world_layout.cc's.

#include <cstdint>
#include <string>
#include <vector>

#include "launch/config/config_schema.h"
#include "models/registry.h"

namespace strata {

namespace {

using std::to_string;

void check_heads(const ModelConfig& m, const Reader& r) {
  if (m.hidden_size % m.num_heads != 0) {
    r.fail_latest({"model.hidden_size", "model.num_heads"},
                  "hidden_size " + to_string(m.hidden_size) + " is not divisible by num_heads " +
                      to_string(m.num_heads));
  }

  if (m.num_heads % m.kv_heads() != 0) {
    r.fail_latest({"model.num_key_value_heads", "model.num_heads"},
                  "num_heads " + to_string(m.num_heads) +
                      " is not a multiple of num_key_value_heads " + to_string(m.kv_heads()));
  }
}

// Qwen3-MoE's dense layers name layers of the model (the architecture refuses the keys where it
// has no dense layers: ArchSpec::validate).
void check_dense_layers(const ModelConfig& m, const Reader& r) {
  for (int l : m.mlp_only_layers)
    if (l >= m.num_layers)
      r.fail_latest({"model.mlp_only_layers", "model.num_layers"},
                    "mlp_only_layers names layer " + to_string(l) + " but num_layers is " +
                        to_string(m.num_layers) + " (layers 0 to " + to_string(m.num_layers - 1) +
                        ")");
}

// The schedule's chunks, and the split: one entry per model chunk, every layer in exactly one
// chunk, never silently dropped.
void check_layout(const ParallelLayout& p, const ModelConfig& m, const Reader& r) {
  if (p.virtual_stages > 1 && p.schedule != ScheduleKind::kInterleaved) {
    r.fail_latest({"parallel.virtual_stages", "parallel.schedule"},
                  "virtual_stages " + to_string(p.virtual_stages) +
                      " needs schedule \"interleaved\", got \"" + to_string(p.schedule) + "\"");
  }
  if (p.schedule == ScheduleKind::kInterleaved && p.pipeline < 2) {
    r.fail_latest(
        {"parallel.schedule", "parallel.pipeline"},
        "schedule \"interleaved\" needs pipeline >= 2, got pipeline " + to_string(p.pipeline));
  }
  if (p.schedule == ScheduleKind::kInterleaved && p.virtual_stages < 2) {
    r.fail_latest({"parallel.virtual_stages", "parallel.schedule"},
                  "schedule \"interleaved\" needs virtual_stages >= 2 (with 1 chunk per stage it "
                  "is \"1f1b\"), got virtual_stages " +
                      to_string(p.virtual_stages));
  }
  // Expert parallelism spreads a mixture's experts: it needs experts, a whole number per rank.
  if (p.expert > 1 && m.num_experts == 0) {
    r.fail_latest({"parallel.expert", "model.num_experts"},
                  "expert " + to_string(p.expert) +
                      " needs a mixture of experts (model.num_experts > 0), got a dense model");
  }
  if (p.expert > 1 && m.num_experts > 0 && m.num_experts % p.expert != 0) {
    r.fail_latest({"parallel.expert", "model.num_experts"},
                  "num_experts " + to_string(m.num_experts) + " is not divisible by expert " +
                      to_string(p.expert) + " (each rank of the expert group holds as many)");
  }
  // Context parallelism: each sequence is cut into 2·context chunks of whole positions (Megatron's
  // causal load balance); a length they do not divide is refused, never padded.
  if (p.context > 1 && m.seq_len % (2 * int64_t{p.context}) != 0) {
    r.fail_latest({"parallel.context", "model.seq_len"},
                  "seq_len " + to_string(m.seq_len) + " is not divisible by 2 × context = " +
                      to_string(2 * p.context) + " (each sequence is cut into 2·context chunks)");
  }
  // A capacity keeps ceil(cf·N·k/E) assignments of a micro-batch's N tokens: with the tokens
  // split over context ranks, which assignments an expert drops would depend on the split.
  if (p.context > 1 && m.num_experts > 0 && m.moe_capacity_factor) {
    r.fail_latest({"parallel.context", "model.moe_capacity_factor"},
                  "context " + to_string(p.context) +
                      " with moe_capacity_factor: which assignments a capacity drops would depend "
                      "on how the sequences are split; expected a dropless mixture (no "
                      "moe_capacity_factor) or context 1");
  }
  const int64_t chunks = int64_t{p.pipeline} * p.virtual_stages;
  const std::string chunks_text = "pipeline " + to_string(p.pipeline) + " × virtual_stages " +
                                  to_string(p.virtual_stages) + " = " + to_string(chunks);
  if (!p.layers_per_piece.empty()) {
    const std::vector<int>& lps = p.layers_per_piece;
    if (static_cast<int64_t>(lps.size()) != chunks) {
      r.fail_latest(
          {"parallel.layers_per_stage", "parallel.pipeline", "parallel.virtual_stages"},
          "expected " + chunks_text + " entries in layers_per_stage, got " + to_string(lps.size()));
    }
    int64_t sum = 0;
    for (int n : lps) sum += n;
    if (sum != m.num_layers) {
      r.fail_latest({"parallel.layers_per_stage", "model.num_layers"},
                    "layers_per_stage sums to " + to_string(sum) + " but num_layers is " +
                        to_string(m.num_layers) + " (every layer must be in exactly one stage)");
    }
  } else if (m.num_layers < chunks) {
    r.fail_latest({"model.num_layers", "parallel.pipeline", "parallel.virtual_stages"},
                  "num_layers " + to_string(m.num_layers) + " is fewer than the " + chunks_text +
                      " model chunks (each chunk needs at least one layer)");
  }
}

// cuDNN's fused attention serves bf16 operands on a GPU, head sizes multiple of 8 up to 128;
// asking for it where it cannot run is an error, not a silent fallback.
void check_attention_backend(const Config& c, const Reader& r) {
  const TrainConfig& t = c.train;
  const ModelConfig& m = c.model;
  if (t.attention_backend == "cudnn") {
    if (c.device != "cuda") {
      r.fail_latest({"train.attention_backend", "device"},
                    "attention_backend \"cudnn\" runs on the GPU: expected device \"cuda\", "
                    "got \"" +
                        c.device + "\"");
    }
    if (t.precision != "bf16") {
      r.fail_latest({"train.attention_backend", "train.precision"},
                    "attention_backend \"cudnn\" is bf16 only (cuDNN's fused attention has no "
                    "fp32 kernels): expected precision \"bf16\", got \"" +
                        t.precision + "\"");
    }
    const int head_size = m.head_size();
    if (head_size % 8 != 0 || head_size > 128) {
      r.fail_latest({"train.attention_backend", "model.hidden_size", "model.num_heads"},
                    "attention_backend \"cudnn\" needs a head size that is a multiple of 8 up "
                    "to 128, got hidden_size / num_heads = head size " +
                        to_string(head_size));
    }
  }
}

// Warm-up then decay: a warm-up longer than the decay would end on a rate the decay has
// already taken to min_lr, a jump nobody asks for (Megatron-LM refuses it too).
void check_lr_schedule(const OptimizerConfig& o, int iterations, const Reader& r) {
  if (o.decay != "constant" && o.decay_iters && o.warmup_iters > *o.decay_iters) {
    r.fail_latest({"optimizer.warmup_iters", "optimizer.decay_iters"},
                  "expected warmup_iters <= decay_iters, got warmup_iters " +
                      to_string(o.warmup_iters) + " > decay_iters " + to_string(*o.decay_iters) +
                      " (the rate would drop from lr to min_lr when the warm-up ends)");
  }
  // wsd: warm-up, stable, cool-down, in that order, the cool-down's length given (Megatron-LM
  // asserts it).
  if (o.decay == "wsd") {
    if (!o.wsd_decay_iters)
      r.fail_latest({"optimizer.wsd_decay_iters", "optimizer.decay"},
                    "the cool-down's iterations (≥ 1) with decay \"wsd\", got null");
    const int end = o.decay_iters.value_or(iterations);
    if (o.warmup_iters + *o.wsd_decay_iters > end)
      r.fail_latest({"optimizer.wsd_decay_iters", "optimizer.warmup_iters", "optimizer.decay_iters",
                     "train.iterations"},
                    "expected warmup_iters + wsd_decay_iters <= decay_iters " + to_string(end) +
                        ", got " + to_string(o.warmup_iters) + " + " +
                        to_string(*o.wsd_decay_iters) +
                        " (the cool-down would start before the warm-up ends)");
  }
}

// Samples during training continue a prompt: an encoder has nothing to generate.
void check_samples(const Config& c, const Reader& r) {
  if (c.log.sample_interval > 0 && architecture(c.model.arch).masked_lm) {
    r.fail_latest({"log.sample_interval", "model.arch"},
                  "samples continue a prompt with a causal language model: expected "
                  "sample_interval 0 for arch \"" +
                      c.model.arch + "\" (an encoder), got " + to_string(c.log.sample_interval));
  }
}

void check_batch(const Config& c, const Reader& r) {
  const TrainConfig& t = c.train;
  const ParallelLayout& p = c.layout;
  if (t.global_batch_size % p.micro_batch_size != 0) {
    r.fail_latest({"train.global_batch_size", "train.micro_batch_size"},
                  "global_batch_size " + to_string(t.global_batch_size) +
                      " is not a multiple of micro_batch_size " + to_string(p.micro_batch_size));
  }
}

void check_data(const DataConfig& d, const ModelConfig& m, const Reader& r) {
  if (d.blend && d.source != "tokens" && d.source != "indexed") {
    r.fail_latest({"data.blend", "data.source"},
                  "data.blend mixes datasets of data.source \"tokens\" or \"indexed\", got \"" +
                      d.source + "\"");
  }
  if (d.blend && d.path) {
    r.fail_latest({"data.blend", "data.path"},
                  "either data.path or data.blend, got both (data.path " + *d.path + ")");
  }
  // data.tokenizer goes with any source: it tokenizes a text source, decodes a tokenized
  // dataset's ids (bits per byte in strata eval), and reads text prompts and samples
  // (strata generate, log.sample_prompt) whatever the data, synthetic included.
  if (d.source != "synthetic" && !d.path && !d.blend) {
    // Named at data.path, in the source that chose the file-backed data.source.
    r.fail_in(r.latest_file({"data.source", "data.path"}), "data.path",
              "data.source \"" + d.source + "\" reads a file: expected a string, got null");
  }
  // Token ids index the embedding table, so the data's vocabulary must fit the model's.
  if (d.source == "synthetic" && d.synthetic.vocab_size > m.vocab_size) {
    r.fail_latest({"data.synthetic.vocab_size", "model.vocab_size", "data.source"},
                  "synthetic vocab_size " + to_string(d.synthetic.vocab_size) +
                      " exceeds model vocab_size " + to_string(m.vocab_size));
  }
  if (d.source == "text" && m.vocab_size < 256) {
    r.fail_latest({"model.vocab_size", "data.source"},
                  "data.source \"text\" has byte tokens 0..255: expected model vocab_size >= "
                  "256, got " +
                      to_string(m.vocab_size));
  }
}

void check_checkpoint(const CheckpointConfig& k, const Reader& r) {
  if (k.interval > 0 && !k.dir) {
    r.fail_in(r.latest_file({"checkpoint.interval", "checkpoint.dir"}), "checkpoint.dir",
              "checkpoint.interval " + to_string(k.interval) +
                  " saves checkpoints: expected a directory, got null");
  }
}

}  // namespace

// In this order: the first that fails is the error reported.
void check_consistency(const Config& c, const Reader& r) {
  check_heads(c.model, r);
  check_dense_layers(c.model, r);
  check_layout(c.layout, c.model, r);
  check_attention_backend(c, r);
  check_lr_schedule(c.optimizer, c.train.iterations, r);
  check_samples(c, r);
  check_batch(c, r);
  check_data(c.data, c.model, r);
  check_checkpoint(c.checkpoint, r);
}

}  // namespace strata
