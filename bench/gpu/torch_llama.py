#!/usr/bin/env python3
"""PyTorch reference for Strata's GPU throughput on Llama: the same model, optimizer and precision.

Architecture (as models/llama/arch.cc specifies model.arch "llama"): a token embedding,
pre-RMSNorm blocks (input_layernorm -> causal self-attention with a fused [q; k; v] projection,
grouped-query attention with --kv-heads key/value heads and rotary embeddings on q and k ->
o_proj -> residual, post_attention_layernorm -> SwiGLU MLP with a fused [gate; up] projection,
silu(gate)·up, down_proj -> residual), a final RMSNorm and the LM head, untied unless --tie 1
(Llama 3.2 1B/3B tie it). No biases anywhere. RMSNorm as Hugging Face's LlamaRMSNorm (in fp32,
eps --rms-eps); rotary embeddings in Hugging Face's rotate_half convention (pairs (i, i + HS/2)),
inv_freq = theta^(-2i/HS) with Llama 3.1's rope_scaling (--rope-scaling) applied as Hugging Face's
_compute_llama3_parameters. The vocabulary is padded to a multiple of --pad-vocab (128, as Strata
does for t=1) and the padding is left out of the loss. Initialisation as Strata's llama (Hugging
Face's): every weight N(0, 0.02), RMSNorm weights 1, padded embedding rows zero. Weight decay on
matrices and embeddings, not on the norms (Strata's ParamInfo::decay).

Training step: bf16 autocast with fp32 master weights, causal attention through
torch.nn.functional.scaled_dot_product_attention (flash on Hopper) with enable_gqa=True where this
torch has it (else the key/value heads are repeated first, as Hugging Face's repeat_kv; --gqa),
gradient clipping at 1.0, fused AdamW (lr 3e-4, betas (0.9, 0.95), weight decay 0.1), random
tokens. The step is timed end to end with a device synchronisation after it (Strata reports the
loss every step, so it syncs too).

FLOPs: Strata's model FLOPs (models/transformer/description.cc flops_per_iteration), per token and
layer 2·(C·(NH + 2·KVH)·HS + C·C + 3·C·F) + 4·S·C, plus 2·C·V for the head (V unpadded), times 3
for forward and backward, times the tokens of an iteration. MFU = achieved model FLOP/s ÷
--peak-tflops (989: H100/H200 SXM dense bf16).

Prints one JSON line per run (--compile 0, 1, or both with --compile 0,1), in torch_gpt.py's
format (bench/gpu/summarize.py reads both). CPU smoke test:
  python3 bench/gpu/torch_llama.py --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 \\
      --seq 32 --vocab 256 --micro-batch 2 --iters 3 --compile 0 --device cpu
Equivalence with Hugging Face's LlamaForCausalLM (tiny shapes, fp32, CPU; needs transformers):
  python3 bench/gpu/torch_llama.py --check-hf
"""
import argparse
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_common import add_run_args, device_of, padded, run_modes, time_training

# Llama 3.2 1B's rope_scaling (configs/models/llama-3.2-1b.json): factor, low_freq_factor,
# high_freq_factor, original_max_position_embeddings.
LLAMA3_SCALING = "32,1,4,8192"


def sdpa_has_gqa():
    try:
        import inspect
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a readable signature: try it
        try:
            q = torch.zeros(1, 2, 1, 2)
            F.scaled_dot_product_attention(q, q[:, :1], q[:, :1], enable_gqa=True)
            return True
        except TypeError:
            return False


def parse_scaling(spec):
    """'none' or 'FACTOR,LOW,HIGH,ORIGINAL_MAX' -> None or a dict."""
    if spec in (None, "", "none"):
        return None
    f, lo, hi, orig = (float(x) for x in spec.split(","))
    return {"factor": f, "low_freq_factor": lo, "high_freq_factor": hi,
            "original_max_position_embeddings": orig}


def inverse_frequencies(head_size, theta, scaling):
    """inv_freq (HS/2), in float64 as Strata's rope_inverse_frequencies (models/layers/rope.cc)."""
    inv = [theta ** (-2.0 * i / head_size) for i in range(head_size // 2)]
    if scaling:
        ctx = scaling["original_max_position_embeddings"]
        lo, hi, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
        low_wavelen, high_wavelen = ctx / lo, ctx / hi
        out = []
        for f in inv:
            wavelen = 2 * math.pi / f
            if wavelen > low_wavelen:
                f = f / factor
            elif wavelen >= high_wavelen:
                smooth = (ctx / wavelen - lo) / (hi - lo)
                f = (1 - smooth) * f / factor + smooth * f
            out.append(f)
        inv = out
    return torch.tensor(inv, dtype=torch.float64)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: normalised in fp32, cast back, times the weight."""

    def __init__(self, c, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Block(nn.Module):
    def __init__(self, c, heads, kv_heads, ffn, eps, gqa):
        super().__init__()
        self.heads, self.kv_heads, self.hs = heads, kv_heads, c // heads
        self.gqa = gqa  # "sdpa": enable_gqa=True; "repeat": repeat the k/v heads first
        self.input_layernorm = RMSNorm(c, eps)
        self.qkv_proj = nn.Linear(c, (heads + 2 * kv_heads) * self.hs, bias=False)
        self.o_proj = nn.Linear(c, c, bias=False)
        self.post_attention_layernorm = RMSNorm(c, eps)
        self.gate_up_proj = nn.Linear(c, 2 * ffn, bias=False)
        self.down_proj = nn.Linear(ffn, c, bias=False)

    def forward(self, x, cos, sin):
        B, S, C = x.shape
        H, KV, HS = self.heads, self.kv_heads, self.hs
        q, k, v = self.qkv_proj(self.input_layernorm(x)).split([H * HS, KV * HS, KV * HS], dim=2)
        # (B, heads, S, HS) for SDPA.
        q = q.view(B, S, H, HS).transpose(1, 2)
        k = k.view(B, S, KV, HS).transpose(1, 2)
        v = v.view(B, S, KV, HS).transpose(1, 2)
        # Rotary embeddings as Hugging Face's apply_rotary_pos_emb (in q's dtype).
        c, s = cos.to(q.dtype), sin.to(q.dtype)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        if KV != H and self.gqa == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            if KV != H:  # query head j reads key/value head j // (H / KV), as repeat_kv
                k = k.repeat_interleave(H // KV, dim=1)
                v = v.repeat_interleave(H // KV, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, S, C))
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, layers, c, heads, kv_heads, ffn, seq, vocab, vocab_padded, tie, theta,
                 scaling, eps, gqa, init_std=0.02):
        super().__init__()
        self.vocab, self.tie = vocab, tie
        self.embed_tokens = nn.Embedding(vocab_padded, c)
        self.layers = nn.ModuleList(Block(c, heads, kv_heads, ffn, eps, gqa) for _ in range(layers))
        self.norm = RMSNorm(c, eps)
        self.lm_head = None if tie else nn.Linear(c, vocab_padded, bias=False)
        # Strata's llama init (Hugging Face's): weights N(0, init_std), norm weights 1, padded
        # rows zero.
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, 0.0, init_std)
        with torch.no_grad():
            self.embed_tokens.weight[vocab:].zero_()
            if self.lm_head is not None:
                self.lm_head.weight[vocab:].zero_()
        # The (S, HS) cos/sin tables, in fp32 (Strata: an f32 table built in double).
        hs = c // heads
        freqs = torch.outer(torch.arange(seq, dtype=torch.float64),
                            inverse_frequencies(hs, theta, scaling))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)

    def logits(self, idx):
        S = idx.shape[1]
        cos, sin = self.cos[:S], self.sin[:S]
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x, cos, sin)
        w = self.embed_tokens.weight if self.tie else self.lm_head.weight
        # Padding columns are not part of the model's distribution (Strata: "never in the loss").
        return F.linear(self.norm(x), w)[..., : self.vocab]

    def forward(self, idx, targets):
        logits = self.logits(idx)
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))


def model_flops_per_iter(sequences, s, l, c, heads, kv_heads, ffn, vocab):
    """Strata's model FLOPs (models/transformer/description.cc flops_per_iteration, SwiGLU)."""
    hs = c // heads
    per_token_layer = 2.0 * (c * (heads + 2 * kv_heads) * hs + c * c + 3.0 * c * ffn) + 4.0 * s * c
    per_token_fwd = l * per_token_layer + 2.0 * c * vocab
    return 3.0 * per_token_fwd * sequences * s


def build(args, device):
    return Llama(args.layers, args.hidden, args.heads, args.kv_heads, args.ffn, args.seq,
                 args.vocab, padded(args.vocab, args.pad_vocab), bool(args.tie), args.rope_theta,
                 parse_scaling(args.rope_scaling), args.rms_eps, args.gqa).to(device)


def run(args, compiled, device):
    torch.manual_seed(args.seed)
    vp = padded(args.vocab, args.pad_vocab)
    model = build(args, device)
    n_params = sum(p.numel() for p in model.parameters())
    t = time_training(args, model, device, compiled, args.vocab)
    step_s = t["step_s"]
    tokens = args.global_batch * args.seq
    flops = model_flops_per_iter(args.global_batch, args.seq, args.layers, args.hidden,
                                 args.heads, args.kv_heads, args.ffn, args.vocab)
    tflops = flops / step_s / 1e12
    out = {
        "impl": "torch.compile" if compiled else "torch-eager",
        "label": args.label or f"llama-l{args.layers}-h{args.hidden}-s{args.seq}",
        "compile": int(compiled), "arch": "llama",
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
        "kv_heads": args.kv_heads, "ffn": args.ffn, "seq": args.seq,
        "vocab": args.vocab, "vocab_padded": vp, "tie": int(bool(args.tie)),
        "rope_theta": args.rope_theta, "rope_scaling": args.rope_scaling,
        "gqa": args.gqa if args.kv_heads != args.heads else "none",
        "micro_batch": args.micro_batch,
        "global_batch": args.global_batch, "precision": args.precision,
        "params": n_params, "warmup": args.warmup, "iters": args.iters,
        "step_ms": step_s * 1e3, "step_ms_min": t["step_s_min"] * 1e3,
        "tokens_per_s": tokens / step_s, "tflops_per_gpu": tflops,
        "mfu": tflops / args.peak_tflops, "peak_tflops": args.peak_tflops,
        "first_step_s": t["first_s"],
        "mem_peak_bytes": t["mem_peak_bytes"],
        "loss_first": t["losses"][0], "loss_last": t["losses"][-1],
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
        "torch": torch.__version__,
    }
    print(json.dumps(out), flush=True)
    # Free this run's model before the next one (eager then compiled share the process).
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def check_hf(tol=1e-4):
    """This model against transformers.LlamaForCausalLM with the same weights, fp32 on the CPU:
    logits and loss, tied and untied, GQA and llama3 rope scaling, an unpadded vocabulary (300,
    padded to 384 here). One JSON line per case; exit status 1 when a difference exceeds tol."""
    from transformers import LlamaConfig, LlamaForCausalLM

    L, C, H, KV, Fh, S, V, B = 2, 64, 4, 2, 160, 48, 300, 3
    theta, eps = 500000.0, 1e-5
    ok = True
    # Llama 3.2's scaling, and one whose blend covers the check's 48 positions (with the
    # preset's, only the slowest frequencies change, by angles under 0.1 rad at these positions).
    cases = [(tie, gqa, spec) for spec in (LLAMA3_SCALING, "4,1,4,32") for tie in (1, 0)
             for gqa in (["sdpa", "repeat"] if sdpa_has_gqa() else ["repeat"])]
    for tie, gqa, scaling_spec in cases:
        scaling = parse_scaling(scaling_spec)
        torch.manual_seed(0)
        # init_std 0.1: logits of a few units, so that a wrong detail shows well above fp32
        # rounding.
        ours = Llama(L, C, H, KV, Fh, S, V, padded(V, 128), bool(tie), theta, scaling, eps, gqa,
                     init_std=0.1)
        with torch.no_grad():  # random norm weights too, so that they are tested
            for name, p in ours.named_parameters():
                if p.dim() == 1:
                    p.copy_(1 + 0.1 * torch.randn_like(p))
        rope = {"rope_type": "llama3", "factor": scaling["factor"],
                "low_freq_factor": scaling["low_freq_factor"],
                "high_freq_factor": scaling["high_freq_factor"],
                "original_max_position_embeddings":
                    int(scaling["original_max_position_embeddings"])}
        cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=Fh,
                          num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=KV,
                          max_position_embeddings=131072, rms_norm_eps=eps, rope_theta=theta,
                          rope_scaling=dict(rope, rope_theta=theta),
                          tie_word_embeddings=bool(tie), attention_bias=False,
                          mlp_bias=False)
        hf = LlamaForCausalLM(cfg).eval()
        sd = {"model.embed_tokens.weight": ours.embed_tokens.weight[:V],
              "model.norm.weight": ours.norm.weight}
        if not tie:
            sd["lm_head.weight"] = ours.lm_head.weight[:V]
        hs = C // H
        for i, blk in enumerate(ours.layers):
            p = f"model.layers.{i}."
            q, k, v = blk.qkv_proj.weight.split([H * hs, KV * hs, KV * hs], dim=0)
            g, u = blk.gate_up_proj.weight.chunk(2, dim=0)
            sd.update({p + "input_layernorm.weight": blk.input_layernorm.weight,
                       p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                       p + "self_attn.v_proj.weight": v,
                       p + "self_attn.o_proj.weight": blk.o_proj.weight,
                       p + "post_attention_layernorm.weight":
                           blk.post_attention_layernorm.weight,
                       p + "mlp.gate_proj.weight": g, p + "mlp.up_proj.weight": u,
                       p + "mlp.down_proj.weight": blk.down_proj.weight})
        sd = {k: t.detach().clone() for k, t in sd.items()}
        if tie:
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        missing, unexpected = hf.load_state_dict(sd, strict=False)
        missing = [m for m in missing if not (tie and m == "lm_head.weight")]
        if missing or unexpected:
            raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
        idx = torch.randint(0, V, (B, S + 1))
        with torch.no_grad():
            a = ours.logits(idx[:, :-1])
            b = hf(input_ids=idx[:, :-1]).logits
            la = ours(idx[:, :-1], idx[:, 1:])
            lb = F.cross_entropy(b.reshape(-1, V).float(), idx[:, 1:].reshape(-1))
        diff = (a - b).abs().max().item()
        ldiff = abs(la.item() - lb.item())
        good = diff <= tol and ldiff <= tol
        ok &= good
        print(json.dumps({"check": "hf", "tie": tie, "gqa": gqa, "layers": L, "hidden": C,
                          "heads": H, "kv_heads": KV, "ffn": Fh, "seq": S, "vocab": V,
                          "rope_scaling": scaling_spec, "logits_max_abs": a.abs().max().item(),
                          "logits_max_abs_diff": diff, "loss": la.item(),
                          "loss_abs_diff": ldiff, "tol": tol, "ok": good,
                          "transformers": __import__("transformers").__version__,
                          "torch": torch.__version__}), flush=True)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Defaults: Llama 3.2 1B (configs/models/llama-3.2-1b.json) at sequence length 2048.
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default --heads)")
    ap.add_argument("--ffn", type=int, default=8192, help="MLP hidden size (ffn_hidden_size)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--pad-vocab", type=int, default=128, help="pad the embedding rows to this multiple")
    ap.add_argument("--tie", type=int, choices=[0, 1], default=1,
                    help="1: the LM head is the token embedding (Llama 3.2 1B/3B); 0: its own")
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--rope-scaling", default="none",
                    help="'none' or Llama 3.1's FACTOR,LOW,HIGH,ORIGINAL_MAX (Llama 3.2 1B: "
                         + LLAMA3_SCALING + ")")
    ap.add_argument("--rms-eps", type=float, default=1e-5)
    ap.add_argument("--gqa", choices=["auto", "sdpa", "repeat"], default="auto",
                    help="grouped-query attention: SDPA's enable_gqa=True (auto: where this torch "
                         "has it) or the key/value heads repeated first")
    add_run_args(ap, micro_batch=4, iters=20, warmup=5, lr=3e-4)
    ap.add_argument("--check-hf", action="store_true",
                    help="only compare this model with transformers.LlamaForCausalLM (tiny "
                         "shapes, fp32, CPU) and exit")
    args = ap.parse_args()
    if args.check_hf:
        sys.exit(check_hf())
    if args.kv_heads is None:
        args.kv_heads = args.heads
    if args.global_batch is None:
        args.global_batch = args.micro_batch
    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        sys.exit("--hidden must be divisible by --heads into an even head size")
    if args.heads % args.kv_heads:
        sys.exit("--heads must be a multiple of --kv-heads")
    if args.gqa == "auto":
        args.gqa = "sdpa" if sdpa_has_gqa() else "repeat"

    run_modes(args, run, device_of(args))


if __name__ == "__main__":
    main()
