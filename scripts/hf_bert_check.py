#!/usr/bin/env python3
"""Strata against Hugging Face transformers on BERT (BertForPreTraining), end to end through files.

  (a) import: a random transformers BertForPreTraining saved with save_pretrained (float32,
      sharded); `strata train` with model.init_from = that directory runs one step at learning
      rate 0 writing a checkpoint; the loss Strata reports for that first iteration (fp32, CPU)
      must equal transformers' loss (masked_lm_loss + next_sentence_loss) on the same batch
      within 1e-5 relative. The batch is rebuilt here from an llm.c token file this script
      writes and from runtime/data/bert_dataset.cc's sampling (Megatron's BERT samples: pieces of
      documents, [CLS] A [SEP] B [SEP], next-sentence pairs, 15% masked 80/10/10, padding),
      reimplemented from its definition — so the check covers the sampler too.
  (b) round trip: `strata export` of that checkpoint gives back every tensor bit for bit, with
      the weight map save_pretrained wrote; from_pretrained loads it with nothing missing or
      unexpected; --dtype bf16 equals torch's bfloat16 rounding.
  (c) export: a BERT Strata initialised itself and trained 3 steps (lr 1e-3) is exported and
      loaded by transformers, whose logits on the batch of iteration 4 (masked LM over padded
      sequences and next sentence) give the loss Strata reported for iteration 4 (computed with
      those weights) within 1e-5 relative; and the export, given back to Strata as init_from,
      gives transformers' loss on the first batch.

Needs torch, transformers and safetensors (pip install torch transformers safetensors) and a
built strata (build/strata, or --strata). CI never runs it: no Python there.

Usage:  python3 scripts/hf_bert_check.py [--strata build/strata] [--keep DIR]
"""
import argparse
import json
import math
import os
import shutil
import tempfile

import torch
import transformers
from hf_check_common import (MASK64, keyed_permutation, load_dir, mix64, run, weight_map,
                             write_llmc_tokens)
from transformers import BertConfig, BertForPreTraining

SEED = 1234          # train.seed
B, S = 4, 16         # micro = global batch, seq_len
L, C, NH, F, V = 2, 64, 4, 96, 97
CLS, SEP, MASK, PAD = V - 4, V - 3, V - 2, V - 1   # Strata's default special tokens
N_TOKENS, VAL_FRACTION = 4000, 0.1
MASK_PROB, SHORT_SEQ_PROB = 0.15, 0.1
SHARD = "40KB"


# ---- the masked-LM sampling of runtime/data/bert_dataset.cc, in Python ----

def stream_word(key, i):
    return mix64((key + i * 0x9E3779B97F4A7C15) & MASK64)


def unit_double(w):
    return (w >> 11) * 2.0 ** -53


def order_key(seed, split, epoch):
    return mix64(mix64(seed ^ 0x4245525430524445) ^ ((split << 62) & MASK64) ^ epoch)


def sample_key(seed, split, s):
    return mix64(mix64(mix64(seed ^ 0x42455254534D504C) ^ split) ^ s)


def documents(tokens):
    """A token file's documents: chunks of clamp(n/20, 8·(S+1), 2^20) tokens (corpus_source.cc)."""
    n = len(tokens)
    chunk = min(max(n // 20, 8 * (S + 1)), 1 << 20)
    return [tokens[i:i + chunk] for i in range(0, n, chunk)]


def bert_sample(docs, s, split=0):
    """Sample s of the train split: (ids, types, attention mask, labels with -100, NSP label)."""
    D = len(docs)
    val = max(1, math.ceil(D * VAL_FRACTION))
    first, last = (0, D - val) if split == 0 else (D - val, D)
    Lmax = S - 3
    pieces_of = lambda n: (n + Lmax - 1) // Lmax if n >= 2 else 0
    starts = [0]
    for d in range(first, last):
        starts.append(starts[-1] + pieces_of(len(docs[d])))
    n = starts[-1]
    j = keyed_permutation(s % n, n, order_key(SEED, split, s // n))
    k = max(i for i in range(len(starts) - 1) if starts[i] <= j)
    doc = first + k
    ln, cuts, c = len(docs[doc]), pieces_of(len(docs[doc])), j - starts[k]
    begin = c * ln // cuts
    p = (c + 1) * ln // cuts - begin
    key = sample_key(SEED, split, s)
    w = [0]

    def word():
        w[0] += 1
        return stream_word(key, w[0] - 1)
    if unit_double(word()) < SHORT_SEQ_PROB:
        p = min(p, 2 + word() % (Lmax - 1))
    else:
        word()
    a = 1 + word() % (p - 1)
    seg_a = docs[doc][begin:begin + a]
    seg_b = docs[doc][begin + a:begin + p]
    label = 0
    if unit_double(word()) < 0.5:
        b_len = p - a
        for _ in range(10):
            d = first + word() % (last - first)
            dl = len(docs[d])
            at = word()
            if d == doc or dl < b_len:
                continue
            b0 = at % (dl - b_len + 1)
            seg_b = docs[d][b0:b0 + b_len]
            label = 1
            break
    ids = [CLS] + seg_a + [SEP] + seg_b + [SEP]
    total = len(ids)
    types = [0] * (len(seg_a) + 2) + [1] * (len(seg_b) + 1)
    labels = [-100] * total
    candidates = [i for i in range(1, total - 1) if i != len(seg_a) + 1]
    k_pred = min(max(1, int(math.floor(MASK_PROB * total + 0.5))), total - 3)
    w[0] = 1000
    for i in range(k_pred):
        jj = i + word() % (len(candidates) - i)
        candidates[i], candidates[jj] = candidates[jj], candidates[i]
        pos = candidates[i]
        labels[pos] = ids[pos]
        u = unit_double(word())
        if u < 0.8:
            ids[pos] = MASK
        elif u >= 0.9:
            while True:
                r = word() % CLS      # random_vocab: the ids below the special ones
                if r not in (CLS, SEP, MASK, PAD):
                    break
            ids[pos] = r
    pad = S - total
    return (ids + [PAD] * pad, types + [0] * pad, [1] * total + [0] * pad, labels + [-100] * pad,
            label)


def strata_batch(docs, it):
    rows = [bert_sample(docs, it * B + g) for g in range(B)]
    cols = list(zip(*rows))
    t = lambda x: torch.tensor(x, dtype=torch.long)
    return t(cols[0]), t(cols[1]), t(cols[2]), t(cols[3]), t(cols[4])


# ---- helpers ----

def hf_config():
    return BertConfig(num_hidden_layers=L, hidden_size=C, num_attention_heads=NH,
                      intermediate_size=F, vocab_size=V, max_position_embeddings=S,
                      type_vocab_size=2, layer_norm_eps=1e-12, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, pad_token_id=PAD,
                      attn_implementation="eager")


def random_bert(seed):
    torch.manual_seed(seed)
    model = BertForPreTraining(hf_config()).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * z)
            elif name.endswith("bias"):
                p.copy_(0.05 * z)
            else:
                p.copy_(0.08 * z)
    return model


def hf_loss(model, batch, dtype):
    ids, types, mask, labels, nsp = batch
    m = model.to(dtype)
    with torch.no_grad():
        out = m(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels,
                next_sentence_label=nsp)
    model.float()
    return float(out.loss)


def train_config(d, model_keys, tok_path, iterations, lr, ck_dir, init_from=None, interval=1):
    keys = dict(model_keys)
    if init_from:
        keys["init_from"] = init_from
    return {
        "model": keys,
        "train": {"micro_batch_size": B, "global_batch_size": B, "iterations": iterations,
                  "seed": SEED, "precision": "fp32", "eval_interval": 0, "threads": 1},
        "optimizer": {"lr": lr, "min_lr": lr, "warmup_iters": 0, "decay": "constant"},
        "data": {"source": "tokens", "path": tok_path, "val_fraction": VAL_FRACTION},
        "checkpoint": {"dir": ck_dir, "interval": interval},
        "log": {"interval": 1, "metrics": os.path.join(d, "metrics.jsonl")},
        "device": "cpu",
    }


def strata_train(strata, d, name, config):
    path = os.path.join(d, name + ".json")
    config["log"]["metrics"] = os.path.join(d, name + ".metrics.jsonl")
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    run([strata, "train", "--config", path])
    with open(config["log"]["metrics"]) as f:
        return [json.loads(line) for line in f]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.path.join(root, "build", "strata"))
    ap.add_argument("--keep", help="work in this directory and keep it")
    args = ap.parse_args()
    print("torch %s, transformers %s" % (torch.__version__, transformers.__version__))
    work = args.keep or tempfile.mkdtemp(prefix="strata_hf_bert_")
    if args.keep:
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
    strata = args.strata
    model_keys = dict(arch="bert", num_layers=L, hidden_size=C, num_heads=NH, ffn_hidden_size=F,
                      vocab_size=V, seq_len=S, type_vocab_size=2, layer_norm_eps=1e-12,
                      tie_embeddings=True)
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, CLS, (N_TOKENS,), generator=g).tolist()
    tok_path = os.path.join(work, "tokens.bin")
    write_llmc_tokens(tok_path, tokens)
    docs = documents(tokens)

    # (a) import
    hf_dir, ck_dir, ex_dir = (os.path.join(work, x) for x in ("hf", "ckpt", "export"))
    model = random_bert(seed=7)
    model.save_pretrained(hf_dir, max_shard_size=SHARD, safe_serialization=True)
    shards = [f for f in os.listdir(hf_dir) if f.startswith("model-")]
    assert len(shards) >= 2, shards
    saved = load_dir(hf_dir)
    print("(a) save_pretrained: %d shards of at most %s; tensors %d (decoder: %s)" % (
        len(shards), SHARD, len(saved), sorted(n for n in saved if "decoder" in n)))
    first = strata_train(strata, work, "import",
                         train_config(work, model_keys, tok_path, 1, 0.0, ck_dir, hf_dir))[0]
    batch = strata_batch(docs, 0)
    ref64, ref32 = hf_loss(model, batch, torch.float64), hf_loss(model, batch, torch.float32)
    rel = abs(first["loss"] - ref64) / ref64
    print("    loss of iteration 1: strata %.9f  transformers float64 %.9f  float32 %.9f" % (
        first["loss"], ref64, ref32))
    print("    relative difference strata vs float64 %.2e (tolerance 1e-5); transformers float32 "
          "vs float64 %.2e; %d masked positions, padding in %d of %d sequences" % (
              rel, abs(ref32 - ref64) / ref64, int((batch[3] != -100).sum()),
              int((batch[2] == 0).any(dim=1).sum()), B))
    assert rel < 1e-5, rel

    # (b) round trip
    run([strata, "export", "--checkpoint", ck_dir, "--out", ex_dir, "--max-shard-size", SHARD])
    ours = load_dir(ex_dir)
    assert set(ours) == set(saved), (set(ours) ^ set(saved))
    for n, t in saved.items():
        assert ours[n].dtype == torch.float32 and ours[n].shape == t.shape, n
        assert torch.equal(ours[n].view(torch.int32), t.view(torch.int32)), "bits differ: " + n
    assert weight_map(ex_dir) == weight_map(hf_dir), "the export shards unlike save_pretrained"
    loaded, info = BertForPreTraining.from_pretrained(ex_dir, output_loading_info=True,
                                                      attn_implementation="eager")
    bad = {k: v for k, v in info.items() if v}
    assert not bad, "from_pretrained on the export: %s" % bad
    bf_dir = ex_dir + "-bf16"
    run([strata, "export", "--checkpoint", ck_dir, "--out", bf_dir, "--dtype", "bf16"])
    bf = load_dir(bf_dir)
    for n, t in saved.items():
        assert torch.equal(bf[n].view(torch.int16), t.to(torch.bfloat16).view(torch.int16)), n
    print("(b) init_from -> 1 step at lr 0 -> export: %d tensors equal bit for bit, weight map "
          "identical to save_pretrained's, from_pretrained loads it cleanly; --dtype bf16 equals "
          "torch's rounding" % len(saved))

    # (c) export of a model Strata initialised and trained
    own_ck, own_ex = os.path.join(work, "own-ckpt"), os.path.join(work, "own-export")
    steps = strata_train(strata, work, "own",
                         train_config(work, model_keys, tok_path, 4, 1e-3, own_ck, interval=3))
    run([strata, "export", "--checkpoint", os.path.join(own_ck, "iter_3"), "--out", own_ex])
    exported, info = BertForPreTraining.from_pretrained(own_ex, output_loading_info=True,
                                                       attn_implementation="eager")
    bad = {k: v for k, v in info.items() if v}
    assert not bad, "from_pretrained on Strata's own export: %s" % bad
    exported.eval()
    batch4 = strata_batch(docs, 3)
    ref = hf_loss(exported, batch4, torch.float64)
    rel4 = abs(steps[3]["loss"] - ref) / ref
    print("(c) Strata's own model after 3 steps, exported: iteration 4 loss strata %.9f, "
          "transformers on the export %.9f: relative %.2e (tolerance 1e-5)" % (
              steps[3]["loss"], ref, rel4))
    assert rel4 < 1e-5, rel4
    with open(os.path.join(own_ex, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "bert" and cfg["architectures"] == ["BertForPreTraining"], cfg
    # Its logits, loaded back into Strata: the loss of iteration 4's batch from the export.
    back_ck = os.path.join(work, "back-ckpt")
    again = strata_train(strata, work, "back",
                         train_config(work, model_keys, tok_path, 1, 0.0, back_ck, own_ex))[0]
    ref1 = hf_loss(exported, strata_batch(docs, 0), torch.float64)
    rel1 = abs(again["loss"] - ref1) / ref1
    print("    the export back into Strata (init_from): iteration 1 loss %.9f, transformers "
          "%.9f: relative %.2e" % (again["loss"], ref1, rel1))
    assert rel1 < 1e-5, rel1
    if not args.keep:
        shutil.rmtree(work)
    print("all checks passed")


if __name__ == "__main__":
    main()
