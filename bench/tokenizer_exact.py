#!/usr/bin/env python3
"""Strata's ids against tiktoken's, document by document, for any tiktoken ranks file.

`strata data prepare` (Megatron format, --no-eod) tokenizes the documents of --jsonl (optional)
plus generated ones that reach every path of the merge: random-letter words up to 5,000 bytes
(the heap merge beyond 64 bytes), runs of one letter, two letters, digits, spaces, punctuation and
CJK, special tokens written in text. Each document's ids are compared with tiktoken's
encode_ordinary (or encode(allowed_special="all") with --allow-special), the Encoding built from
the same ranks file and pattern (<|endoftext|> at the rank count for gpt2, Llama 3's 256 special
tokens for llama3). Prints the number of documents that differ. Needs tiktoken and numpy; not run
in CI (the golden fixtures of tests/golden/tokenizer are).

usage: python3 bench/tokenizer_exact.py --ranks FILE [--pattern gpt2|llama3] [--jsonl DOCS.jsonl]
       [--allow-special] [--strata build/strata] [--workdir DIR]
e.g. the real GPT-2 and Whisper vocabularies (pip install openai-whisper ships them):
       python3 bench/tokenizer_exact.py --ranks .../whisper/assets/multilingual.tiktoken
"""
import argparse
import base64
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "golden", "tokenizer"))


def generated_documents(seed=5):
    r = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    docs = []
    for _ in range(200):
        n = r.choice([65, 100, 200, 1000, 5000])
        docs.append("".join(r.choice(letters) for _ in range(n)))
        docs.append(" " * n + "x")
        docs.append("".join(r.choice("0123456789") for _ in range(n)))
        docs.append("".join(r.choice("ab") for _ in range(n)))
        docs.append("a" * n)
        docs.append("".join(chr(r.randint(0x4E00, 0x9FFF)) for _ in range(n // 3)))
        docs.append("".join(r.choice("!@#$%^&*()") for _ in range(n)))
        docs.append(" ".join("".join(r.choice(letters) for _ in range(r.randint(5, 12)))
                             for _ in range(200)))
    docs += ["x<|endoftext|>y", "<|endoftext|>", " <|endoftext|>\n\nHello<|endoftext|>",
             "<|begin_of_text|>a<|eot_id|>"]
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", required=True)
    ap.add_argument("--pattern", default="gpt2", choices=["gpt2", "llama3"])
    ap.add_argument("--jsonl")
    ap.add_argument("--allow-special", action="store_true")
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
    ap.add_argument("--workdir")
    args = ap.parse_args()

    import numpy as np
    import tiktoken
    from make_tokenizer_fixtures import GPT2_PATTERN, LLAMA3_PATTERN, LLAMA3_SPECIALS

    ranks = {}
    for line in open(args.ranks, "rb"):
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    n = len(ranks)
    if args.pattern == "gpt2":
        enc = tiktoken.Encoding("exact", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                special_tokens={"<|endoftext|>": n})
    else:
        enc = tiktoken.Encoding("exact", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                                special_tokens={s: n + i for i, s in enumerate(LLAMA3_SPECIALS)})

    docs = [json.loads(l)["text"] for l in open(args.jsonl)] if args.jsonl else []
    docs += generated_documents()
    work = args.workdir or tempfile.mkdtemp(prefix="tokenizer_exact_")
    inp, out = os.path.join(work, "docs.jsonl"), os.path.join(work, "ids")
    with open(inp, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    cmd = [args.strata, "data", "prepare", "--tokenizer", args.ranks, "--pattern", args.pattern,
           "--input", inp, "--output", out, "--no-eod"]
    if args.allow_special:
        cmd.append("--allow-special")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

    idx = open(out + ".idx", "rb").read()
    count = struct.unpack_from("<Q", idx, 18)[0]
    dtype = {8: np.uint16, 4: np.int32}[idx[17]]
    lengths = np.frombuffer(idx, np.int32, count, 34)
    ids = np.fromfile(out + ".bin", dtype)
    differ, at = 0, 0
    for i, d in enumerate(docs):
        got = ids[at:at + lengths[i]].tolist()
        at += lengths[i]
        want = enc.encode(d, allowed_special="all") if args.allow_special else enc.encode_ordinary(d)
        if got != want:
            differ += 1
            if differ <= 3:
                print(f"document {i} ({len(d)} characters) differs: strata {got[:8]}..., "
                      f"tiktoken {want[:8]}...")
    print(f"{len(docs)} documents, {at} ids, {differ} differ")
    if not args.workdir:
        shutil.rmtree(work)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
