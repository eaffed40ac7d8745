// The "llama" entry of the model registry (models/registry.h).
#include "models/llama/llama.h"
#include "models/registry.h"
#include "runtime/base/error.h"

namespace strata {

DecoderShape llama_shape(const ModelConfig& m) {
  DecoderShape s;
  s.arch = "llama";
  s.L = m.num_layers;
  s.C = m.hidden_size;
  s.NH = m.num_heads;
  s.KVH = m.kv_heads();
  s.F = m.ffn_hidden_size;
  s.S = m.seq_len;
  s.V = m.vocab_size;
  s.tie = m.tie_embeddings;
  s.init_std = m.init_std;
  s.scaled_proj_init = false;
  s.norm = NormKind::kRMSNorm;
  s.norm_eps = m.rms_norm_eps;
  s.learned_positions = false;
  s.rope_theta = m.rope_theta;
  s.rope_scaling = m.rope_scaling;
  s.mlp = MlpActivation::kSwiGlu;
  s.bias = false;
  s.names = {"embed_tokens",
             "",
             "layers.",
             "input_layernorm",
             "self_attn.qkv_proj",
             "self_attn.o_proj",
             "post_attention_layernorm",
             "mlp.gate_up_proj",
             "mlp.down_proj",
             "norm",
             "lm_head"};
  return s;
}

ArchSpec llama_arch() {
  ArchSpec a;
  a.name = "llama";
  a.describe = [](const ModelConfig& m) { return describe_decoder(llama_shape(m)); };
  a.build = [](const ModelConfig& m, const ModelOptions& o, Backend& be) -> std::unique_ptr<Model> {
    return std::make_unique<DecoderModel>(llama_shape(m), o, be);
  };
  a.layout = [](const ModelConfig& m, int t, int r, bool sp,
                const std::vector<ModelPiece>& pieces) {
    return DecoderModel::layout(llama_shape(m), t, r, sp, pieces);
  };
  a.hf = HfAdapter{"LlamaForCausalLM", llama_to_hf, llama_from_hf, llama_hf_config,
                   llama_check_hf_config};
  a.hf.hf_order = llama_hf_order;
  a.hf.canonical_name = llama_canonical_name;
  // Rotary embeddings rotate pairs (i, i + head_size/2): the head size must be even.
  a.validate = [](const ModelConfig& m, int, const std::string& file) {
    const int head_size = m.hidden_size / m.num_heads;
    if (head_size % 2 != 0)
      throw InputError(file, "model.hidden_size",
                       "an even head size for rotary embeddings: hidden_size " +
                           std::to_string(m.hidden_size) + " / num_heads " +
                           std::to_string(m.num_heads) + " = " + std::to_string(head_size));
    refuse_encoder_keys(m, file);
  };
  a.hf.hf_model_type = "llama";
  a.hf.model_config = llama_model_config_from_hf;
  return a;
}

}  // namespace strata
