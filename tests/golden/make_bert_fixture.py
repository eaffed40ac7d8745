#!/usr/bin/env python3
"""Generate tests/golden/bert_tiny.safetensors, the golden reference for Strata's BERT.

The BERT counterpart of make_llama_fixture.py: a tiny random Hugging Face BertForPreTraining
(post-LayerNorm encoder, bidirectional attention with a padding mask, exact GELU, biases, the
masked-LM head with its decoder tied to the word embeddings plus its own bias, the pooler and
the next-sentence classifier; a vocabulary that is not a multiple of 128) with its initial weights
under Hugging Face's names, one batch with padding (sequences of different lengths, masked
positions, next-sentence labels), the masked-LM and next-sentence logits, the loss and every
parameter's gradient on that batch, and a 10-step AdamW run (losses, gradient norms, learning
rates, final weights) with Strata's optimizer recipe.

The model is transformers' own (attn_implementation="eager", float64): the outside reference.
The script checks it against a hand-written BERT forward (the math Strata implements), its loss
against a hand-written cross-entropy (mean over the masked positions plus mean over the
sequences), that padding keys change nothing, autograd gradients against central finite
differences, and torch.optim.AdamW (used for the steps) against a hand-written AdamW of Strata's
formula; it writes the file by hand (struct + json) and reads it back bit for bit. Reference
values are computed in float64 from the stored float32 weights (upcast exactly) and stored as
float32; a float32 replay of the same recipe prints how far a correct float32 implementation
drifts (the tolerances of tests/test_bert_golden.cc).

Needs torch and transformers (pip install torch transformers); CI never runs it.

Usage:  python3 tests/golden/make_bert_fixture.py [--out PATH]
"""
import argparse
import json
import math
import os
import warnings

warnings.filterwarnings("ignore", message=".*NumPy.*")
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402
from transformers import BertConfig, BertForPreTraining  # noqa: E402

# ----------------------------------------------------------------------------------------------------
# Configuration
L, C, NH, F_HID, S, V, T, B = 2, 64, 4, 96, 16, 97, 2, 4
HS = C // NH
LN_EPS = 1e-12
CLS, SEP, MASK, PAD = V - 4, V - 3, V - 2, V - 1   # Strata's default special tokens
LENGTHS = [16, 11, 7, 13]                          # real tokens of the first batch's sequences
SEED = 23
W_STD, NORM_STD, BIAS_STD = 0.08, 0.1, 0.05        # weights, LayerNorm weights 1 + N(0, 0.1), biases
STEPS = 10
LR_MAX, MIN_LR, WARMUP_ITERS, DECAY_ITERS = 1e-2, 1e-3, 2, 10
BETA1, BETA2, ADAM_EPS, WEIGHT_DECAY, GRAD_CLIP = 0.9, 0.95, 1e-8, 0.1, 2.5

LAYER_PARAMS = [  # (suffix, shape) in BertForPreTraining's state-dict order within a layer
    ("attention.self.query.weight", (C, C)), ("attention.self.query.bias", (C,)),
    ("attention.self.key.weight", (C, C)), ("attention.self.key.bias", (C,)),
    ("attention.self.value.weight", (C, C)), ("attention.self.value.bias", (C,)),
    ("attention.output.dense.weight", (C, C)), ("attention.output.dense.bias", (C,)),
    ("attention.output.LayerNorm.weight", (C,)), ("attention.output.LayerNorm.bias", (C,)),
    ("intermediate.dense.weight", (F_HID, C)), ("intermediate.dense.bias", (F_HID,)),
    ("output.dense.weight", (C, F_HID)), ("output.dense.bias", (C,)),
    ("output.LayerNorm.weight", (C,)), ("output.LayerNorm.bias", (C,)),
]


def param_specs():
    """(name, shape) in the state-dict order, without the tied decoder (also the init order)."""
    specs = [("bert.embeddings.word_embeddings.weight", (V, C)),
             ("bert.embeddings.position_embeddings.weight", (S, C)),
             ("bert.embeddings.token_type_embeddings.weight", (T, C)),
             ("bert.embeddings.LayerNorm.weight", (C,)), ("bert.embeddings.LayerNorm.bias", (C,))]
    for i in range(L):
        specs += [(f"bert.encoder.layer.{i}.{suf}", shape) for suf, shape in LAYER_PARAMS]
    specs += [("bert.pooler.dense.weight", (C, C)), ("bert.pooler.dense.bias", (C,)),
              ("cls.predictions.bias", (V,)),
              ("cls.predictions.transform.dense.weight", (C, C)),
              ("cls.predictions.transform.dense.bias", (C,)),
              ("cls.predictions.transform.LayerNorm.weight", (C,)),
              ("cls.predictions.transform.LayerNorm.bias", (C,)),
              ("cls.seq_relationship.weight", (2, C)), ("cls.seq_relationship.bias", (2,))]
    return specs


def is_norm(name):
    return "LayerNorm" in name


def init_params(gen):
    params = {}
    for name, shape in param_specs():
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if is_norm(name) and name.endswith(".weight"):
            t = 1.0 + NORM_STD * z
        elif name.endswith(".bias"):
            t = BIAS_STD * z
        else:
            t = W_STD * z
        params[name] = t.contiguous()
    return params


def hf_config():
    return BertConfig(num_hidden_layers=L, hidden_size=C, num_attention_heads=NH,
                      intermediate_size=F_HID, vocab_size=V, max_position_embeddings=S,
                      type_vocab_size=T, layer_norm_eps=LN_EPS, hidden_act="gelu",
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      pad_token_id=PAD, tie_word_embeddings=True, attn_implementation="eager")


def make_model(params, dtype):
    model = BertForPreTraining(hf_config()).to(dtype).eval()
    sd = {n: t.to(dtype) for n, t in params.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}, missing
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    return model


# ----------------------------------------------------------------------------------------------------
# Batches: [CLS] A [SEP] B [SEP] [PAD]…, token types, ~15% of the segment positions masked (80%
# [MASK], 10% random, 10% kept), labels -100 elsewhere, a next-sentence label per sequence.

def make_batch(gen, lengths):
    ids = torch.full((B, S), PAD, dtype=torch.int64)
    types = torch.zeros((B, S), dtype=torch.int64)
    labels = torch.full((B, S), -100, dtype=torch.int64)
    for b, n in enumerate(lengths):
        p = n - 3
        a = 1 + int(torch.randint(p - 1, (1,), generator=gen))
        seg = torch.randint(0, CLS, (p,), generator=gen)
        ids[b, 0] = CLS
        ids[b, 1:1 + a] = seg[:a]
        ids[b, 1 + a] = SEP
        ids[b, 2 + a:n - 1] = seg[a:]
        ids[b, n - 1] = SEP
        types[b, 2 + a:n] = 1
        positions = [i for i in range(1, n - 1) if i != 1 + a]
        k = max(1, round(0.15 * n))
        chosen = torch.randperm(len(positions), generator=gen)[:k]
        for c in chosen.tolist():
            i = positions[c]
            labels[b, i] = ids[b, i]
            u = float(torch.rand((1,), generator=gen))
            if u < 0.8:
                ids[b, i] = MASK
            elif u >= 0.9:
                ids[b, i] = int(torch.randint(0, CLS, (1,), generator=gen))
    mask = (torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)
    nsp = torch.randint(0, 2, (B,), generator=gen)
    return ids, types, mask, labels, nsp


# ----------------------------------------------------------------------------------------------------
# The reference: transformers' model and its loss (masked_lm_loss + next_sentence_loss)

def forward(model, batch):
    ids, types, mask, labels, nsp = batch
    out = model(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels,
                next_sentence_label=nsp)
    return out.prediction_logits, out.seq_relationship_logits, out.loss


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    mlm, nsp, loss = forward(model, batch)
    loss.backward()
    named = dict(model.named_parameters())
    grads = {n: named[n].grad.detach().clone() for n, _ in param_specs()}
    return mlm.detach(), nsp.detach(), loss.detach(), grads


# ----------------------------------------------------------------------------------------------------
# A hand-written BERT forward: the math, spelled out, checked against transformers

def layernorm(x, w, b):
    m = x.mean(-1, keepdim=True)
    v = ((x - m) ** 2).mean(-1, keepdim=True)
    return (x - m) / torch.sqrt(v + LN_EPS) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def manual(p, batch):
    ids, types, mask, _, _ = batch
    lin = lambda x, n: x @ p[n + ".weight"].t() + p[n + ".bias"]
    x = (p["bert.embeddings.word_embeddings.weight"][ids] +
         p["bert.embeddings.position_embeddings.weight"][torch.arange(S)][None] +
         p["bert.embeddings.token_type_embeddings.weight"][types])
    x = layernorm(x, p["bert.embeddings.LayerNorm.weight"], p["bert.embeddings.LayerNorm.bias"])
    keep = mask.bool()[:, None, None, :]                 # (B, 1, 1, S): the real keys
    for i in range(L):
        h = f"bert.encoder.layer.{i}."
        q = lin(x, h + "attention.self.query").view(B, S, NH, HS).transpose(1, 2)
        k = lin(x, h + "attention.self.key").view(B, S, NH, HS).transpose(1, 2)
        v = lin(x, h + "attention.self.value").view(B, S, NH, HS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = torch.softmax(att.masked_fill(~keep, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, S, C)
        a = layernorm(x + lin(y, h + "attention.output.dense"),
                      p[h + "attention.output.LayerNorm.weight"], p[h + "attention.output.LayerNorm.bias"])
        x = layernorm(a + lin(gelu(lin(a, h + "intermediate.dense")), h + "output.dense"),
                      p[h + "output.LayerNorm.weight"], p[h + "output.LayerNorm.bias"])
    t = layernorm(gelu(lin(x, "cls.predictions.transform.dense")),
                  p["cls.predictions.transform.LayerNorm.weight"],
                  p["cls.predictions.transform.LayerNorm.bias"])
    mlm = t @ p["bert.embeddings.word_embeddings.weight"].t() + p["cls.predictions.bias"]
    nsp = lin(torch.tanh(lin(x[:, 0], "bert.pooler.dense")), "cls.seq_relationship")
    return mlm, nsp


# ----------------------------------------------------------------------------------------------------
# AdamW: torch.optim.AdamW with Strata's recipe, and by hand to check torch's is that formula

def lr_at(it):  # 1-based, runtime/engine/optimizer.cc's learning_rate
    if it <= WARMUP_ITERS:
        return LR_MAX * it / WARMUP_ITERS
    ratio = (it - WARMUP_ITERS) / (DECAY_ITERS - WARMUP_ITERS)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR_MAX - MIN_LR)


def decays(name):
    """Strata's ParamInfo::decay: weight matrices and embeddings, not biases or LayerNorms."""
    return name.endswith(".weight") and not is_norm(name)


def train_torch(params, batches, dtype):
    model = make_model(params, dtype)
    named = dict(model.named_parameters())
    groups = [
        {"params": [named[n] for n, _ in param_specs() if decays(n)], "weight_decay": WEIGHT_DECAY},
        {"params": [named[n] for n, _ in param_specs() if not decays(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR_MAX, betas=(BETA1, BETA2), eps=ADAM_EPS)
    losses, norms, lrs = [], [], []
    for k, batch in enumerate(batches):
        it = k + 1
        opt.zero_grad(set_to_none=True)
        _, _, loss = forward(model, batch)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP))
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        opt.step()
        losses.append(float(loss.detach())); norms.append(norm); lrs.append(lr_at(it))
    final = {n: named[n].detach().clone() for n, _ in param_specs()}
    return losses, norms, lrs, final


def train_by_hand(params, batches):
    """Strata's formula (runtime/engine/optimizer.h), float64: p -= lr*(mhat/(sqrt(vhat)+eps) + wd*p)."""
    model = make_model(params, torch.float64)
    named = dict(model.named_parameters())
    m = {n: torch.zeros_like(named[n]) for n, _ in param_specs()}
    v = {n: torch.zeros_like(named[n]) for n, _ in param_specs()}
    for k, batch in enumerate(batches):
        it = k + 1
        _, _, _, g = loss_and_grads(model, batch)
        norm = math.sqrt(sum(float((gi ** 2).sum()) for gi in g.values()))
        coef = min(1.0, GRAD_CLIP / (norm + 1e-6))
        with torch.no_grad():
            for n, _ in param_specs():
                p, gn = named[n], g[n] * coef
                m[n] = BETA1 * m[n] + (1 - BETA1) * gn
                v[n] = BETA2 * v[n] + (1 - BETA2) * gn * gn
                mhat, vhat = m[n] / (1 - BETA1 ** it), v[n] / (1 - BETA2 ** it)
                wd = WEIGHT_DECAY if decays(n) else 0.0
                p.copy_(p - lr_at(it) * (mhat / (torch.sqrt(vhat) + ADAM_EPS) + wd * p))
    return {n: named[n].detach().clone() for n, _ in param_specs()}


# ----------------------------------------------------------------------------------------------------

def self_checks(p64, model64, batch):
    mlm, nsp, loss = [t.detach() for t in forward(model64, batch)]
    mine_mlm, mine_nsp = manual(p64, batch)
    err = max(float((mine_mlm - mlm).abs().max() / mlm.abs().max()),
              float((mine_nsp - nsp).abs().max() / nsp.abs().max()))
    assert err < 1e-12, "hand-written BERT vs transformers: %g" % err
    _, _, _, labels, nsp_labels = batch
    counted = labels != -100
    logp = mlm - torch.logsumexp(mlm, dim=-1, keepdim=True)
    mlm_loss = -logp[counted].gather(-1, labels[counted][:, None]).mean()
    nlogp = nsp - torch.logsumexp(nsp, dim=-1, keepdim=True)
    nsp_loss = -nlogp.gather(-1, nsp_labels[:, None]).mean()
    assert abs(float(mlm_loss + nsp_loss) - float(loss)) < 1e-12, "loss"
    # padding: changing a padded position's token and type changes no real position's logits
    ids, types, mask, labels_, nsp_ = batch
    ids2, types2 = ids.clone(), types.clone()
    b = min(range(B), key=lambda i: LENGTHS[i])
    ids2[b, LENGTHS[b]:] = 5
    types2[b, LENGTHS[b]:] = 1
    with torch.no_grad():
        mlm2, nsp2, _ = forward(model64, (ids2, types2, mask, labels_, nsp_))
    real = mask.bool()
    assert torch.allclose(mlm2[real], mlm[real], rtol=0, atol=1e-12), "padding keys"
    assert torch.allclose(nsp2, nsp, rtol=0, atol=1e-12), "padding keys (pooler)"
    # autograd vs central finite differences (float64)
    _, _, _, g = loss_and_grads(model64, batch)
    named = dict(model64.named_parameters())
    gen = torch.Generator().manual_seed(1)
    for name in ["bert.embeddings.word_embeddings.weight", "bert.embeddings.token_type_embeddings.weight",
                 "bert.encoder.layer.0.attention.self.query.weight", "bert.encoder.layer.1.attention.self.key.bias",
                 "bert.encoder.layer.0.intermediate.dense.weight", "bert.encoder.layer.1.output.LayerNorm.weight",
                 "bert.pooler.dense.weight", "cls.predictions.bias", "cls.predictions.transform.dense.weight",
                 "cls.seq_relationship.weight"]:
        for _ in range(3):
            idx = int(torch.randint(named[name].numel(), (1,), generator=gen))
            h = 1e-6
            with torch.no_grad():
                named[name].view(-1)[idx] += h
                lp = float(forward(model64, batch)[2])
                named[name].view(-1)[idx] -= 2 * h
                lm = float(forward(model64, batch)[2])
                named[name].view(-1)[idx] += h
            fd, an = (lp - lm) / (2 * h), float(g[name].view(-1)[idx])
            assert abs(fd - an) <= 1e-7 + 1e-5 * abs(an), (name, idx, fd, an)
    print("self-checks: hand-written BERT vs transformers %.1e, loss, padding keys, finite "
          "differences: ok" % err)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "bert_tiny.safetensors"))
    args = ap.parse_args()

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    params32 = init_params(gen)                                             # 1. parameters
    batches = [make_batch(gen, LENGTHS)]                                    # 2. ten batches
    for _ in range(STEPS - 1):
        lengths = [int(x) for x in torch.randint(8, S + 1, (B,), generator=gen)]
        batches.append(make_batch(gen, lengths))
    batch = batches[0]

    p64 = {n: t.double() for n, t in params32.items()}
    model64 = make_model(params32, torch.float64)
    self_checks(p64, model64, batch)

    mlm, nsp, loss, grads = loss_and_grads(model64, batch)
    losses, norms, lrs, final = train_torch(params32, batches, torch.float64)
    assert abs(losses[0] - float(loss)) < 1e-12
    by_hand = train_by_hand(params32, batches)
    worst = max(float((by_hand[n] - final[n]).abs().max()) for n in final)
    # float64 rounding only (torch arranges the same formula differently): ~1e-12.
    assert worst < 1e-10, "torch.optim.AdamW differs from Strata's formula by %g" % worst
    print("torch.optim.AdamW vs Strata's AdamW by hand (float64): max |diff| %.1e" % worst)

    # float32 re-run of the same recipe: how far a correct fp32 implementation may drift
    model32 = make_model(params32, torch.float32)
    m32, n32, loss32, g32 = loss_and_grads(model32, batch)
    losses32, norms32, _, final32 = train_torch(params32, batches, torch.float32)

    def maxrel(a, b):
        return float((a.double() - b.double()).abs().max() / b.double().abs().max())
    # The key biases' gradient is 0 in exact arithmetic (the softmax of a row does not change when
    # q·b_k is added to all its scores), so theirs is rounding noise and Adam turns that noise into
    # whole steps: they are reported apart (tests/test_bert_golden.cc checks them apart too).
    key_bias = lambda n: n.endswith("attention.self.key.bias")
    gmax = max(float(grads[n].abs().max()) for n in grads)
    print("key biases: |grad| at most %.1e (fp64), %.1e (fp32), of the largest gradient %.1e" % (
        max(float(grads[n].abs().max()) for n in grads if key_bias(n)),
        max(float(g32[n].abs().max()) for n in grads if key_bias(n)), gmax))
    print("fp32 vs fp64 reference drift (max|diff| / max|ref|), key biases apart:")
    print("  mlm logits %.2e  nsp logits %.2e  loss %.2e" % (
        maxrel(m32, mlm), maxrel(n32, nsp), abs(float(loss32) - float(loss)) / float(loss)))
    print("  grads  %.2e (worst tensor: %s)" % max(
        (maxrel(g32[n], grads[n]), n) for n in grads if not key_bias(n)))
    print("  step losses %.2e  grad norms %.2e" % (
        max(abs(a - b) / b for a, b in zip(losses32, losses)),
        max(abs(a - b) / b for a, b in zip(norms32, norms))))
    print("  final params %.2e (worst tensor: %s), max|diff| %.2e; key biases max|diff| %.2e" % (
        *max((maxrel(final32[n], final[n]), n) for n in final if not key_bias(n)),
        max(float((final32[n].double() - final[n]).abs().max()) for n in final if not key_bias(n)),
        max(float((final32[n].double() - final[n]).abs().max()) for n in final if key_bias(n))))

    i32 = lambda t: t.to(torch.int32).contiguous()
    f32 = lambda t: t.to(torch.float32).contiguous()
    stack = lambda k: torch.stack([bt[k] for bt in batches])
    tensors = [(n, params32[n]) for n, _ in param_specs()]
    tensors += [("mlm_logits", f32(mlm)), ("nsp_logits", f32(nsp)), ("loss", f32(loss.reshape(1)))]
    tensors += [("grad." + n, f32(grads[n])) for n, _ in param_specs()]
    tensors += [("steps.input_ids", i32(stack(0))), ("steps.token_type_ids", i32(stack(1))),
                ("steps.attention_mask", i32(stack(2))), ("steps.labels", i32(stack(3))),
                ("steps.next_sentence_label", i32(stack(4))),
                ("steps.loss", torch.tensor(losses, dtype=torch.float32)),
                ("steps.grad_norm", torch.tensor(norms, dtype=torch.float32)),
                ("steps.lr", torch.tensor(lrs, dtype=torch.float32))]
    tensors += [("final." + n, f32(final[n])) for n, _ in param_specs()]

    config = {
        "arch": "bert", "num_layers": L, "hidden_size": C, "num_heads": NH,
        "ffn_hidden_size": F_HID, "seq_len": S, "vocab_size": V, "type_vocab_size": T,
        "layer_norm_eps": LN_EPS, "batch_size": B, "lengths": LENGTHS,
        "special_tokens": {"cls": CLS, "sep": SEP, "mask": MASK, "pad": PAD}, "seed": SEED,
        "init": "weights N(0, %g), LayerNorm weights 1 + N(0, %g), biases N(0, %g)" % (W_STD, NORM_STD, BIAS_STD),
        "lr": LR_MAX, "min_lr": MIN_LR, "warmup_iters": WARMUP_ITERS, "decay_iters": DECAY_ITERS,
        "decay": "cosine", "beta1": BETA1, "beta2": BETA2, "eps": ADAM_EPS,
        "weight_decay": WEIGHT_DECAY,
        "weight_decay_applies_to": "weight matrices and embeddings, not biases or LayerNorms",
        "grad_clip": GRAD_CLIP, "steps": STEPS, "optimizer": "torch.optim.AdamW",
        "loss": "masked_lm_loss (mean over labels != -100) + next_sentence_loss (mean over the batch)",
        "generator": "tests/golden/make_bert_fixture.py", "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    write_safetensors(args.out, tensors, {"config": json.dumps(config, sort_keys=True)})

    back, meta = read_safetensors(args.out)
    assert set(back) == {n for n, _ in tensors}
    for n, t in tensors:
        assert back[n].dtype == t.dtype and back[n].shape == t.shape and torch.equal(back[n], t), n
    assert json.loads(meta["config"]) == config

    size = os.path.getsize(args.out)
    assert size < 1024 * 1024, size
    print("wrote %s (%d bytes, %d tensors)" % (args.out, size, len(tensors)))
    print("loss at init: %.9f" % float(loss))
    print("step losses:", " ".join("%.6f" % x for x in losses))
    print("grad norms: ", " ".join("%.6f" % x for x in norms))
    print("lrs:        ", " ".join("%.6g" % x for x in lrs))


if __name__ == "__main__":
    main()
