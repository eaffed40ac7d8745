// mistral.h — Mistral (the "mistral" architecture, MistralForCausalLM: Mistral 7B v0.2 and v0.3,
// Mistral NeMo): Llama's block (models/llama/llama.h) under Mistral's Hugging Face class and
// model_type. Mistral 7B v0.1's sliding window of 4096 is not implemented: a config.json whose
// sliding_window is below model.seq_len is refused naming the key (null, as v0.2 on write it, or
// a window at least the sequence changes nothing).
//
// Thread-safety: pure functions.
#pragma once

namespace strata {

struct ArchSpec;
ArchSpec mistral_arch();

}  // namespace strata
