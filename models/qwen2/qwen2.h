// qwen2.h — the Qwen2 family (the "qwen2" architecture, Qwen2ForCausalLM: Qwen2 and Qwen2.5):
// Llama's block (models/llama/llama.h) with biases on the query, key and value projections
// (self_attn.qkv_proj.bias, rows [q_proj.bias; k_proj.bias; v_proj.bias]) and none on the output
// projection. Qwen2Config's sliding window is not implemented: a config.json with
// use_sliding_window true is refused (the released Qwen2.5 models leave it false).
//
// Thread-safety: pure functions.
#pragma once

namespace strata {

struct ArchSpec;
ArchSpec qwen2_arch();

}  // namespace strata
