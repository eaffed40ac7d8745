#!/usr/bin/env python3
"""Strata against Hugging Face transformers on a Llama, end to end through files.

For each of two tiny random Llamas (untied with plain RoPE; tied with rope_theta 500000 and a
llama3 rope_scaling):
  (a) transformers.LlamaForCausalLM.save_pretrained in float32, sharded (max_shard_size small
      enough for several shards);
  (b) `strata train` with model.init_from = that directory, one step at learning rate 0 writing a
      checkpoint (the step changes no weight: p - 0 * update == p), then `strata export` of the
      checkpoint to a directory with the same max shard size; every tensor of the export must
      equal the original bit for bit, the export's weight map must be the one save_pretrained
      wrote, and from_pretrained must load it with no missing or unexpected key; the --dtype bf16
      export must equal torch's bfloat16 rounding of the weights bit for bit;
  (c) the loss Strata reports for its first iteration (fp32, CPU) against transformers' loss
      on the same batch: the batch is rebuilt here from an llm.c token file this script writes
      and from runtime/data/data_source.cc's sampling (splitmix64 keyed by seed, split, iteration, slot).
      Relative difference must be below 1e-5 (float64 and float32 references both printed).

Needs torch, transformers and safetensors (pip install torch transformers safetensors) and a
built strata (build/strata, or --strata). CI never runs it: no Python there.

Usage:  python3 scripts/hf_llama_check.py [--strata build/strata] [--keep DIR]
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
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 1234        # train.seed: the data stream's key
B, S = 4, 16       # micro = global batch, seq_len
N_TOKENS, VAL_FRACTION = 400, 0.1
SHARD = "40KB"


# ---- the sampling of a `tokens` source (runtime/data/corpus_source.cc, gpt_dataset.cc), in Python ----

def shuffle_key(seed, split, epoch, which):
    return mix64(mix64(seed ^ 0x5EED0FDA7A5E7) ^ ((split << 62) & MASK64) ^ (epoch << 1) ^ which)


def strata_batch(tokens, it):
    """Training batch `it` (0-based) of one process: the shard is cut into documents (chunks of
    clamp(n/20, 8·(S+1), 2^20) tokens when it has fewer than 20 of 2^20), the last
    ⌈val_fraction · documents⌉ are validation; sample s = it·B + g of epoch 0 is sample
    keyed_permutation(s) of the train documents concatenated in keyed_permutation order."""
    n = len(tokens)
    chunk = min(max(n // 20, 8 * (S + 1)), 1 << 20)
    docs = [tokens[i:i + chunk] for i in range(0, n, chunk)]
    train = docs[:len(docs) - max(1, math.ceil(len(docs) * VAL_FRACTION))]
    order = [keyed_permutation(k, len(train), shuffle_key(SEED, 0, 0, 0)) for k in range(len(train))]
    stream = [t for k in order for t in train[k]]
    samples = (len(stream) - 1) // S
    rows = []
    for g in range(B):
        s = it * B + g
        assert s < samples, "the check reads epoch 0 only"
        j = keyed_permutation(s, samples, shuffle_key(SEED, 0, 0, 1))
        rows.append(stream[j * S:j * S + S + 1])
    t = torch.tensor(rows, dtype=torch.long)
    return t[:, :S], t[:, 1:]


# ---- helpers ----

def random_llama(cfg, seed):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # Larger than initializer_range so the logits are far from uniform; norms around 1.
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_(1.0 + 0.1 * z if name.endswith("norm.weight") else 0.08 * z)
    return model


def mean_loss(model, inputs, targets, dtype):
    m = model.to(dtype)
    with torch.no_grad():
        logits = m(inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1))
    model.float()
    return float(loss)


# ---- one case ----

def check(name, cfg, strata, work, model_keys):
    print("== %s: L=%d C=%d NH=%d KVH=%d F=%d V=%d tie=%s rope_theta=%g rope_scaling=%s" % (
        name, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
        cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings,
        cfg.rope_theta if hasattr(cfg, "rope_theta") else cfg.rope_parameters["rope_theta"],
        json.dumps(getattr(cfg, "rope_scaling", None))))
    d = os.path.join(work, name)
    os.makedirs(d)
    hf_dir, ck_dir, ex_dir = (os.path.join(d, x) for x in ("hf", "ckpt", "export"))
    model = random_llama(cfg, seed=7)

    # (a) transformers' sharded f32 save
    model.save_pretrained(hf_dir, max_shard_size=SHARD, safe_serialization=True)
    shards = [f for f in os.listdir(hf_dir) if f.startswith("model-")]
    assert len(shards) >= 2, shards
    print("(a) save_pretrained: %d shards of at most %s" % (len(shards), SHARD))

    # (b) strata: init_from the directory, one step at lr 0 with a checkpoint, then export
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, cfg.vocab_size, (N_TOKENS,), generator=g).tolist()
    tok_path = os.path.join(d, "tokens.bin")
    write_llmc_tokens(tok_path, tokens)
    metrics = os.path.join(d, "metrics.jsonl")
    config = {
        "model": dict(model_keys, init_from=hf_dir),
        "parallel": {"tensor": 1, "pipeline": 1},
        "train": {"micro_batch_size": B, "global_batch_size": B, "iterations": 1, "seed": SEED,
                  "precision": "fp32", "eval_interval": 0, "threads": 1},
        "optimizer": {"lr": 0.0, "min_lr": 0.0, "warmup_iters": 0},
        "data": {"source": "tokens", "path": tok_path, "val_fraction": VAL_FRACTION},
        "checkpoint": {"dir": ck_dir, "interval": 1},
        "log": {"interval": 1, "metrics": metrics},
        "device": "cpu",
    }
    cfg_path = os.path.join(d, "train.json")
    with open(cfg_path, "w") as f:
        json.dump(config, f, indent=2)
    run([strata, "train", "--config", cfg_path])
    run([strata, "export", "--checkpoint", ck_dir, "--out", ex_dir, "--max-shard-size", SHARD])
    ours, theirs = load_dir(ex_dir), load_dir(hf_dir)
    assert set(ours) == set(theirs), (set(ours) ^ set(theirs))
    for n, t in theirs.items():
        assert ours[n].dtype == torch.float32 and ours[n].shape == t.shape, n
        assert torch.equal(ours[n].view(torch.int32), t.view(torch.int32)), "bits differ: " + n
    assert weight_map(ex_dir) == weight_map(hf_dir), "the export shards unlike save_pretrained"
    loaded, info = LlamaForCausalLM.from_pretrained(ex_dir, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, "from_pretrained on the export: %s" % bad
    print("(b) init_from -> 1 step at lr 0 -> export: %d tensors equal bit for bit, weight map "
          "identical to save_pretrained's, from_pretrained loads it cleanly" % len(theirs))
    bf_dir = ex_dir + "-bf16"
    run([strata, "export", "--checkpoint", ck_dir, "--out", bf_dir, "--dtype", "bf16"])
    bf = load_dir(bf_dir)
    for n, t in theirs.items():
        assert bf[n].dtype == torch.bfloat16, n
        assert torch.equal(bf[n].view(torch.int16), t.to(torch.bfloat16).view(torch.int16)), n
    with open(os.path.join(bf_dir, "config.json")) as f:
        assert json.load(f)["dtype"] == "bfloat16"
    print("    --dtype bf16: every tensor equals torch's bfloat16 rounding bit for bit")

    # (c) the first iteration's loss against transformers' on the same batch
    with open(metrics) as f:
        first = json.loads(f.readline())
    assert first["iter"] == 1
    inputs, targets = strata_batch(tokens, 0)
    ref64 = mean_loss(loaded, inputs, targets, torch.float64)
    ref32 = mean_loss(loaded, inputs, targets, torch.float32)
    rel = abs(first["loss"] - ref64) / ref64
    print("(c) loss: strata %.9f  transformers float64 %.9f  float32 %.9f" % (
        first["loss"], ref64, ref32))
    print("    relative difference strata vs float64 %.2e (tolerance 1e-5), transformers "
          "float32 vs float64 %.2e" % (rel, abs(ref32 - ref64) / ref64))
    assert rel < 1e-5, rel
    if model_keys["rope_scaling"]:
        # The comparison sees the scaling: the same weights without it give another loss.
        plain = LlamaConfig.from_pretrained(ex_dir)
        plain.rope_parameters = {"rope_type": "default", "rope_theta": model_keys["rope_theta"]}
        unscaled = LlamaForCausalLM(plain).eval()
        unscaled.load_state_dict(loaded.state_dict())
        other = mean_loss(unscaled, inputs, targets, torch.float64)
        print("    without the rope scaling transformers' loss would be %.9f (%.1e relative away)"
              % (other, abs(other - ref64) / ref64))
        assert abs(other - ref64) / ref64 > 1e-4
    return rel


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.path.join(root, "build", "strata"))
    ap.add_argument("--keep", help="work in this directory and keep it")
    args = ap.parse_args()
    print("torch %s, transformers %s" % (torch.__version__, transformers.__version__))
    work = args.keep or tempfile.mkdtemp(prefix="strata_hf_llama_")
    if args.keep:
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
    common = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, vocab_size=97,
                  max_position_embeddings=S, rms_norm_eps=1e-5, attn_implementation="eager")
    untied = LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=False)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
    tied = LlamaConfig(**common, rope_theta=500000.0, rope_scaling=dict(scaling),  # (it adds keys)
                       tie_word_embeddings=True)
    keys = dict(arch="llama", num_layers=2, hidden_size=64, num_heads=4, num_key_value_heads=2,
                ffn_hidden_size=128, vocab_size=97, seq_len=S, rms_norm_eps=1e-5)
    check("untied", untied, args.strata, work,
          dict(keys, tie_embeddings=False, rope_theta=10000.0, rope_scaling=None))
    check("tied_llama3_rope", tied, args.strata, work,
          dict(keys, tie_embeddings=True, rope_theta=500000.0, rope_scaling=scaling))
    if not args.keep:
        shutil.rmtree(work)
    print("all checks passed")


if __name__ == "__main__":
    main()
