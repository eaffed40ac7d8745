// config.h — the training configuration as plain values: every key of docs/config.md.
//
// A struct per section, but for the parallel layout (runtime/base/parallel_layout.h), whose keys
// sit in two sections (parallel.*, train.micro_batch_size, train.recompute) and which plans and the
// planner share. Parsing, presets, overrides and validation live in launch/config/config_parse.h;
// the runtime, the models and the partitioner only read these structs.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/base/parallel_layout.h"

namespace strata {

// Llama 3.1's rotary frequency scaling (Hugging Face's rope_scaling with rope_type "llama3"):
// wavelengths longer than original_max_position_embeddings / low_freq_factor are divided by
// `factor`, shorter than original_max_position_embeddings / high_freq_factor kept, and those
// between interpolated smoothly.
struct RopeScaling {
  std::string rope_type = "llama3";
  double factor = 8;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int original_max_position_embeddings = 8192;
  bool operator==(const RopeScaling& o) const {
    return rope_type == o.rope_type && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor &&
           original_max_position_embeddings == o.original_max_position_embeddings;
  }
};
// Hugging Face's rope_scaling object.
inline void to_json(nlohmann::json& j, const RopeScaling& r) {
  j = {{"rope_type", r.rope_type},
       {"factor", r.factor},
       {"low_freq_factor", r.low_freq_factor},
       {"high_freq_factor", r.high_freq_factor},
       {"original_max_position_embeddings", r.original_max_position_embeddings}};
}

struct ModelConfig {
  std::string preset;  // "" when none
  std::string arch = "gpt";
  int num_layers = 12;
  int hidden_size = 768;
  int num_heads = 12;
  int ffn_hidden_size = 3072;  // defaults to 4 * hidden_size when a preset or file omits it
  int seq_len = 1024;
  int vocab_size = 50257;
  bool tie_embeddings = true;
  double dropout = 0.0;
  double init_std = 0.02;
  std::optional<std::string> init_from;
  // Llama family (Hugging Face's LlamaConfig names). num_key_value_heads: null means num_heads
  // (multi-head attention); 1 is multi-query attention.
  std::optional<int> num_key_value_heads;
  double rope_theta = 10000;
  std::optional<RopeScaling> rope_scaling;
  double rms_norm_eps = 1e-5;
  // BERT (Hugging Face's BertConfig names): segment (token type) embeddings and the LayerNorm
  // epsilon of the encoder, its embeddings and its masked-LM head.
  int type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  // Mixtures of experts (mixtral, qwen3_moe; Hugging Face's names, models/layers/moe.h): every
  // sparse block's MLP (sparse_layer) is num_experts SwiGLU experts of moe_intermediate_size (null:
  // ffn_hidden_size), num_experts_per_tok of them per token; 0 experts is a dense MLP.
  // norm_topk_prob divides the top-k weights by their sum (Mixtral always does);
  // router_aux_loss_coef weighs the load-balancing loss; moe_capacity_factor null routes dropless.
  // head_dim: the attention's head size, null: hidden_size / num_heads (Qwen3's differs).
  int num_experts = 0;
  int num_experts_per_tok = 2;
  std::optional<int> moe_intermediate_size;
  bool norm_topk_prob = true;
  double router_aux_loss_coef = 0.001;
  std::optional<double> moe_capacity_factor;
  std::optional<int> head_dim;
  // Qwen3-MoE's dense layers (Hugging Face's Qwen3MoeConfig names): layer i is a mixture when
  // it is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0, else a dense SwiGLU MLP
  // of ffn_hidden_size. The defaults make every layer of a mixture sparse (all Mixtral's).
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;  // distinct layer indices in [0, num_layers)

  // Key/value heads: num_key_value_heads, or num_heads when null.
  int kv_heads() const { return num_key_value_heads.value_or(num_heads); }
  // The attention's head size: head_dim, or hidden_size / num_heads when null.
  int head_size() const { return head_dim.value_or(num_heads > 0 ? hidden_size / num_heads : 0); }
  // An expert's width: moe_intermediate_size, or ffn_hidden_size when null.
  int expert_hidden() const { return moe_intermediate_size.value_or(ffn_hidden_size); }
  // Layer `layer` is a mixture of experts (Hugging Face's Qwen3MoeDecoderLayer's rule): a
  // mixture model's, not in mlp_only_layers, and (layer + 1) a multiple of decoder_sparse_step.
  bool sparse_layer(int layer) const {
    for (int l : mlp_only_layers)
      if (l == layer) return false;
    return num_experts > 0 && decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
  }
};

// The train section but for train.micro_batch_size and train.recompute, which are the layout's.
struct TrainConfig {
  int global_batch_size = 32;
  int iterations = 100;
  uint64_t seed = 1234;
  std::string precision = "fp32";  // fp32 | bf16
  // Which causal-attention kernels run: auto | strata | cudnn. "strata": Strata's own (the CPU
  // reference, the flash-style CUDA kernels); "cudnn": cuDNN's fused flash attention for the
  // bf16 attention of a CUDA run; "auto": strata until the cuDNN path is verified on a GPU.
  std::string attention_backend = "auto";
  std::optional<int> threads;
  int eval_interval = 50;  // 0: never
  int eval_iters = 10;
  bool skip_nonfinite = true;
};

struct OptimizerConfig {
  std::string name = "adamw";
  double lr = 3e-4;
  double min_lr = 3e-5;
  int warmup_iters = 10;
  // cosine | linear | constant | wsd | inverse-square-root (Megatron-LM's lr_decay_style)
  std::string decay = "cosine";
  std::optional<int> decay_iters;  // null: train.iterations
  // wsd (warm-up, stable, decay): the last wsd_decay_iters iterations before decay_iters cool
  // down from lr to min_lr in the shape wsd_decay_style (exponential | linear | cosine |
  // minus_sqrt, Megatron-LM's lr_wsd_decay_style).
  std::optional<int> wsd_decay_iters;
  std::string wsd_decay_style = "exponential";
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0: no clipping
};

struct SyntheticDataConfig {
  int vocab_size = 64;
  int order = 2;
  uint64_t seed = 7;
};

// How a masked-LM source (an encoder's data: model.arch "bert") builds its samples from the
// documents (runtime/data/bert_dataset.h).
struct MaskedLmDataConfig {
  double mask_prob = 0.15;      // positions chosen for prediction (of those 80/10/10)
  double short_seq_prob = 0.1;  // a sample made shorter than seq_len at random
  bool sentence_order = false;  // ALBERT's sentence order (swapped A, B) instead of NSP
  // The special tokens; null: the last four ids of model.vocab_size ([CLS], [SEP], [MASK],
  // [PAD] in that order), above every token of the data.
  std::optional<int> cls_id, sep_id, mask_id, pad_id;
};

// One dataset of a blend and its share of the samples.
struct BlendEntry {
  std::string path;  // an indexed prefix or token shards (a path or glob), as data.path
  double weight = 1;
  bool operator==(const BlendEntry& o) const { return path == o.path && weight == o.weight; }
};
inline void to_json(nlohmann::json& j, const BlendEntry& b) {
  j = {{"path", b.path}, {"weight", b.weight}};
}

struct DataConfig {
  std::string source = "synthetic";  // synthetic | text | tokens | indexed
  std::optional<std::string> path;
  double val_fraction = 0.1;
  SyntheticDataConfig synthetic;
  // Several datasets of data.source's kind mixed by weight (instead of data.path).
  std::optional<std::vector<BlendEntry>> blend;
  // A tokenizer.json or tiktoken file: text sources are tokenized with it; its vocabulary is
  // the data's.
  std::optional<std::string> tokenizer;
  MaskedLmDataConfig masked_lm;
};

struct CheckpointConfig {
  std::optional<std::string> dir;
  int interval = 0;
  int keep = 3;
  std::string resume = "auto";  // auto | none | <checkpoint path>
  // Shards written by a background thread while training goes on (CheckpointSaver).
  bool async = false;
};

struct LogConfig {
  int interval = 1;
  std::optional<std::string> metrics;
  std::optional<std::string> trace;
  // A greedy sample every sample_interval steps (0: never) of sample_tokens new tokens after
  // sample_prompt (text through data.tokenizer, bytes for a byte model, else comma-separated
  // ids; "" = token 0).
  int sample_interval = 0;
  std::string sample_prompt;
  int sample_tokens = 32;
};

struct CommConfig {
  double timeout_s = 300;
  // The data-parallel reduction's gradient buckets (the key parallel.bucket_mb: the communication
  // of a layout, not the layout).
  double bucket_mb = 25;
};

struct Config {
  ModelConfig model;
  // parallel.* (but bucket_mb), train.micro_batch_size and train.recompute as typed values: the
  // data-parallel size and the layer split stay open (0, empty) where the config leaves them null.
  ParallelLayout layout;
  TrainConfig train;
  OptimizerConfig optimizer;
  DataConfig data;
  CheckpointConfig checkpoint;
  LogConfig log;
  CommConfig comm;
  std::string device = "auto";  // auto | cpu | cuda

  std::string source_file;  // the config file, for error messages ("<defaults>" when none)
  // The keys `--set` gave ("parallel.tensor"), in the order given: checks made after loading
  // (launch/config/world_layout.cc) blame the command line for them, not the file.
  std::vector<std::string> command_line_keys;
  nlohmann::json resolved;  // the whole config after presets, file and overrides, as JSON
};

}  // namespace strata
