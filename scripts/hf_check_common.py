"""What the Hugging Face round-trip checks (hf_llama_check.py, hf_bert_check.py) share: Strata's
sampling primitives in Python (runtime/data/data_source.cc's splitmix64 finaliser, gpt_dataset.cc's keyed
permutation), an llm.c token file writer, reading a save_pretrained directory, and running a
command that must succeed."""
import json
import os
import struct
import subprocess
import sys

from safetensors.torch import load_file

MASK64 = (1 << 64) - 1


def mix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def keyed_permutation(x, n, key):
    """gpt_dataset.cc's keyed bijection of [0, n): a 4-round Feistel network, cycle walking."""
    if n <= 1:
        return x
    bits = 1
    while (1 << bits) < n:
        bits += 1
    half = (bits + 1) // 2
    mask = (1 << half) - 1
    while True:
        l, r = x >> half, x & mask
        for rnd in range(4):
            f = mix64(key ^ ((rnd * 0x9E3779B97F4A7C15) & MASK64) ^ r) & mask
            l, r = r, l ^ f
        x = (l << half) | r
        if x < n:
            return x


def write_llmc_tokens(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def load_dir(d):
    """Every tensor of a save_pretrained directory (one file or shards)."""
    out = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, name)))
    return out


def weight_map(d):
    p = os.path.join(d, "model.safetensors.index.json")
    with open(p) as f:
        return json.load(f)["weight_map"]


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit("FAILED (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout))
    return r.stdout
