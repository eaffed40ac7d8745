#!/usr/bin/env python3
"""Generate tests/golden/generate/: two random tiny Hugging Face models and transformers' greedy
generations from them, the outside reference for `strata generate` (tests/mpi_test_generate.cc).

    /path/to/venv/bin/python tests/golden/generate/make_generate_fixtures.py

Writes (tests/golden/README.md):
  hf_gpt2_tiny/   GPT2LMHeadModel: 2 layers, n_embd 64, 4 heads, n_positions 64, vocab 97, tied
  hf_llama_tiny/  LlamaForCausalLM: 2 layers, hidden 64, 4 heads, 2 kv heads, intermediate 128,
                  vocab 97, max_position_embeddings 64, rope_theta 10000, untied
  greedy.json     {"gpt2": [{"prompt", "max_new_tokens", "ids", "min_gap"}, ...], "llama": [...]}
                  (CASES: prompts of 1, 5, 17 tokens; four of 5 tokens with 20 new for a batch)

Each directory is what save_pretrained(safe_serialization=True) writes (config.json and
model.safetensors; generation_config.json is removed). Every parameter is drawn from a seeded
normal distribution, biases and norm weights included, with a large std (INIT_STD) so the
logits spread over several units: greedy decoding does not repeat one token and the top-2 logit
gap stays well above float32 rounding at every generated step (checked: > MIN_GAP, the smallest
printed and stored per case). The tensors are stored as bfloat16 to keep the files small; the
generations are computed in float32 from the model reloaded from disk in float32, so they are the
float32 computation on exactly the stored weights (bf16 reads as f32 exactly).

bos/eos/pad token ids are None in config.json: generation never stops early, every case yields
exactly max_new_tokens tokens. Each case is checked to give the same tokens with use_cache=False.

Needs torch and transformers; CI never runs this script.
"""
import json
import os
import shutil

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
V, S = 97, 64
INIT_STD = 0.3
MIN_GAP = 1e-3
SEED = 1234
# (prompt length, max_new_tokens): 1, 8, 40 new tokens and one case filling all S positions.
# Prompts are named by their length; "5b".."5d" are three more of 5 tokens, which with "5" make a
# batch of equal-length prompts (20 new tokens each) that generate runs as one batch of 4.
CASES = [("1", 1), ("1", 8), ("1", 40), ("5", 1), ("5", 8), ("5", 40), ("17", 1), ("17", 8),
         ("17", 40), ("17", S - 17), ("5", 20), ("5b", 20), ("5c", 20), ("5d", 20)]


def prompts():
    g = torch.Generator().manual_seed(SEED + 17)
    out = {str(n): torch.randint(0, V, (n,), generator=g).tolist() for n in (1, 5, 17)}
    g = torch.Generator().manual_seed(SEED + 5)
    out.update({k: torch.randint(0, V, (5,), generator=g).tolist() for k in ("5b", "5c", "5d")})
    return out


def randomize(model, seed):
    """Every parameter ~ N(0, INIT_STD²), except biases ~ N(0, 0.1²) and norm weights 1 + N(0, 0.1²)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "ln_" in name or "norm" in name:
                p.copy_(1 + 0.1 * noise if name.endswith("weight") else 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(INIT_STD * noise)


def gpt2():
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=S, vocab_size=V,
                     tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
                     pad_token_id=None, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     initializer_range=INIT_STD)
    return GPT2LMHeadModel(cfg)


def llama():
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, vocab_size=V,
                      max_position_embeddings=S, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      initializer_range=INIT_STD, attn_implementation="eager")
    return LlamaForCausalLM(cfg)


def top2_gaps(scores):
    gaps = []
    for s in scores:  # one (1, V) tensor of logits per generated step
        top = torch.topk(s[0].double(), 2).values
        gaps.append(float(top[0] - top[1]))
    return gaps


def build(name, make, cls, seed):
    out = os.path.join(HERE, name)
    torch.manual_seed(seed)
    model = make()
    randomize(model, seed)
    if os.path.exists(out):
        shutil.rmtree(out)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    gen_cfg = os.path.join(out, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    # The float32 model on exactly the stored weights.
    model = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    model.generation_config.bos_token_id = None
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"model.safetensors {size} bytes")
    return model


def run_cases(model, label):
    cases = []
    ps = prompts()
    for key, new in CASES:
        n = len(ps[key])
        assert n + new <= S
        ids = torch.tensor([ps[key]], dtype=torch.long)
        # attention_mask given: without it generate would infer one from pad_token_id and mask
        # out every prompt token equal to it (an earlier version of this fixture was wrong so).
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                  do_sample=False, num_beams=1, pad_token_id=0, output_scores=True,
                  return_dict_in_generate=True)
        with torch.no_grad():
            a = model.generate(ids, use_cache=True, **kw)
            b = model.generate(ids, use_cache=False, **kw)
        got = a.sequences[0, n:].tolist()
        assert len(got) == new, (label, n, new, len(got))
        assert got == b.sequences[0, n:].tolist(), (label, n, new, "use_cache=False differs")
        with torch.no_grad():
            first = int(model(ids).logits[0, -1].argmax())
        assert got[0] == first, (label, n, new, "generate's first token differs from the forward's")
        gaps = top2_gaps(a.scores)
        assert min(gaps) > MIN_GAP, (label, n, new, min(gaps))
        if new >= 8:
            assert len(set(got)) > 1, (label, n, new, "degenerate: one token repeated")
        print(f"  {label} prompt {n:2d} new {new:2d}: {len(set(got)):2d} distinct, "
              f"min top-2 gap {min(gaps):.4f}")
        cases.append({"prompt": ps[key], "max_new_tokens": new, "ids": got,
                      "min_gap": round(min(gaps), 6)})
    return cases


def main():
    torch.set_num_threads(1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    result = {}
    result["gpt2"] = run_cases(build("hf_gpt2_tiny", gpt2, GPT2LMHeadModel, SEED), "gpt2")
    result["llama"] = run_cases(build("hf_llama_tiny", llama, LlamaForCausalLM, SEED + 2), "llama")
    smallest = min(c["min_gap"] for cs in result.values() for c in cs)
    print(f"smallest top-2 logit gap over every generated step: {smallest:.6f}")
    with open(os.path.join(HERE, "greedy.json"), "w") as f:
        f.write("{\n")
        for k, (arch, cs) in enumerate(result.items()):
            f.write(f'  "{arch}": [\n')
            f.write(",\n".join("    " + json.dumps(c) for c in cs))
            f.write("\n  ]" + ("," if k + 1 < len(result) else "") + "\n")
        f.write("}\n")


if __name__ == "__main__":
    main()
