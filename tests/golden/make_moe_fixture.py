#!/usr/bin/env python3
"""Generate tests/golden/mixtral_tiny.safetensors, tests/golden/qwen3_moe_tiny.safetensors and
tests/golden/qwen3_moe_dense_tiny.safetensors, the golden references for Strata's mixture-of-experts
models.

The mixture-of-experts counterpart of make_llama_fixture.py, for two architectures: a tiny random
Hugging Face MixtralForCausalLM (top-2 of 4 experts, the top-k weights renormalised) and
Qwen3MoeForCausalLM (top-2 of 8 experts, not renormalised, per-head q/k RMSNorm, head_dim 32 while
hidden_size / num_heads = 16), and a Qwen3MoeForCausalLM with dense layers (6 layers,
decoder_sparse_step 2, mlp_only_layers [1]: mixtures at layers 3 and 5, dense SwiGLU MLPs elsewhere;
top-2 of 4 experts). For each: the initial weights under the names save_pretrained writes
(the Hub's per-expert names), one batch, the logits, the language-model loss, the router's
load-balancing (aux) loss, their sum lm + coef * aux, every parameter's gradient of that sum, and a
10-step AdamW run on it (losses, aux losses, gradient norms, learning rates, final weights) with
Strata's optimizer recipe (make_llama_fixture.py's).

The models are transformers' own (attn_implementation="eager", experts_implementation="eager",
float64): the outside reference. The script checks them against a hand-written forward (RMSNorm,
rotate_half RoPE, grouped-query causal attention, Qwen3's q/k RMSNorm before the rotation, the
router's softmax over all experts, top-k, renormalisation, SwiGLU experts, the weighted sum, the
dense layers' SwiGLU MLP), the aux loss (the sparse layers' router logits pooled) against a
hand-written one, causality, that no token's top-k has a (near-)tie, autograd
gradients against central finite differences (router, expert, q_norm and other weights),
torch.optim.AdamW (used for the steps) against a hand-written AdamW of Strata's formula, the stored
names and values against what save_pretrained writes, and it writes the file by hand (struct +
json) and reads it back bit for bit. Reference values are computed in float64 from the stored
float32 weights (upcast exactly) and stored as float32; a float32 replay of the same recipe prints
how far a correct float32 implementation drifts (the tolerances of tests/golden/README.md).

Needs torch and transformers (pip install torch transformers); CI never runs it.

It also records the model's parameter count (config "parameters"), which Strata's description must
give.

Usage:  python3 tests/golden/make_moe_fixture.py [--arch mixtral|qwen3_moe|qwen3_moe_dense|all]
                                                  [--out PATH]
"""
import argparse
import json
import math
import os
import tempfile
import warnings

warnings.filterwarnings("ignore", message=".*NumPy.*")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,  # noqa: E402
                          Qwen3MoeForCausalLM)
from transformers.models.mixtral import modeling_mixtral  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe  # noqa: E402

# ----------------------------------------------------------------------------------------------------
# Configuration (keep in sync with tests/golden/README.md)
C, NH, KVH, S, V, B = 64, 4, 2, 16, 97, 4           # layers: Arch.L
ROPE_THETA = 1e6
AUX_COEF = 0.02                  # router_aux_loss_coef: large enough to matter in the gradients
SEED = 42
W_STD, NORM_STD = 0.08, 0.1      # weights N(0, 0.08); RMSNorm weights 1 + N(0, 0.1)
STEPS = 10
LR_MAX, MIN_LR, WARMUP_ITERS, DECAY_ITERS = 1e-2, 1e-3, 2, 10
BETA1, BETA2, ADAM_EPS, WEIGHT_DECAY, GRAD_CLIP = 0.9, 0.95, 1e-8, 0.1, 2.5
MIN_ROUTER_GAP = 1e-6            # no token's top-k may have a tie or a near-tie closer than this


class Arch:
    """What differs between the models."""

    def __init__(self, name, *, head_dim, n_experts, top_k, ffn, norm_topk, qk_norm, eps, module,
                 out, layers=2, sparse_step=1, mlp_only=(), dense_ffn=None):
        self.name, self.HD, self.E, self.K, self.F = name, head_dim, n_experts, top_k, ffn
        self.norm_topk, self.qk_norm, self.eps, self.module, self.out = \
            norm_topk, qk_norm, eps, module, out
        # Qwen3-MoE's dense layers: decoder_sparse_step, mlp_only_layers, intermediate_size.
        self.L, self.step, self.mlp_only, self.FD = layers, sparse_step, list(mlp_only), dense_ffn

    def sparse(self, i):
        """Qwen3MoeDecoderLayer's rule: layer i is a mixture, else a dense SwiGLU MLP."""
        return i not in self.mlp_only and (i + 1) % self.step == 0

    def dense_mlp_specs(self):
        return [("mlp.gate_proj.weight", (self.FD, C)), ("mlp.up_proj.weight", (self.FD, C)),
                ("mlp.down_proj.weight", (C, self.FD))]

    # ---- transformers' model: its state dict (fused experts) -------------------------------------
    def internal_specs(self):
        """(name, shape) of the model's state dict, in its order: the initialisation order."""
        E, F_, HD = self.E, self.F, self.HD
        attn = [("self_attn.q_proj.weight", (NH * HD, C)), ("self_attn.k_proj.weight", (KVH * HD, C)),
                ("self_attn.v_proj.weight", (KVH * HD, C)), ("self_attn.o_proj.weight", (C, NH * HD))]
        router = [("mlp.gate.weight", (E, C))]
        experts = [("mlp.experts.gate_up_proj", (E, 2 * F_, C)), ("mlp.experts.down_proj", (E, C, F_))]
        if self.name == "mixtral":
            layer = attn + router + experts
        else:
            attn = attn + [("self_attn.q_norm.weight", (HD,)), ("self_attn.k_norm.weight", (HD,))]
            layer = attn + experts + router
        norms = [("input_layernorm.weight", (C,)), ("post_attention_layernorm.weight", (C,))]
        specs = [("model.embed_tokens.weight", (V, C))]
        for i in range(self.L):
            mine = layer if self.sparse(i) else attn + self.dense_mlp_specs()
            specs += [(f"model.layers.{i}.{suf}", shape) for suf, shape in mine + norms]
        return specs + [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]

    # ---- the Hub's names (what save_pretrained writes, what Strata reads and writes) -------------
    def moe_prefix(self):
        return "block_sparse_moe" if self.name == "mixtral" else "mlp"

    def expert_names(self):
        """(gate, up, down) projection names of one expert, under experts.{e}."""
        return ("w1", "w3", "w2") if self.name == "mixtral" else ("gate_proj", "up_proj", "down_proj")

    def hub_specs(self):
        """(name, shape) of the stored weights, in the file's order."""
        E, F_, HD, mp = self.E, self.F, self.HD, self.moe_prefix()
        gate_n, up_n, down_n = self.expert_names()
        layer = [("self_attn.q_proj.weight", (NH * HD, C)), ("self_attn.k_proj.weight", (KVH * HD, C)),
                 ("self_attn.v_proj.weight", (KVH * HD, C)), ("self_attn.o_proj.weight", (C, NH * HD))]
        if self.qk_norm:
            layer += [("self_attn.q_norm.weight", (HD,)), ("self_attn.k_norm.weight", (HD,))]
        layer += [(f"{mp}.gate.weight", (E, C))]
        per = [(gate_n, (F_, C)), (up_n, (F_, C)), (down_n, (C, F_))]
        if self.name == "mixtral":   # w1, w2, w3, as the Hub's (and transformers 4's) module order
            per = [per[0], per[2], per[1]]
        for e in range(E):
            layer += [(f"{mp}.experts.{e}.{n}.weight", shape) for n, shape in per]
        norms = [("input_layernorm.weight", (C,)), ("post_attention_layernorm.weight", (C,))]
        dense = [spec for spec in layer if ".gate." not in spec[0] and ".experts." not in spec[0]]
        specs = [("model.embed_tokens.weight", (V, C))]
        for i in range(self.L):
            mine = layer if self.sparse(i) else dense + self.dense_mlp_specs()
            specs += [(f"model.layers.{i}.{suf}", shape) for suf, shape in mine + norms]
        return specs + [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]

    def to_hub(self, t):
        """The model's tensors (fused experts) -> the Hub's per-expert tensors (exact slices)."""
        out, mp = {}, self.moe_prefix()
        gate_n, up_n, down_n = self.expert_names()
        for n, x in t.items():
            if ".mlp.experts.gate_up_proj" in n:
                pre = n.replace(".mlp.experts.gate_up_proj", f".{mp}.experts.")
                for e in range(self.E):
                    out[f"{pre}{e}.{gate_n}.weight"] = x[e, :self.F].contiguous()
                    out[f"{pre}{e}.{up_n}.weight"] = x[e, self.F:].contiguous()
            elif ".mlp.experts.down_proj" in n:
                pre = n.replace(".mlp.experts.down_proj", f".{mp}.experts.")
                for e in range(self.E):
                    out[f"{pre}{e}.{down_n}.weight"] = x[e].contiguous()
            elif ".mlp.gate.weight" in n:
                out[n.replace(".mlp.", f".{mp}.")] = x
            else:
                out[n] = x
        assert sorted(out) == sorted(n for n, _ in self.hub_specs())
        return out

    def from_hub(self, t):
        """The Hub's per-expert tensors -> the model's state dict (fused experts)."""
        out, mp = {}, self.moe_prefix()
        gate_n, up_n, down_n = self.expert_names()
        for n, _ in self.internal_specs():
            i = n.split(".")[2] if n.startswith("model.layers.") else None
            pre = f"model.layers.{i}.{mp}."
            if n.endswith("mlp.experts.gate_up_proj"):
                out[n] = torch.stack([torch.cat([t[f"{pre}experts.{e}.{gate_n}.weight"],
                                                 t[f"{pre}experts.{e}.{up_n}.weight"]])
                                      for e in range(self.E)])
            elif n.endswith("mlp.experts.down_proj"):
                out[n] = torch.stack([t[f"{pre}experts.{e}.{down_n}.weight"] for e in range(self.E)])
            elif n.endswith("mlp.gate.weight"):
                out[n] = t[pre + "gate.weight"]
            else:
                out[n] = t[n]
        return out

    def hf_config(self):
        common = dict(num_hidden_layers=self.L, hidden_size=C, num_attention_heads=NH,
                      num_key_value_heads=KVH, vocab_size=V, max_position_embeddings=S,
                      rms_norm_eps=self.eps,
                      rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                      tie_word_embeddings=False, hidden_act="silu", attention_dropout=0.0,
                      num_experts_per_tok=self.K, output_router_logits=True,
                      router_aux_loss_coef=AUX_COEF, attn_implementation="eager",
                      experts_implementation="eager")
        if self.name == "mixtral":
            cfg = MixtralConfig(intermediate_size=self.F, num_local_experts=self.E, sliding_window=None,
                                router_jitter_noise=0.0, **common)
        else:
            dense = dict(intermediate_size=self.FD) if self.FD else {}
            cfg = Qwen3MoeConfig(head_dim=self.HD, num_experts=self.E, moe_intermediate_size=self.F,
                                 norm_topk_prob=self.norm_topk, decoder_sparse_step=self.step,
                                 mlp_only_layers=self.mlp_only, attention_bias=False,
                                 use_sliding_window=False, **dense, **common)
            assert cfg.sliding_window is None and cfg.head_dim == self.HD
        assert cfg.rope_parameters["rope_theta"] == ROPE_THETA
        return cfg

    def model_class(self):
        return MixtralForCausalLM if self.name == "mixtral" else Qwen3MoeForCausalLM


MIXTRAL = Arch("mixtral", head_dim=C // NH, n_experts=4, top_k=2, ffn=96, norm_topk=True,
               qk_norm=False, eps=1e-5, module=modeling_mixtral, out="mixtral_tiny.safetensors")
QWEN3_MOE = Arch("qwen3_moe", head_dim=32, n_experts=8, top_k=2, ffn=48, norm_topk=False,
                 qk_norm=True, eps=1e-6, module=modeling_qwen3_moe, out="qwen3_moe_tiny.safetensors")
# Qwen3-MoE with dense layers: 6 layers, decoder_sparse_step 2 (layers 1, 3, 5 sparse) and
# mlp_only_layers [1] (layer 1 dense after all): mixtures at layers 3 and 5, dense SwiGLU MLPs of
# intermediate_size 32 at 0, 1, 2 and 4, so that both rules matter and the balancing loss pools
# two sparse layers with dense ones between them. 4 experts and head_dim C/NH keep it small.
QWEN3_MOE_DENSE = Arch("qwen3_moe", head_dim=C // NH, n_experts=4, top_k=2, ffn=48, norm_topk=False,
                       qk_norm=True, eps=1e-6, module=modeling_qwen3_moe,
                       out="qwen3_moe_dense_tiny.safetensors", layers=6, sparse_step=2,
                       mlp_only=[1], dense_ffn=32)
ARCHS = {"mixtral": MIXTRAL, "qwen3_moe": QWEN3_MOE, "qwen3_moe_dense": QWEN3_MOE_DENSE}


def init_params(arch, gen):
    """One torch.randn per tensor of the model's state dict, in its order (the fused expert tensors
    are drawn whole, (E, 2F, C) and (E, C, F))."""
    params = {}
    for name, shape in arch.internal_specs():
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        params[name] = (1.0 + NORM_STD * z if name.endswith("norm.weight") else W_STD * z).contiguous()
    return params


# ----------------------------------------------------------------------------------------------------
# transformers computes some steps in float32 whatever the model's dtype: the RMSNorm (casts to
# float32 and back), the eager attention's softmax (dtype=torch.float32), the router's softmax
# (Mixtral: router_logits.float(), and its top-k weights stay float32; Qwen3-MoE: dtype=torch.float)
# and load_balancing_loss_func (float32 accumulators, routing_weights.float()). For a float64
# reference each is replaced by the same math in the input's dtype (for float32 inputs that is
# transformers' own computation); self_checks reports how far transformers' float32 steps are.

def _rmsnorm_in_dtype(self, x):
    variance = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


def _make_eager_in_dtype(mod):
    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        k = mod.repeat_kv(key, module.num_key_value_groups)
        v = mod.repeat_kv(value, module.num_key_value_groups)
        w = torch.matmul(query, k.transpose(2, 3)) * scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.softmax(w, dim=-1)
        return torch.matmul(w, v).transpose(1, 2).contiguous(), w
    return eager


def _router_in_dtype(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    probs = torch.softmax(router_logits, dim=-1)
    top, idx = torch.topk(probs, self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):      # Mixtral always renormalises
        top = top / top.sum(dim=-1, keepdim=True)
    return router_logits, top, idx


def _load_balancing_in_dtype(gate_logits, num_experts=None, top_k=2, attention_mask=None):
    """transformers' load_balancing_loss_func (no attention mask) in the logits' dtype."""
    assert attention_mask is None
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    dt = gate_logits[0].dtype
    count, prob_sum, rows = torch.zeros(num_experts, dtype=dt), torch.zeros(num_experts, dtype=dt), 0
    for layer_gate in gate_logits:
        p = torch.softmax(layer_gate, dim=-1)
        _, sel = torch.topk(p, top_k, dim=-1)
        count = count + torch.bincount(sel.reshape(-1), minlength=num_experts).to(dt)
        prob_sum = prob_sum + p.sum(dim=0)
        rows += p.shape[0]
    return torch.sum((count / rows) * (prob_sum / rows).unsqueeze(0)) * num_experts


_ORIG = {}


def exact_math(arch, on):
    mod = arch.module
    rms = mod.MixtralRMSNorm if arch.name == "mixtral" else mod.Qwen3MoeRMSNorm
    router = mod.MixtralTopKRouter if arch.name == "mixtral" else mod.Qwen3MoeTopKRouter
    if arch.name not in _ORIG:
        _ORIG[arch.name] = (rms.forward, mod.eager_attention_forward, router.forward,
                            mod.load_balancing_loss_func)
    orig = _ORIG[arch.name]
    new = (_rmsnorm_in_dtype, _make_eager_in_dtype(mod), _router_in_dtype, _load_balancing_in_dtype)
    rms.forward, mod.eager_attention_forward, router.forward, mod.load_balancing_loss_func = \
        new if on else orig


def make_model(arch, params, dtype):
    model = arch.model_class()(arch.hf_config()).to(dtype).eval()
    sd = model.state_dict()
    want = [(n, tuple(s)) for n, s in arch.internal_specs()]
    got = [(n, tuple(t.shape)) for n, t in sd.items() if "rotary" not in n]
    assert got == want, "transformers' state dict changed:\n%s\n%s" % (got, want)
    missing, unexpected = model.load_state_dict({n: t.to(dtype) for n, t in params.items()}, strict=False)
    assert not unexpected and not [k for k in missing if "rotary" not in k], (missing, unexpected)
    return model


# ----------------------------------------------------------------------------------------------------
# The reference: transformers' model (logits, aux loss), our cross-entropy

def forward(model, inputs, targets):
    """(logits, lm loss, aux loss, total loss, router logits per layer)."""
    out = model(inputs.long(), output_router_logits=True)
    logits = out.logits                                                        # (B, S, V)
    lm = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long())   # mean over B*S
    return logits, lm, out.aux_loss, lm + AUX_COEF * out.aux_loss, out.router_logits


def loss_and_grads(arch, model, inputs, targets, which="total"):
    model.zero_grad(set_to_none=True)
    logits, lm, aux, total, rl = forward(model, inputs, targets)
    {"total": total, "lm": lm, "aux": AUX_COEF * aux}[which].backward()
    named = dict(model.named_parameters())
    grads = {n: named[n].grad.detach().clone() if named[n].grad is not None
             else torch.zeros_like(named[n]) for n, _ in arch.internal_specs()}  # (aux: no lm_head)
    return logits.detach(), lm.detach(), aux.detach(), total.detach(), [r.detach() for r in rl], grads


# ----------------------------------------------------------------------------------------------------
# A hand-written forward on the Hub-named weights: the math, spelled out, checked against transformers

def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def rope(x, hd):
    """x: (B, H, S, hd). Hugging Face's rotate_half: dimension i pairs with i + hd/2, angle
    pos * theta^(-2i/hd) for i < hd/2. The table is Hugging Face's: inv_freq, the angles and their
    cos/sin are float32 even in a float64 model, then upcast."""
    half = hd // 2
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    ang = torch.arange(S, dtype=torch.float32)[:, None] * inv[None, :]   # (S, hd/2) float32
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def route(arch, h, w_router):
    """h: (T, C). Router logits (T, E); the dense (T, E) combination weights: softmax over all E
    experts, the top-k kept (renormalised to sum 1 for Mixtral / norm_topk_prob), the rest 0."""
    logits = h @ w_router.t()
    p = torch.softmax(logits, dim=-1)
    top, idx = torch.topk(p, arch.K, dim=-1)
    if arch.norm_topk:
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, torch.zeros_like(p).scatter(-1, idx, top)


def manual_forward(arch, p, inputs):
    """(logits, router logits per layer) from the Hub-named tensors p."""
    HD, mp = arch.HD, arch.moe_prefix()
    gate_n, up_n, down_n = arch.expert_names()
    x = p["model.embed_tokens.weight"][inputs.long()]
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    router_logits = []
    for i in range(arch.L):
        pre = f"model.layers.{i}."
        h = rmsnorm(x, p[pre + "input_layernorm.weight"], arch.eps)
        q = (h @ p[pre + "self_attn.q_proj.weight"].t()).view(B, S, NH, HD)
        k = (h @ p[pre + "self_attn.k_proj.weight"].t()).view(B, S, KVH, HD)
        v = (h @ p[pre + "self_attn.v_proj.weight"].t()).view(B, S, KVH, HD).transpose(1, 2)
        if arch.qk_norm:   # Qwen3: each query / key head RMS-normalised over head_dim, before RoPE
            q = rmsnorm(q, p[pre + "self_attn.q_norm.weight"], arch.eps)
            k = rmsnorm(k, p[pre + "self_attn.k_norm.weight"], arch.eps)
        q, k = rope(q.transpose(1, 2), HD), rope(k.transpose(1, 2), HD)
        # Query head h reads key/value head h // (NH / KVH).
        k, v = k.repeat_interleave(NH // KVH, dim=1), v.repeat_interleave(NH // KVH, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HD)
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, S, NH * HD)
        x = x + y @ p[pre + "self_attn.o_proj.weight"].t()
        h = rmsnorm(x, p[pre + "post_attention_layernorm.weight"], arch.eps).reshape(B * S, C)
        if not arch.sparse(i):   # Qwen3-MoE's dense layer: down(silu(gate h) * up h), no router
            g, u = h @ p[pre + "mlp.gate_proj.weight"].t(), h @ p[pre + "mlp.up_proj.weight"].t()
            x = x + ((F.silu(g) * u) @ p[pre + "mlp.down_proj.weight"].t()).view(B, S, C)
            continue
        logits, comb = route(arch, h, p[pre + mp + ".gate.weight"])
        router_logits.append(logits)
        moe = torch.zeros_like(h)
        for e in range(arch.E):
            ex = f"{pre}{mp}.experts.{e}."
            g, u = h @ p[ex + gate_n + ".weight"].t(), h @ p[ex + up_n + ".weight"].t()
            moe = moe + comb[:, e:e + 1] * ((F.silu(g) * u) @ p[ex + down_n + ".weight"].t())
        x = x + moe.view(B, S, C)
    return rmsnorm(x, p["model.norm.weight"], arch.eps) @ p["lm_head.weight"].t(), router_logits


def manual_aux(arch, router_logits):
    """Switch-Transformer balancing loss as transformers computes it: the router logits of the L
    sparse layers pooled (L*T rows; a dense layer has no router), f_e = (times e is in a row's top-k)
    / (L*T), P_e = mean over the L*T rows of softmax_e; aux = E * sum_e f_e * P_e (before the
    coefficient)."""
    probs = torch.cat([torch.softmax(r, dim=-1) for r in router_logits])       # (L*T, E)
    sel = torch.topk(probs, arch.K, dim=-1).indices
    f = torch.zeros(arch.E, dtype=probs.dtype).index_add_(
        0, sel.reshape(-1), torch.ones(sel.numel(), dtype=probs.dtype)) / probs.shape[0]
    return arch.E * (f * probs.mean(dim=0)).sum()


def router_gaps(arch, router_logits):
    """Smallest gap between the k-th and (k+1)-th router probability (the top-k boundary), and the
    smallest gap between neighbours inside the top-k, over all tokens and layers."""
    probs = torch.cat([torch.softmax(r.double(), dim=-1) for r in router_logits])
    srt = torch.sort(probs, dim=-1, descending=True).values
    boundary = float((srt[:, arch.K - 1] - srt[:, arch.K]).min())
    inside = float((srt[:, :arch.K - 1] - srt[:, 1:arch.K]).min())
    return boundary, inside


def topk_experts(arch, router_logits):
    return torch.stack([torch.topk(torch.softmax(r, dim=-1), arch.K, dim=-1).indices
                        for r in router_logits])                      # (sparse layers, T, k)


# ----------------------------------------------------------------------------------------------------
# AdamW: torch.optim.AdamW with Strata's recipe, and by hand to check torch's is that formula

def lr_at(it):  # 1-based, runtime/engine/optimizer.cc's learning_rate
    if it <= WARMUP_ITERS:
        return LR_MAX * it / WARMUP_ITERS
    ratio = (it - WARMUP_ITERS) / (DECAY_ITERS - WARMUP_ITERS)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR_MAX - MIN_LR)


def decays(name):
    """Strata's ParamInfo::decay: weight matrices (router and experts included) and the embedding,
    not the RMSNorm weights (q_norm / k_norm included)."""
    return not name.endswith("norm.weight")


def train_torch(arch, params, step_inputs, step_targets, dtype):
    model = make_model(arch, params, dtype)
    named = dict(model.named_parameters())
    specs = arch.internal_specs()
    groups = [
        {"params": [named[n] for n, _ in specs if decays(n)], "weight_decay": WEIGHT_DECAY},
        {"params": [named[n] for n, _ in specs if not decays(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR_MAX, betas=(BETA1, BETA2), eps=ADAM_EPS)
    rec = {"loss": [], "lm_loss": [], "aux_loss": [], "grad_norm": [], "lr": [], "gaps": [], "topk": []}
    for k in range(step_inputs.shape[0]):
        it = k + 1
        opt.zero_grad(set_to_none=True)
        _, lm, aux, total, rl = forward(model, step_inputs[k], step_targets[k])
        total.backward()
        # min(1, GRAD_CLIP / (norm + 1e-6)), as runtime/engine/optimizer.cc's clip_coefficient
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP))
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        opt.step()
        rec["loss"].append(float(total.detach())); rec["lm_loss"].append(float(lm.detach()))
        rec["aux_loss"].append(float(aux.detach())); rec["grad_norm"].append(norm)
        rec["lr"].append(lr_at(it))
        rl = [r.detach() for r in rl]
        rec["gaps"].append(router_gaps(arch, rl)); rec["topk"].append(topk_experts(arch, rl))
    final = {n: named[n].detach().clone() for n, _ in specs}
    return rec, final


def train_by_hand(arch, params, step_inputs, step_targets):
    """Strata's formula (runtime/engine/optimizer.h), float64: p -= lr*(mhat/(sqrt(vhat)+eps) + wd*p)."""
    model = make_model(arch, params, torch.float64)
    named = dict(model.named_parameters())
    specs = arch.internal_specs()
    m = {n: torch.zeros_like(named[n]) for n, _ in specs}
    v = {n: torch.zeros_like(named[n]) for n, _ in specs}
    for k in range(step_inputs.shape[0]):
        it = k + 1
        g = loss_and_grads(arch, model, step_inputs[k], step_targets[k])[-1]
        norm = math.sqrt(sum(float((gi ** 2).sum()) for gi in g.values()))
        coef = min(1.0, GRAD_CLIP / (norm + 1e-6))
        with torch.no_grad():
            for n, _ in specs:
                p, gn = named[n], g[n] * coef
                m[n] = BETA1 * m[n] + (1 - BETA1) * gn
                v[n] = BETA2 * v[n] + (1 - BETA2) * gn * gn
                mhat, vhat = m[n] / (1 - BETA1 ** it), v[n] / (1 - BETA2 ** it)
                wd = WEIGHT_DECAY if decays(n) else 0.0
                p.copy_(p - lr_at(it) * (mhat / (torch.sqrt(vhat) + ADAM_EPS) + wd * p))
    return {n: named[n].detach().clone() for n, _ in specs}


# ----------------------------------------------------------------------------------------------------

def self_checks(arch, params32, model64, inputs, targets, seqs):
    p64 = {n: t.double() for n, t in arch.to_hub(params32).items()}
    logits, lm, aux, total, rl = [t.detach() if torch.is_tensor(t) else t
                                  for t in forward(model64, inputs, targets)]
    rl = [r.detach() for r in rl]

    # The hand-written forward (on the Hub's per-expert names: checks the split too).
    mine, mine_rl = manual_forward(arch, p64, inputs)
    err = float((mine - logits).abs().max() / logits.abs().max())
    assert err < 1e-12, "hand-written %s vs transformers: %g" % (arch.name, err)
    rl_err = max(float((a - b).abs().max()) for a, b in zip(mine_rl, rl))
    assert rl_err < 1e-12, rl_err
    aux_mine = manual_aux(arch, mine_rl)
    aux_err = abs(float(aux_mine) - float(aux)) / float(aux)
    assert aux_err < 1e-12, "aux loss by hand vs transformers: %g" % aux_err

    # transformers' own float32 steps, unpatched.
    exact_math(arch, False)
    with torch.no_grad():
        out = model64(inputs.long(), output_router_logits=True)
    exact_math(arch, True)
    hf32 = float((out.logits - logits).abs().max() / logits.abs().max())
    hf32_aux = abs(float(out.aux_loss) - float(aux)) / float(aux)
    assert hf32 < 1e-5 and hf32_aux < 1e-5, (hf32, hf32_aux)
    print("  transformers' own float32 RMSNorm, softmaxes and aux loss move the float64 logits by "
          "%.1e, the aux loss by %.1e (relative)" % (hf32, hf32_aux))

    # Cross-entropy by hand; transformers' own loss with labels is lm + coef * aux.
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    nll = -logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1).mean()
    assert abs(float(nll) - float(lm)) < 1e-12, "cross-entropy"
    # (transformers shifts labels, position t predicts labels[t+1], and computes the cross-entropy
    # in float32: equal to float32 rounding, while leaving out coef * aux would be off by ~0.04.)
    with torch.no_grad():
        hf_loss = float(model64(inputs.long(), labels=inputs.long(), output_router_logits=True).loss)
    lm_shift = F.cross_entropy(logits[:, :S - 1].reshape(-1, V), targets[:, :S - 1].reshape(-1).long())
    assert abs(hf_loss - (float(lm_shift) + AUX_COEF * float(aux))) < 1e-5, "total loss composition"

    # Causality: changing the last input token must not change earlier logits.
    t2 = inputs.clone()
    t2[:, S - 1] = (t2[:, S - 1] + 1) % V
    with torch.no_grad():
        l2 = model64(t2.long()).logits
    caus = float((l2[:, :S - 1] - logits[:, :S - 1]).abs().max())
    assert caus < 1e-14, "causality %g" % caus

    # No ties or near-ties in any token's top-k at the initial weights (every batch).
    gaps = []
    with torch.no_grad():
        for k in range(seqs.shape[0]):
            out = model64(seqs[k, :, :S].long(), output_router_logits=True)
            gaps.append(router_gaps(arch, out.router_logits))
    bmin, imin = min(g[0] for g in gaps), min(g[1] for g in gaps)
    assert bmin > MIN_ROUTER_GAP and imin > MIN_ROUTER_GAP, (bmin, imin)

    # The aux loss matters in the gradients: its share against the language-model loss's.
    g_tot = loss_and_grads(arch, model64, inputs, targets, "total")[-1]
    g_aux = loss_and_grads(arch, model64, inputs, targets, "aux")[-1]
    share = {n: float(g_aux[n].abs().max() / g_tot[n].abs().max()) for n in g_tot}
    assert all(float(g.abs().max()) > 0 for g in g_tot.values())
    router_share = min(v for n, v in share.items() if n.endswith("mlp.gate.weight"))
    assert router_share > 1e-2, share

    # Autograd vs central finite differences (float64), on the total loss.
    named = dict(model64.named_parameters())
    gen = torch.Generator().manual_seed(1)
    sparse = [i for i in range(arch.L) if arch.sparse(i)]
    dense = [i for i in range(arch.L) if not arch.sparse(i)]
    a, z = sparse[0], sparse[-1]
    checked = [f"model.layers.{a}.mlp.gate.weight", f"model.layers.{z}.mlp.gate.weight",
               f"model.layers.{a}.mlp.experts.gate_up_proj", f"model.layers.{z}.mlp.experts.down_proj",
               "model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight",
               f"model.layers.{arch.L - 1}.post_attention_layernorm.weight", "lm_head.weight"]
    if arch.qk_norm:
        checked += ["model.layers.0.self_attn.q_norm.weight",
                    f"model.layers.{arch.L - 1}.self_attn.k_norm.weight"]
    if dense:
        checked += [f"model.layers.{dense[0]}.mlp.gate_proj.weight",
                    f"model.layers.{dense[-1]}.mlp.up_proj.weight",
                    f"model.layers.{dense[-1]}.mlp.down_proj.weight"]
    worst_fd = 0.0
    for name in checked:
        for _ in range(3):
            idx = int(torch.randint(named[name].numel(), (1,), generator=gen))
            h = 1e-6
            with torch.no_grad():
                named[name].view(-1)[idx] += h
                lp = float(forward(model64, inputs, targets)[3])
                named[name].view(-1)[idx] -= 2 * h
                lm_ = float(forward(model64, inputs, targets)[3])
                named[name].view(-1)[idx] += h
            fd, an = (lp - lm_) / (2 * h), float(g_tot[name].view(-1)[idx])
            assert abs(fd - an) <= 1e-8 + 1e-5 * abs(an), (name, idx, fd, an)
            worst_fd = max(worst_fd, abs(fd - an) / max(abs(an), 1e-8))
    print("  self-checks: hand-written %s vs transformers %.1e (router logits %.1e), aux loss by "
          "hand %.1e, cross-entropy, lm + coef*aux = transformers' loss, causality, finite "
          "differences on %d tensors (worst relative %.1e): ok" % (
              arch.name, err, rl_err, aux_err, len(checked), worst_fd))
    print("  router: smallest top-%d boundary gap %.2e, smallest gap inside the top-%d %.2e "
          "(initial weights, all %d batches; > %g)" % (arch.K, bmin, arch.K, imin, seqs.shape[0],
                                                       MIN_ROUTER_GAP))
    print("  aux share of the gradient (max|coef*d aux| / max|d total|): router %.2e, largest "
          "elsewhere %.2e (%s)" % (router_share, *max((v, n) for n, v in share.items()
                                                      if not n.endswith("mlp.gate.weight"))))
    return {"boundary_gap": bmin, "inside_gap": imin}


def check_save_pretrained(arch, params32, stored):
    """save_pretrained of the model holding the initial weights writes exactly the stored tensors
    (names, shapes, values), and from_pretrained of that reads the model's state dict back."""
    model = make_model(arch, params32, torch.float32)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
        assert files == ["model.safetensors"], files
        saved, _ = read_safetensors(os.path.join(d, "model.safetensors"))
        assert sorted(saved) == sorted(stored), (sorted(saved), sorted(stored))
        for n in saved:
            assert torch.equal(saved[n], stored[n]), n
        back = arch.model_class().from_pretrained(d, dtype=torch.float32)
        for n, t in back.state_dict().items():
            if "rotary" not in n:
                assert torch.equal(t, params32[n]), n
    return sorted(saved)


def make_fixture(arch, out):
    print("== %s -> %s" % (arch.name, out))
    exact_math(arch, True)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    params32 = init_params(arch, gen)                                        # 1. parameters
    seqs = torch.stack([torch.randint(0, V, (B, S + 1), generator=gen, dtype=torch.int64)
                        for _ in range(STEPS)]).to(torch.int32)             # 2. ten batches
    step_inputs, step_targets = seqs[:, :, :S].contiguous(), seqs[:, :, 1:].contiguous()
    inputs, targets = step_inputs[0].clone(), step_targets[0].clone()
    hub32 = arch.to_hub(params32)
    assert all(torch.equal(a, params32[n]) for n, a in arch.from_hub(hub32).items())
    saved_names = check_save_pretrained(arch, params32, hub32)

    model64 = make_model(arch, params32, torch.float64)
    gaps0 = self_checks(arch, params32, model64, inputs, targets, seqs)

    logits, lm, aux, total, rl, grads = loss_and_grads(arch, model64, inputs, targets)
    rec, final = train_torch(arch, params32, step_inputs, step_targets, torch.float64)
    assert abs(rec["loss"][0] - float(total)) < 1e-12
    by_hand = train_by_hand(arch, params32, step_inputs, step_targets)
    worst = max(float((by_hand[n] - final[n]).abs().max()) for n in final)
    assert worst < 1e-12, "torch.optim.AdamW differs from Strata's formula by %g" % worst
    print("  torch.optim.AdamW vs Strata's AdamW by hand (float64): max |diff| %.1e" % worst)
    step_gap = min(g[0] for g in rec["gaps"]), min(g[1] for g in rec["gaps"])
    print("  router gaps at each step's weights on its batch (float64 run): boundary %.2e, inside %.2e"
          % step_gap)
    assert step_gap[0] > MIN_ROUTER_GAP, step_gap

    # float32 re-run of the same recipe: how far a correct fp32 implementation may drift
    model32 = make_model(arch, params32, torch.float32)
    l32, lm32, aux32, tot32, rl32, g32 = loss_and_grads(arch, model32, inputs, targets)
    rec32, final32 = train_torch(arch, params32, step_inputs, step_targets, torch.float32)
    same_routing = all(torch.equal(a, b) for a, b in zip(rec32["topk"], rec["topk"]))
    assert torch.equal(topk_experts(arch, rl32), topk_experts(arch, rl)) and same_routing, \
        "float32 routes differently from float64"

    def maxrel(a, b):
        return float((a.double() - b.double()).abs().max() / b.double().abs().max())

    def rel(a, b):
        return abs(float(a) - float(b)) / abs(float(b))
    hub_g, hub_g32 = arch.to_hub(grads), arch.to_hub(g32)
    hub_f, hub_f32 = arch.to_hub(final), arch.to_hub(final32)
    drift = {
        "logits": maxrel(l32, logits), "lm_loss": rel(lm32, lm), "aux_loss": rel(aux32, aux),
        "loss": rel(tot32, total),
        "grads": max((maxrel(hub_g32[n], hub_g[n]), n) for n in hub_g),
        "step_loss": max(rel(a, b) for a, b in zip(rec32["loss"], rec["loss"])),
        "step_lm_loss": max(rel(a, b) for a, b in zip(rec32["lm_loss"], rec["lm_loss"])),
        "step_aux_loss": max(rel(a, b) for a, b in zip(rec32["aux_loss"], rec["aux_loss"])),
        "grad_norm": max(rel(a, b) for a, b in zip(rec32["grad_norm"], rec["grad_norm"])),
        "final": max((maxrel(hub_f32[n], hub_f[n]), n) for n in hub_f),
        "final_abs": max(float((hub_f32[n].double() - hub_f[n]).abs().max()) for n in hub_f),
    }
    for thr in ("2e-6", "1e-5", "1e-4"):
        drift["final_beyond_" + thr] = sum(int(((hub_f32[n].double() - hub_f[n]).abs() > float(thr)).sum())
                                           for n in hub_f)
    print("  fp32 vs fp64 reference drift (max|diff| / max|ref|; routing identical at every step):")
    print("    logits %.2e  lm loss %.2e  aux loss %.2e  total loss %.2e" % (
        drift["logits"], drift["lm_loss"], drift["aux_loss"], drift["loss"]))
    print("    grads  %.2e (worst tensor: %s)" % drift["grads"])
    print("    step losses %.2e (lm %.2e, aux %.2e)  grad norms %.2e" % (
        drift["step_loss"], drift["step_lm_loss"], drift["step_aux_loss"], drift["grad_norm"]))
    print("    final params %.2e (worst tensor: %s), max|diff| %.2e; of %d entries %d beyond 2e-6, "
          "%d beyond 1e-5, %d beyond 1e-4" % (
              *drift["final"], drift["final_abs"], sum(t.numel() for t in hub_f.values()),
              drift["final_beyond_2e-6"], drift["final_beyond_1e-5"], drift["final_beyond_1e-4"]))

    f32 = lambda t: t.to(torch.float32).contiguous()  # noqa: E731
    names = [n for n, _ in arch.hub_specs()]
    assert sorted(names) == saved_names
    tensors = [(n, hub32[n]) for n in names]
    tensors += [("inputs", inputs), ("targets", targets), ("logits", f32(logits)),
                ("loss", f32(total.reshape(1))), ("lm_loss", f32(lm.reshape(1))),
                ("aux_loss", f32(aux.reshape(1))),
                ("router_logits", f32(torch.stack(rl))),            # (sparse layers, B*S, E)
                ("router_topk", topk_experts(arch, rl).to(torch.int32).contiguous())]
    tensors += [("grad." + n, f32(hub_g[n])) for n in names]
    tensors += [("steps.inputs", step_inputs), ("steps.targets", step_targets)]
    tensors += [("steps." + k, torch.tensor(rec[k], dtype=torch.float32))
                for k in ("loss", "lm_loss", "aux_loss", "grad_norm", "lr")]
    tensors += [("final." + n, f32(hub_f[n])) for n in names]

    config = {
        "arch": arch.name, "num_layers": arch.L, "hidden_size": C, "num_heads": NH,
        "num_key_value_heads": KVH, "ffn_hidden_size": arch.F, "moe_intermediate_size": arch.F,
        "num_experts": arch.E, "num_experts_per_tok": arch.K, "norm_topk_prob": arch.norm_topk,
        "router_aux_loss_coef": AUX_COEF, "qk_norm": arch.qk_norm,
        "seq_len": S, "vocab_size": V, "batch_size": B, "tie_embeddings": False,
        "rms_norm_eps": arch.eps, "rope_theta": ROPE_THETA, "rope_scaling": None,
        "seed": SEED,
        "init": "weights N(0, %g), norms 1 + N(0, %g), one randn per tensor of transformers' state "
                "dict in its order (experts drawn fused: gate_up_proj (E, 2F, C), down_proj (E, C, F))"
                % (W_STD, NORM_STD),
        "weight_names": "Hugging Face Hub per-expert names (what save_pretrained writes)",
        "lr": LR_MAX, "min_lr": MIN_LR, "warmup_iters": WARMUP_ITERS, "decay_iters": DECAY_ITERS,
        "decay": "cosine", "beta1": BETA1, "beta2": BETA2, "eps": ADAM_EPS,
        "weight_decay": WEIGHT_DECAY,
        "weight_decay_applies_to": "every weight matrix (router and experts included) and the "
                                   "embedding, not the RMSNorm weights",
        "grad_clip": GRAD_CLIP, "steps": STEPS, "optimizer": "torch.optim.AdamW",
        "objective": "loss = lm_loss + router_aux_loss_coef * aux_loss",
        "generator": "tests/golden/make_moe_fixture.py", "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    if arch.name == "qwen3_moe":
        config["head_dim"] = arch.HD
    if arch.FD:
        config.update({"ffn_hidden_size": arch.FD, "decoder_sparse_step": arch.step,
                       "mlp_only_layers": arch.mlp_only})
    # The parameters of transformers' model (what Strata's description must count).
    config["parameters"] = sum(t.numel() for t in model64.parameters())
    write_safetensors(out, tensors, {"config": json.dumps(config, sort_keys=True)})

    back, meta = read_safetensors(out)
    assert set(back) == {n for n, _ in tensors}
    for n, t in tensors:
        assert back[n].dtype == t.dtype and back[n].shape == t.shape and torch.equal(back[n], t), n
    assert json.loads(meta["config"]) == config

    size = os.path.getsize(out)
    print("  wrote %s (%d bytes, %d tensors, %d parameter tensors, %d parameter values)" % (
        out, size, len(tensors), len(names), sum(hub32[n].numel() for n in names)))
    print("  loss at init: %.9f (lm %.9f, aux %.9f)" % (float(total), float(lm), float(aux)))
    for k in ("loss", "lm_loss", "aux_loss", "grad_norm"):
        print("  steps.%-10s" % k, " ".join("%.6f" % x for x in rec[k]))
    print("  steps.lr        ", " ".join("%.6g" % x for x in rec["lr"]))
    exact_math(arch, False)
    return drift, gaps0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=[*ARCHS, "all"], default="all")
    ap.add_argument("--out", help="output path (only with a single --arch)")
    args = ap.parse_args()
    assert args.out is None or args.arch != "all", "--out needs --arch"
    print("torch %s, transformers %s" % (torch.__version__, transformers.__version__))
    for name in (list(ARCHS) if args.arch == "all" else [args.arch]):
        make_fixture(ARCHS[name], args.out or os.path.join(here, ARCHS[name].out))


if __name__ == "__main__":
    main()
