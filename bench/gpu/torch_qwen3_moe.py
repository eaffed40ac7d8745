#!/usr/bin/env python3
"""PyTorch reference for Strata's GPU throughput on Qwen3-MoE: the same model, optimizer and precision.

Architecture (transformers' Qwen3MoeForCausalLM, as models/qwen3_moe/ specifies model.arch
"qwen3_moe"): a token embedding, pre-RMSNorm blocks (input_layernorm -> causal self-attention with
q/k/v projections of an explicit --head-dim, a per-head RMSNorm on q and k (QK-norm) before the
rotary embeddings, grouped-query attention -> o_proj -> residual, post_attention_layernorm -> a
mixture of --experts SwiGLU experts of --moe-ffn, each token routed to --top-k of them: softmax of
the router's logits over every expert in fp32, the top k, divided by their sum -> residual), a
final RMSNorm and an untied LM head. The experts run as transformers runs them (--experts):
"grouped_mm", its grouped GEMM (torch._grouped_mm over the tokens sorted by expert, what
transformers' experts_implementation="grouped_mm" does, the fast path on Hopper), or "eager", its
loop over the experts hit (index, two GEMMs, index_add). The load-balancing loss
(load_balancing_loss_func: E · Σ_e f_e · P_e over every layer's routing) times
--router-aux-loss-coef is added to the objective, as Strata and transformers'
output_router_logits do. Initialisation as Strata's: every weight N(0, 0.02), norm weights 1.

Training step: torch_common.time_training's (bf16 autocast with fp32 master weights, fused AdamW,
clipping at 1.0, random tokens, a device synchronisation after each step).

FLOPs: Strata's model FLOPs (models/transformer/description.cc with moe_work.cc): per token and
layer 2·(C·(NH + 2·KVH)·HD + NH·HD·C) + 4·S·NH·HD for attention, 2·C·E for the router and
k · 2·C·3·F for the active experts, plus 2·C·V for the head, times 3 for forward and backward,
times the tokens of an iteration: active parameters only, as Megatron-Core reports MoE MFU.

Prints one JSON line per run (--compile 0, 1 or 0,1), in torch_llama.py's format (summarize.py
reads it). CPU smoke test:
  python3 bench/gpu/torch_qwen3_moe.py --layers 2 --hidden 64 --heads 4 --kv-heads 2 \\
      --head-dim 16 --experts 8 --top-k 2 --moe-ffn 32 --seq 32 --vocab 256 --micro-batch 2 \\
      --iters 3 --compile 0 --device cpu
Equivalence with transformers' Qwen3MoeForCausalLM (tiny shapes, fp32, CPU; needs transformers):
  python3 bench/gpu/torch_qwen3_moe.py --check-hf
"""
import argparse
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_common import add_run_args, device_of, padded, run_modes, time_training
from torch_llama import RMSNorm, inverse_frequencies, rotate_half, sdpa_has_gqa


def has_grouped_mm():
    return hasattr(torch, "_grouped_mm")


class Attention(nn.Module):
    def __init__(self, c, heads, kv_heads, head_dim, eps, gqa):
        super().__init__()
        self.h, self.kv, self.hd, self.gqa = heads, kv_heads, head_dim, gqa
        self.q_proj = nn.Linear(c, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(c, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(c, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, c, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, S, self.h, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, S, self.kv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv, self.hd).transpose(1, 2)
        c, s = cos.to(q.dtype), sin.to(q.dtype)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        if self.kv != self.h and self.gqa == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            if self.kv != self.h:
                k = k.repeat_interleave(self.h // self.kv, dim=1)
                v = v.repeat_interleave(self.h // self.kv, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, S, self.h * self.hd))


class Moe(nn.Module):
    """transformers' Qwen3MoeSparseMoeBlock: Qwen3MoeTopKRouter and Qwen3MoeExperts (3-D weights)."""

    def __init__(self, c, experts, top_k, ffn, norm_topk, impl):
        super().__init__()
        self.e, self.k, self.norm_topk, self.impl = experts, top_k, norm_topk, impl
        self.gate = nn.Parameter(torch.empty(experts, c))  # the router
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * ffn, c))
        self.down_proj = nn.Parameter(torch.empty(experts, c, ffn))

    def route(self, x):
        logits = F.linear(x, self.gate)
        probs = F.softmax(logits, dtype=torch.float, dim=-1)
        top_w, top_i = torch.topk(probs, self.k, dim=-1)
        if self.norm_topk:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return probs, top_w.to(logits.dtype), top_i

    def experts_eager(self, x, top_i, top_w):
        out = torch.zeros_like(x)
        with torch.no_grad():
            mask = F.one_hot(top_i, num_classes=self.e).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            e = e[0]
            slot, tok = torch.where(mask[e])
            gate, up = F.linear(x[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[e]) * top_w[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out

    def experts_grouped(self, x, top_i, top_w):
        # The assignments sorted by expert; one grouped GEMM each way over the experts' rows.
        flat = top_i.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tok = order // self.k
        counts = torch.bincount(flat, minlength=self.e)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xs = x[tok]
        w1 = self.gate_up_proj.to(xs.dtype).transpose(1, 2)
        w2 = self.down_proj.to(xs.dtype).transpose(1, 2)
        gate, up = torch._grouped_mm(xs, w1, offs=offs).chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, w2, offs=offs)
        y = y * top_w.reshape(-1)[order, None].to(y.dtype)
        return torch.zeros_like(x).index_add_(0, tok, y.to(x.dtype))

    def forward(self, x):
        B, S, C = x.shape
        flat = x.reshape(-1, C)
        probs, top_w, top_i = self.route(flat)
        grouped = self.impl == "grouped_mm" and x.is_cuda and has_grouped_mm()
        run = self.experts_grouped if grouped else self.experts_eager
        return run(flat, top_i, top_w).reshape(B, S, C), probs, top_i


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden, a.rms_eps)
        self.self_attn = Attention(a.hidden, a.heads, a.kv_heads, a.head_dim, a.rms_eps, a.gqa)
        self.post_attention_layernorm = RMSNorm(a.hidden, a.rms_eps)
        self.mlp = Moe(a.hidden, a.experts, a.top_k, a.moe_ffn, bool(a.norm_topk_prob), a.experts_impl)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y, probs, top_i = self.mlp(self.post_attention_layernorm(x))
        return x + y, probs, top_i


class Qwen3Moe(nn.Module):
    def __init__(self, a, vocab_padded, init_std=0.02):
        super().__init__()
        self.a, self.vocab = a, a.vocab
        self.embed_tokens = nn.Embedding(vocab_padded, a.hidden)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.hidden, a.rms_eps)
        self.lm_head = nn.Linear(a.hidden, vocab_padded, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, 0.0, init_std)
        with torch.no_grad():
            self.embed_tokens.weight[a.vocab:].zero_()
            self.lm_head.weight[a.vocab:].zero_()
        freqs = torch.outer(torch.arange(a.seq, dtype=torch.float64),
                            inverse_frequencies(a.head_dim, a.rope_theta, None))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)

    def logits_and_aux(self, idx):
        S = idx.shape[1]
        x = self.embed_tokens(idx)
        probs, chosen = [], []
        for block in self.layers:
            x, p, i = block(x, self.cos[:S], self.sin[:S])
            probs.append(p)
            chosen.append(i)
        logits = self.lm_head(self.norm(x))[..., : self.vocab]
        # transformers' load_balancing_loss_func over every layer's routing (no padding mask):
        # f_e the fraction of assignments to e, P_e its mean probability, over layers and tokens.
        p = torch.cat(probs, 0)  # (layers · tokens, E)
        tokens_per_expert = F.one_hot(torch.cat(chosen, 0), self.a.experts).float().mean(0)
        aux = self.a.experts * torch.sum(tokens_per_expert * p.mean(0).unsqueeze(0))
        return logits, aux

    def forward(self, idx, targets):
        logits, aux = self.logits_and_aux(idx)
        loss = F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))
        return loss + self.a.router_aux_loss_coef * aux


def model_flops_per_iter(a):
    """Strata's model FLOPs for a mixture (active experts; description.cc, moe_work.cc)."""
    c, hd, s = a.hidden, a.head_dim, a.seq
    attn = 2.0 * (c * (a.heads + 2 * a.kv_heads) * hd + a.heads * hd * c) + 4.0 * s * a.heads * hd
    moe = 2.0 * c * a.experts + a.top_k * 2.0 * c * 3 * a.moe_ffn
    return 3.0 * (a.layers * (attn + moe) + 2.0 * c * a.vocab) * a.global_batch * s


def run(args, compiled, device):
    torch.manual_seed(args.seed)
    vp = padded(args.vocab, args.pad_vocab)
    model = Qwen3Moe(args, vp).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    t = time_training(args, model, device, compiled, args.vocab)
    step_s = t["step_s"]
    tflops = model_flops_per_iter(args) / step_s / 1e12
    grouped = args.experts_impl == "grouped_mm" and device.type == "cuda" and has_grouped_mm()
    out = {
        "impl": "torch.compile" if compiled else "torch-eager",
        "label": args.label or f"qwen3-moe-l{args.layers}-h{args.hidden}-s{args.seq}",
        "compile": int(compiled), "arch": "qwen3_moe",
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
        "kv_heads": args.kv_heads, "head_dim": args.head_dim, "experts": args.experts,
        "top_k": args.top_k, "moe_ffn": args.moe_ffn, "seq": args.seq, "vocab": args.vocab,
        "vocab_padded": vp, "experts_impl": "grouped_mm" if grouped else "eager",
        "micro_batch": args.micro_batch, "global_batch": args.global_batch,
        "precision": args.precision, "params": n_params, "warmup": args.warmup,
        "iters": args.iters, "step_ms": step_s * 1e3, "step_ms_min": t["step_s_min"] * 1e3,
        "tokens_per_s": args.global_batch * args.seq / step_s, "tflops_per_gpu": tflops,
        "mfu": tflops / args.peak_tflops, "peak_tflops": args.peak_tflops,
        "first_step_s": t["first_s"], "mem_peak_bytes": t["mem_peak_bytes"],
        "loss_first": t["losses"][0], "loss_last": t["losses"][-1],
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
        "torch": torch.__version__,
    }
    print(json.dumps(out), flush=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def check_hf(args, tol=1e-4):
    """This model against transformers.Qwen3MoeForCausalLM with the same weights, fp32 on the
    CPU: logits, and the loss with output_router_logits (language model + coef · balancing loss).
    One JSON line; exit status 1 when a difference exceeds tol."""
    import transformers
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    for k, v in dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2,
                     moe_ffn=32, seq=40, vocab=300, rms_eps=1e-6, rope_theta=1e6,
                     norm_topk_prob=1, router_aux_loss_coef=0.01, gqa="repeat",
                     experts_impl="eager").items():
        setattr(args, k, v)
    torch.manual_seed(0)
    ours = Qwen3Moe(args, padded(args.vocab, 128), init_std=0.1)
    with torch.no_grad():
        for p in ours.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    cfg = Qwen3MoeConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=96,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                         num_experts=args.experts, num_experts_per_tok=args.top_k,
                         moe_intermediate_size=args.moe_ffn, norm_topk_prob=True,
                         router_aux_loss_coef=args.router_aux_loss_coef,
                         max_position_embeddings=4096, rms_norm_eps=args.rms_eps,
                         rope_theta=args.rope_theta, tie_word_embeddings=False,
                         decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False)
    hf = Qwen3MoeForCausalLM(cfg).eval()
    V = args.vocab
    sd = {"model.embed_tokens.weight": ours.embed_tokens.weight[:V],
          "model.norm.weight": ours.norm.weight, "lm_head.weight": ours.lm_head.weight[:V]}
    for i, blk in enumerate(ours.layers):
        p = f"model.layers.{i}."
        at, m = blk.self_attn, blk.mlp
        sd.update({p + "input_layernorm.weight": blk.input_layernorm.weight,
                   p + "post_attention_layernorm.weight": blk.post_attention_layernorm.weight,
                   p + "self_attn.q_proj.weight": at.q_proj.weight,
                   p + "self_attn.k_proj.weight": at.k_proj.weight,
                   p + "self_attn.v_proj.weight": at.v_proj.weight,
                   p + "self_attn.o_proj.weight": at.o_proj.weight,
                   p + "self_attn.q_norm.weight": at.q_norm.weight,
                   p + "self_attn.k_norm.weight": at.k_norm.weight,
                   p + "mlp.gate.weight": m.gate,
                   p + "mlp.experts.gate_up_proj": m.gate_up_proj,
                   p + "mlp.experts.down_proj": m.down_proj})
    sd = {k: t.detach().clone() for k, t in sd.items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    x = torch.randint(0, V, (3, args.seq))
    with torch.no_grad():
        a, aux = ours.logits_and_aux(x)
        # transformers shifts the labels itself (labels = the inputs): the loss of positions
        # 0 … S−2 plus coef · its balancing loss.
        lm = F.cross_entropy(a[:, :-1].reshape(-1, V).float(), x[:, 1:].reshape(-1))
        got_total = lm + args.router_aux_loss_coef * aux
        o = hf(input_ids=x, labels=x, output_router_logits=True)
        b, want_total = o.logits, o.loss
    diff = (a - b).abs().max().item()
    ldiff = abs(got_total.item() - want_total.item())
    adiff = abs(aux.item() - o.aux_loss.item())
    ok = diff <= tol and ldiff <= tol and adiff <= tol
    print(json.dumps({"check": "hf", "arch": "qwen3_moe", "layers": args.layers,
                      "experts": args.experts, "top_k": args.top_k,
                      "logits_max_abs": a.abs().max().item(), "logits_max_abs_diff": diff,
                      "aux_loss": aux.item(), "aux_loss_abs_diff": adiff,
                      "loss": got_total.item(),
                      "loss_abs_diff": ldiff, "tol": tol, "ok": ok,
                      "transformers": transformers.__version__, "torch": torch.__version__}),
          flush=True)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Defaults: Qwen3-30B-A3B (configs/models/qwen3-30b-a3b.json) cut to 4 layers, which fits one
    # H100 with fp32 master weights and AdamW (configs/bench/qwen3-30b-a3b-4l-gpu.json).
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--moe-ffn", type=int, default=768, help="each expert's width")
    ap.add_argument("--norm-topk-prob", type=int, choices=[0, 1], default=1)
    ap.add_argument("--router-aux-loss-coef", type=float, default=0.001)
    ap.add_argument("--experts-impl", choices=["grouped_mm", "eager"], default="grouped_mm",
                    help="transformers' experts implementation (grouped_mm falls back to eager "
                         "where torch has no _grouped_mm or on the CPU)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--pad-vocab", type=int, default=128)
    ap.add_argument("--rope-theta", type=float, default=1000000.0)
    ap.add_argument("--rms-eps", type=float, default=1e-6)
    ap.add_argument("--gqa", choices=["auto", "sdpa", "repeat"], default="auto")
    add_run_args(ap, micro_batch=2, iters=10, warmup=3, lr=3e-4)
    ap.add_argument("--check-hf", action="store_true",
                    help="only compare with transformers.Qwen3MoeForCausalLM (tiny, fp32, CPU)")
    args = ap.parse_args()
    if args.gqa == "auto":
        args.gqa = "sdpa" if sdpa_has_gqa() else "repeat"
    if args.check_hf:
        sys.exit(check_hf(args))
    if args.global_batch is None:
        args.global_batch = args.micro_batch
    if args.heads % args.kv_heads or args.head_dim % 2:
        sys.exit("--heads must be a multiple of --kv-heads, --head-dim even")
    run_modes(args, run, device_of(args))


if __name__ == "__main__":
    main()
