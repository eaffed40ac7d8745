#!/usr/bin/env python3
"""PyTorch reference for Strata's GPU throughput: the same GPT-2 model, optimizer and precision.

Architecture (as models/gpt/arch.cc specifies it): learned token + position embeddings, pre-LayerNorm blocks
(ln_1 -> causal self-attention with a fused qkv projection -> residual, ln_2 -> MLP h->4h, tanh-GELU,
4h->h -> residual), a final LayerNorm and a head tied to the token embedding. Every linear layer has
a bias. The vocabulary is padded to a multiple of --pad-vocab (128, as Strata does for t=1) and the
padding is left out of the loss. Weights decay, biases/LayerNorm don't (as Strata).

Training step: bf16 autocast with fp32 master weights, causal attention through
torch.nn.functional.scaled_dot_product_attention (flash on Hopper), gradient clipping at 1.0, fused
AdamW (lr 3e-4, betas (0.9, 0.95), weight decay 0.1), random tokens. The step is timed end to end
with a device synchronisation after it (Strata reports the loss every step, so it syncs too).

FLOPs: Megatron's model FLOPs per iteration, 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) with V the
unpadded vocabulary and B the sequences per iteration — the formula Strata's tflops_per_gpu uses
(models/transformer/description.cc flops_per_iteration). MFU = achieved model FLOP/s ÷ --peak-tflops (989: H100/H200
SXM dense bf16).

Prints one JSON line per run (--compile 0, 1, or both with --compile 0,1). CPU smoke test:
  python3 bench/gpu/torch_gpt.py --layers 2 --hidden 64 --heads 4 --seq 32 --vocab 256 \\
      --micro-batch 2 --iters 3 --compile 0 --device cpu
"""
import argparse
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_common import add_run_args, device_of, padded, run_modes, time_training


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(h)
        self.c_attn = nn.Linear(h, 3 * h)
        self.c_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h)
        self.c_fc = nn.Linear(h, 4 * h)
        self.mlp_proj = nn.Linear(4 * h, h)

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        # (B, heads, S, head_dim) for SDPA.
        q, k, v = (t.view(B, S, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, S, C))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, layers, h, heads, seq, vocab, vocab_padded, init_std=0.02):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab_padded, h)
        self.wpe = nn.Embedding(seq, h)
        self.h = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        # GPT-2 init, as Strata: N(0, 0.02), residual projections scaled by 1/sqrt(2·layers),
        # zero biases, LayerNorm (1, 0), padded embedding rows zero.
        proj_std = init_std / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, proj_std)
            else:
                nn.init.normal_(p, 0.0, init_std)
        with torch.no_grad():
            self.wte.weight[vocab:].zero_()

    def forward(self, idx, targets):
        S = idx.shape[1]
        pos = torch.arange(S, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        # Padding columns are not part of the model's distribution (Strata: "never in the loss").
        logits = logits[..., : self.vocab]
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))


def model_flops_per_iter(B, s, l, h, V):
    return 72.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (12.0 * l * h))


def run(args, compiled, device):
    torch.manual_seed(args.seed)
    vp = padded(args.vocab, args.pad_vocab)
    model = GPT(args.layers, args.hidden, args.heads, args.seq, args.vocab, vp).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    t = time_training(args, model, device, compiled, args.vocab)
    losses, first_s = t["losses"], t["first_s"]
    step_s = t["step_s"]
    tokens = args.global_batch * args.seq
    flops = model_flops_per_iter(args.global_batch, args.seq, args.layers, args.hidden, args.vocab)
    tflops = flops / step_s / 1e12
    out = {
        "impl": "torch.compile" if compiled else "torch-eager",
        "label": args.label or f"l{args.layers}-h{args.hidden}-s{args.seq}",
        "compile": int(compiled),
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "seq": args.seq,
        "vocab": args.vocab, "vocab_padded": vp, "micro_batch": args.micro_batch,
        "global_batch": args.global_batch, "precision": args.precision,
        "params": n_params, "warmup": args.warmup, "iters": args.iters,
        "step_ms": step_s * 1e3, "step_ms_min": t["step_s_min"] * 1e3,
        "tokens_per_s": tokens / step_s, "tflops_per_gpu": tflops,
        "mfu": tflops / args.peak_tflops, "peak_tflops": args.peak_tflops,
        "first_step_s": first_s,
        "mem_peak_bytes": t["mem_peak_bytes"],
        "loss_first": losses[0], "loss_last": losses[-1],
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
        "torch": torch.__version__,
    }
    print(json.dumps(out), flush=True)
    # Free this run's model before the next one (eager then compiled share the process).
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--pad-vocab", type=int, default=128, help="pad the embedding rows to this multiple")
    add_run_args(ap, micro_batch=16, iters=20, warmup=5, lr=3e-4)
    args = ap.parse_args()
    if args.global_batch is None:
        args.global_batch = args.micro_batch
    if args.hidden % args.heads:
        sys.exit("--hidden must be divisible by --heads")

    run_modes(args, run, device_of(args))


if __name__ == "__main__":
    main()
