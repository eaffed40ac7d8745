#!/usr/bin/env python3
"""Generate tests/golden/gpt_tiny.safetensors, the golden reference for Strata's GPT.

The fixture plays the role of llm.c's gpt2_124M_debug_state.bin for test_gpt2: a tiny GPT-2
(pre-LayerNorm, tied embeddings) with its initial weights, one batch of tokens, the logits, loss and
gradients on that batch, and a 10-step AdamW run (losses, gradient norms, learning rates, final weights).

Everything is written with plain torch ops so each detail is visible. The reference is computed in
float64 (starting from the float32 weights that are stored, upcast exactly) and stored as float32.
Gradients come from torch autograd in float64 -- the outside reference for Strata's hand-written backward.
The hand-written attention, LayerNorm, GELU and cross-entropy are cross-checked against torch.nn.functional.

The file is written by hand (safetensors_io.py: struct + json), no safetensors package and no numpy.

Usage:  python3 tests/golden/make_gpt_fixture.py [--out PATH]
"""
import argparse
import json
import math
import os
import warnings

warnings.filterwarnings("ignore", message=".*NumPy.*")  # torch warns when numpy is absent; harmless
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

# ----------------------------------------------------------------------------------------------------
# Configuration (keep in sync with tests/golden/README.md)
L, C, NH, F_HID, S, V, B = 2, 32, 4, 128, 16, 64, 4
HS = C // NH                     # head size 8
LN_EPS = 1e-5
SEED = 42
INIT_STD = 0.02
STEPS = 10
LR_MAX, MIN_LR, WARMUP_ITERS, DECAY_ITERS = 1e-2, 1e-3, 2, 10
BETA1, BETA2, ADAM_EPS, WEIGHT_DECAY, GRAD_CLIP = 0.9, 0.95, 1e-8, 0.1, 1.0

BLOCK_PARAMS = [  # (suffix, shape) in initialisation order within a block
    ("ln_1.weight", (C,)), ("ln_1.bias", (C,)),
    ("attn.c_attn.weight", (3 * C, C)), ("attn.c_attn.bias", (3 * C,)),
    ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
    ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
    ("mlp.c_fc.weight", (F_HID, C)), ("mlp.c_fc.bias", (F_HID,)),
    ("mlp.c_proj.weight", (C, F_HID)), ("mlp.c_proj.bias", (C,)),
]


def param_specs():
    """Parameter (name, shape) list in the canonical order (also the initialisation order)."""
    specs = [("wte", (V, C)), ("wpe", (S, C))]
    for i in range(L):
        specs += [(f"h.{i}.{suf}", shape) for suf, shape in BLOCK_PARAMS]
    specs += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return specs


def init_params(gen):
    """Draw every parameter, in param_specs() order, from `gen`, in float32."""
    params = {}
    resid_std = INIT_STD / math.sqrt(2 * L)
    for name, shape in param_specs():
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name == "wpe":
            p = 0.01 * z
        elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            p = 1.0 + 0.1 * z
        elif name.endswith("ln_1.bias") or name.endswith("ln_2.bias") or name == "ln_f.bias":
            p = 0.1 * z
        elif name.endswith("attn.c_proj.weight") or name.endswith("mlp.c_proj.weight"):
            p = resid_std * z
        else:  # wte, c_attn / c_fc weights, every linear bias
            p = INIT_STD * z
        params[name] = p.contiguous()
    return params


# ----------------------------------------------------------------------------------------------------
# The model, by hand

def layernorm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)          # biased variance
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def linear(x, w, b):  # nn.Linear layout: w is (out, in)
    return x @ w.t() + b


def attention_core(q, k, v):
    """q, k, v: (B, NH, S, HS). Causal softmax attention scaled by 1/sqrt(HS)."""
    s = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf"))
    att = torch.softmax(att, dim=-1)
    return att @ v


def split_heads(t):  # (B, S, C) -> (B, NH, S, HS); head h owns channels [h*HS, (h+1)*HS)
    b, s, _ = t.shape
    return t.view(b, s, NH, HS).transpose(1, 2)


def attn_qkv(x, p, pre):
    qkv = linear(x, p[pre + "attn.c_attn.weight"], p[pre + "attn.c_attn.bias"])  # (B, S, 3C)
    q, k, v = qkv.split(C, dim=-1)        # rows [0,C) query, [C,2C) key, [2C,3C) value
    return split_heads(q), split_heads(k), split_heads(v)


def attn(x, p, pre):
    q, k, v = attn_qkv(x, p, pre)
    y = attention_core(q, k, v)                            # (B, NH, S, HS)
    b, _, s, _ = y.shape
    y = y.transpose(1, 2).contiguous().view(b, s, C)       # heads concatenated in head order
    return linear(y, p[pre + "attn.c_proj.weight"], p[pre + "attn.c_proj.bias"])


def mlp(x, p, pre):
    h = gelu_tanh(linear(x, p[pre + "mlp.c_fc.weight"], p[pre + "mlp.c_fc.bias"]))
    return linear(h, p[pre + "mlp.c_proj.weight"], p[pre + "mlp.c_proj.bias"])


def cross_entropy_mean(logits, targets):
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return nll.mean()


def forward(p, tokens):
    """tokens: (B, S+1) int. Returns logits (B, S, V) and mean cross-entropy loss (scalar)."""
    inp, tgt = tokens[:, :S].long(), tokens[:, 1:].long()
    x = p["wte"][inp] + p["wpe"][:S]
    for i in range(L):
        pre = f"h.{i}."
        a = x + attn(layernorm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"]), p, pre)
        x = a + mlp(layernorm(a, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"]), p, pre)
    x = layernorm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = x @ p["wte"].t()                               # tied output projection, no bias
    return logits, cross_entropy_mean(logits, tgt)


def loss_and_grads(p, tokens):
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in p.items()}
    logits, loss = forward(leaves, tokens)
    grads = torch.autograd.grad(loss, [leaves[n] for n in p])
    return logits.detach(), loss.detach(), {n: g.detach() for n, g in zip(p, grads)}


# ----------------------------------------------------------------------------------------------------
# AdamW, by hand

def lr_at(it):  # it is 1-based
    if it <= WARMUP_ITERS:
        return LR_MAX * it / WARMUP_ITERS
    ratio = (it - WARMUP_ITERS) / (DECAY_ITERS - WARMUP_ITERS)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR_MAX - MIN_LR)


def train(p0, step_tokens):
    """Runs len(step_tokens) AdamW steps from p0 (dtype of p0). Returns per-step records + final params.

    Note: the key rows of c_attn.bias ([C, 2C)) have an exactly-zero true gradient (softmax is invariant
    to adding q.b_k to a whole row), so in float64 they never move; a float32 implementation sees ~1e-9
    rounding noise there, which Adam normalises into updates of up to ~lr/10 per step.
    """
    p = {n: t.clone() for n, t in p0.items()}
    m = {n: torch.zeros_like(t) for n, t in p.items()}
    v = {n: torch.zeros_like(t) for n, t in p.items()}
    losses, norms, lrs = [], [], []
    for k in range(step_tokens.shape[0]):
        it = k + 1
        _, loss, g = loss_and_grads(p, step_tokens[k])
        norm = math.sqrt(sum(float((gi.double() ** 2).sum()) for gi in g.values()))
        coef = min(1.0, GRAD_CLIP / (norm + 1e-6))
        lr = lr_at(it)
        for n in p:
            gn = g[n] * coef
            m[n] = BETA1 * m[n] + (1.0 - BETA1) * gn
            v[n] = BETA2 * v[n] + (1.0 - BETA2) * gn * gn
            mhat = m[n] / (1.0 - BETA1 ** it)
            vhat = v[n] / (1.0 - BETA2 ** it)
            wd = WEIGHT_DECAY if p[n].dim() >= 2 else 0.0
            p[n] = p[n] - lr * (mhat / (torch.sqrt(vhat) + ADAM_EPS) + wd * p[n])
        losses.append(float(loss)); norms.append(norm); lrs.append(lr)
    return losses, norms, lrs, p


# ----------------------------------------------------------------------------------------------------

def self_checks(p64, tokens):
    """Cross-check the hand-written pieces against torch.nn.functional."""
    torch.manual_seed(0)
    x = torch.randn(B, S, C, dtype=torch.float64)
    pre = "h.0."
    ln = layernorm(x, p64[pre + "ln_1.weight"], p64[pre + "ln_1.bias"])
    ref = F.layer_norm(x, (C,), p64[pre + "ln_1.weight"], p64[pre + "ln_1.bias"], eps=LN_EPS)
    assert torch.allclose(ln, ref, rtol=1e-12, atol=1e-12), "layernorm mismatch"
    assert torch.allclose(gelu_tanh(x), F.gelu(x, approximate="tanh"), rtol=1e-12, atol=1e-12), "gelu"
    for i in range(L):
        pre = f"h.{i}."
        q, k, v = attn_qkv(ln, p64, pre)
        mine = attention_core(q, k, v)
        sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert torch.allclose(mine, sdpa, rtol=1e-10, atol=1e-12), "attention mismatch vs SDPA"
        # and the full attention sublayer against nn.MultiheadAttention-free manual reference
        y = attn(ln, p64, pre)
        yc = sdpa.transpose(1, 2).reshape(B, S, C)
        yref = F.linear(yc, p64[pre + "attn.c_proj.weight"], p64[pre + "attn.c_proj.bias"])
        assert torch.allclose(y, yref, rtol=1e-10, atol=1e-12)
    logits, loss = forward(p64, tokens)
    ref = F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1).long())
    assert abs(float(loss) - float(ref)) < 1e-12, "cross-entropy mismatch"
    # causality: changing the last input token must not change earlier logits
    t2 = tokens.clone(); t2[:, S - 1] = (t2[:, S - 1] + 1) % V
    l2, _ = forward(p64, t2)
    assert torch.equal(l2[:, :S - 1], logits[:, :S - 1]), "causality"
    # autograd gradient vs central finite differences on a few entries (float64)
    _, _, g = loss_and_grads(p64, tokens)
    gen = torch.Generator().manual_seed(1)
    for name in ["wte", "wpe", "h.0.attn.c_attn.weight", "h.1.mlp.c_fc.bias", "h.1.ln_2.weight", "ln_f.bias"]:
        for _ in range(3):
            idx = int(torch.randint(p64[name].numel(), (1,), generator=gen))
            pp = {n: t.clone() for n, t in p64.items()}
            h = 1e-6
            pp[name].view(-1)[idx] += h; _, lp = forward(pp, tokens)
            pp[name].view(-1)[idx] -= 2 * h; _, lm = forward(pp, tokens)
            fd = (float(lp) - float(lm)) / (2 * h)
            an = float(g[name].view(-1)[idx])
            assert abs(fd - an) <= 1e-7 + 1e-5 * abs(an), (name, idx, fd, an)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "gpt_tiny.safetensors"))
    args = ap.parse_args()

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    params32 = init_params(gen)                                              # 1. parameters
    step_tokens = torch.stack([torch.randint(0, V, (B, S + 1), generator=gen, dtype=torch.int64)
                               for _ in range(STEPS)]).to(torch.int32)      # 2. ten batches
    tokens = step_tokens[0].clone()

    p64 = {n: t.double() for n, t in params32.items()}
    self_checks(p64, tokens)

    logits, loss, grads = loss_and_grads(p64, tokens)
    losses, norms, lrs, final = train(p64, step_tokens)
    assert abs(losses[0] - float(loss)) < 1e-12

    # float32 re-run of the same recipe: how far a correct fp32 implementation may drift (for tolerances)
    l32, loss32, g32 = loss_and_grads(params32, tokens)
    losses32, norms32, _, final32 = train(params32, step_tokens)

    def maxrel(a, b):
        return float((a.double() - b.double()).abs().max() / b.double().abs().max())
    print("fp32 vs fp64 reference drift (max|diff| / max|ref|):")
    print("  logits %.2e  loss %.2e" % (maxrel(l32, logits), abs(float(loss32) - float(loss)) / float(loss)))
    print("  grads  %.2e (worst tensor)" % max(maxrel(g32[n], grads[n]) for n in grads))
    print("  step losses %.2e  grad norms %.2e" % (
        max(abs(a - b) / b for a, b in zip(losses32, losses)), max(abs(a - b) / b for a, b in zip(norms32, norms))))
    print("  final params %.2e (worst tensor, max|diff| = %.2e)" % (
        max(maxrel(final32[n], final[n]) for n in final),
        max(float((final32[n].double() - final[n]).abs().max()) for n in final)))

    f32 = lambda t: t.to(torch.float32).contiguous()
    tensors = [(n, params32[n]) for n, _ in param_specs()]
    tensors += [("tokens", tokens.contiguous()), ("logits", f32(logits)), ("loss", f32(loss.reshape(1)))]
    tensors += [("grad." + n, f32(grads[n])) for n, _ in param_specs()]
    tensors += [("steps.tokens", step_tokens.contiguous()),
                ("steps.loss", torch.tensor(losses, dtype=torch.float32)),
                ("steps.grad_norm", torch.tensor(norms, dtype=torch.float32)),
                ("steps.lr", torch.tensor(lrs, dtype=torch.float32))]
    tensors += [("final." + n, f32(final[n])) for n, _ in param_specs()]

    config = {
        "num_layers": L, "hidden_size": C, "num_heads": NH, "ffn_hidden_size": F_HID, "seq_len": S,
        "vocab_size": V, "batch_size": B, "tie_embeddings": True, "layer_norm_eps": LN_EPS,
        "activation": "gelu_tanh", "seed": SEED,
        "lr": LR_MAX, "min_lr": MIN_LR, "warmup_iters": WARMUP_ITERS, "decay_iters": DECAY_ITERS,
        "decay": "cosine", "beta1": BETA1, "beta2": BETA2, "eps": ADAM_EPS, "weight_decay": WEIGHT_DECAY,
        "grad_clip": GRAD_CLIP, "steps": STEPS,
        "generator": "tests/golden/make_gpt_fixture.py", "torch_version": torch.__version__,
    }
    write_safetensors(args.out, tensors, {"config": json.dumps(config, sort_keys=True)})

    # reload and compare bit for bit
    back, meta = read_safetensors(args.out)
    assert set(back) == {n for n, _ in tensors}
    for n, t in tensors:
        assert back[n].dtype == t.dtype and back[n].shape == t.shape and torch.equal(back[n], t), n
    assert json.loads(meta["config"]) == config
    assert torch.equal(back["steps.tokens"][0], back["tokens"])

    size = os.path.getsize(args.out)
    assert size < 2 * 1024 * 1024, size
    print("wrote %s (%d bytes, %d tensors)" % (args.out, size, len(tensors)))
    print("loss at init: %.9f" % float(loss))
    print("step losses:", " ".join("%.6f" % x for x in losses))
    print("grad norms: ", " ".join("%.6f" % x for x in norms))
    print("lrs:        ", " ".join("%.6g" % x for x in lrs))


if __name__ == "__main__":
    main()
