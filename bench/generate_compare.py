#!/usr/bin/env python3
"""Decode speed of `strata generate`'s cache beside transformers' generate, same model, same threads.

Builds a random GPT2LMHeadModel (or --arch llama: LlamaForCausalLM) of the given shape with
transformers, saves it, then times (1) transformers' greedy generate of --new tokens from one
prompt token with the cache (use_cache=True), torch.set_num_threads(--threads), and (2)
build/bench/bench_generate --hf DIR on the same directory and threads (per-token times at token 16
and the last, and tokens/s). Prints both and their ratio; never passes or fails.

  /work/venv-hf/bin/python bench/generate_compare.py [--arch gpt2|llama] [--threads 1] [--new 512]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--new", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bench", default="build/bench/bench_generate")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    if a.arch == "gpt2":
        cfg = transformers.GPT2Config(n_layer=a.layers, n_embd=a.hidden, n_head=a.heads,
                                      n_positions=1024, vocab_size=a.vocab)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(num_hidden_layers=a.layers, hidden_size=a.hidden,
                                       num_attention_heads=a.heads,
                                       num_key_value_heads=max(1, a.heads // 4),
                                       intermediate_size=4 * a.hidden, vocab_size=a.vocab,
                                       max_position_embeddings=1024)
        model = transformers.LlamaForCausalLM(cfg)
    model.eval()
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        ids = torch.tensor([[1]])
        with torch.no_grad():
            model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)  # warm-up
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False,
                                 use_cache=True)
            hf_s = time.perf_counter() - t0
        hf_tps = (out.shape[1] - 1) / hf_s
        r = subprocess.run([a.bench, "--hf", d, "--new", str(a.new), "--threads", str(a.threads)],
                           capture_output=True, text=True, check=True)
    print(r.stdout.strip())
    strata_tps = float(re.search(r"decode ([0-9.]+) tokens/s", r.stdout).group(1))
    print(f"transformers {transformers.__version__} generate (torch {torch.__version__}, "
          f"{a.threads} thread(s)): {hf_tps:.1f} tokens/s")
    print(f"strata / transformers: {strata_tps / hf_tps:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
