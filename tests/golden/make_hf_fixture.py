#!/usr/bin/env python3
"""Generate tests/golden/hf_gpt2_tiny.safetensors: Hugging Face transformers' logits for a model
that Strata exported, the outside reference for `strata export` and model.init_from.

Steps (tests/golden/README.md):
  1. build/strata train --config tests/golden/hf_tiny_train.json
     build/strata export --checkpoint /tmp/strata_hf_fixture_ckpt --out /tmp/tiny_export.safetensors
  2. python3 tests/golden/make_hf_fixture.py --export /tmp/tiny_export.safetensors

The export is loaded exactly as a user would load it: GPT2LMHeadModel.from_pretrained on a
directory holding config.json and the file as model.safetensors; every weight must be used and
none missing. The logits of fixed tokens are computed in float64 (the model upcast) and stored in
float32 beside the exported tensors and the tokens, so the C++ test needs only this one file.

Needs torch and transformers (pip install torch transformers) for generating only; CI never
runs this script.
"""
import argparse
import json
import os
import shutil
import struct
import tempfile

import torch
import transformers
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

L, C, NH, F_HID, S, V, B = 2, 32, 4, 128, 16, 64, 2  # keep in sync with tests/golden/hf_tiny_train.json


def tokens():
    # A fixed LCG so the tokens need no RNG library: (B, S) in [0, V).
    x, out = 12345, []
    for _ in range(B * S):
        x = (1103515245 * x + 12345) % (1 << 31)
        out.append((x >> 16) % V)
    return torch.tensor(out, dtype=torch.long).view(B, S)


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--export", required=True, help="a file written by strata export")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "hf_gpt2_tiny.safetensors"))
    args = ap.parse_args()

    config = GPT2Config(n_layer=L, n_embd=C, n_head=NH, n_inner=F_HID, n_positions=S, vocab_size=V,
                        activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
    with tempfile.TemporaryDirectory() as d:
        config.save_pretrained(d)
        shutil.copy(args.export, os.path.join(d, "model.safetensors"))
        model, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"transformers did not load every weight exactly: {bad}"
    model = model.double().eval()
    tok = tokens()
    with torch.no_grad():
        logits = model(tok).logits.float()  # (B, S, V)
    print(f"logits {tuple(logits.shape)}, |max| {logits.abs().max().item():.4f}")

    exported = load_file(args.export)
    tensors = {}
    for name, t in exported.items():
        t = t.contiguous().float()
        tensors[name] = ("F32", t.shape, t.numpy().tobytes())
    tensors["tokens"] = ("I32", tok.shape, tok.to(torch.int32).numpy().tobytes())
    tensors["logits"] = ("F32", logits.shape, logits.contiguous().numpy().tobytes())
    write_safetensors(args.out, tensors, {"torch": torch.__version__,
                                          "transformers": transformers.__version__,
                                          "made_by": "tests/golden/make_hf_fixture.py"})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
