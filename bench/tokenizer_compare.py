#!/usr/bin/env python3
"""Encode throughput of Strata's tokenizer beside tiktoken and Hugging Face tokenizers.

One run: the same text file (repeated --repeat times), cut into documents at blank lines exactly as
bench_tokenizer cuts it, encoded by
  strata      build/bench/bench_tokenizer (Tokenizer::encode_batch, special tokens recognised)
  tiktoken    Encoding.encode_batch(docs, num_threads=N, allowed_special="all"), the Encoding built
              from the tiktoken ranks file and pattern
  tokenizers  Tokenizer.encode_batch_fast (or encode_batch) with add_special_tokens=False, in a
              child process with RAYON_NUM_THREADS=N (rayon's pool size is fixed at first use)
at each thread count, and the references on the whole text as one string (one thread, their best
case); best of --runs runs, each with a freshly loaded tokenizer. Checks that the
three give the same number of ids, and prints MB/s (10^6 bytes of text per second) side by side.

Defaults: the gpt2_style fixture of tests/golden/tokenizer on ../shared/data/tinyshakespeare.txt.
usage: /work/venv-hf/bin/python bench/tokenizer_compare.py [--name gpt2_style|llama3_style]
       [--file TEXT] [--repeat N] [--threads 1,2] [--runs R] [--bench build/bench/bench_tokenizer]
"""
import argparse
import base64
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "golden", "tokenizer")
sys.path.insert(0, FIXTURES)


def documents(path, repeat):
    """The text repeated, cut at blank lines as bench_tokenizer cuts it (its tiktoken child too)."""
    text = open(path, "rb").read() * repeat
    docs, start = [], 0
    while start < len(text):
        end = text.find(b"\n\n", start)
        end = len(text) if end < 0 else end + 2
        docs.append(text[start:end].decode("utf-8", errors="replace"))
        start = end
    return docs, len(text)


def run_tokenizers(json_path, text, repeat, threads, runs):
    """In a child process: rayon reads RAYON_NUM_THREADS once."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    out = subprocess.run([sys.executable, __file__, "--hf-child", json_path, text, str(repeat),
                          str(runs)], env=env, check=True, capture_output=True, text=True).stdout
    seconds, ids = out.split()
    return float(seconds), int(ids)


def hf_child(json_path, text, repeat, runs):
    from tokenizers import Tokenizer
    docs, _ = documents(text, int(repeat))
    best, ids = 1e30, 0
    for _ in range(int(runs)):
        tok = Tokenizer.from_file(json_path)
        enc = getattr(tok, "encode_batch_fast", tok.encode_batch)
        t0 = time.perf_counter()
        out = enc(docs, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
        ids = sum(len(e.ids) for e in out)
    print(best, ids)


def read_ranks(path):
    """A tiktoken ranks file as {token bytes: rank} (bench_tokenizer's tiktoken child uses it too)."""
    ranks = {}
    for line in open(path, "rb"):
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def tiktoken_encoding(name, ranks_path):
    import tiktoken
    from make_tokenizer_fixtures import GPT2_PATTERN, LLAMA3_PATTERN, LLAMA3_SPECIALS
    ranks = read_ranks(ranks_path)
    n = len(ranks)
    if name.startswith("gpt2"):
        return tiktoken.Encoding(name, pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                 special_tokens={"<|endoftext|>": n})
    return tiktoken.Encoding(name, pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                             special_tokens={s: n + i for i, s in enumerate(LLAMA3_SPECIALS)})


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--hf-child":
        hf_child(*sys.argv[2:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="gpt2_style")
    ap.add_argument("--file", default=os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt"))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "bench_tokenizer"))
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    json_path = os.path.join(FIXTURES, args.name + ".tokenizer.json")
    ranks_path = os.path.join(FIXTURES, args.name + ".tiktoken")
    pattern = "gpt2" if args.name.startswith("gpt2") else "llama3"
    docs, nbytes = documents(args.file, args.repeat)
    print(f"# {args.name} on {args.file} x{args.repeat}: {nbytes} bytes, {len(docs)} documents, "
          f"best of {args.runs}")

    rows = {}
    for kind, path in (("json", json_path), ("tiktoken", ranks_path)):
        out = subprocess.run([args.bench, path, args.file, "--pattern", pattern, "--repeat",
                              str(args.repeat), "--threads", args.threads, "--runs", str(args.runs),
                              "--unique-mb", "0", "--compare", "none"],
                             check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("strata "):
                f = dict(kv.split("=") for kv in line.split()[1:])
                rows.setdefault(f"strata ({kind})", {})[int(f["threads"])] = (float(f["seconds"]),
                                                                             int(f["ids"]))
    enc = None
    for t in threads:
        best, ids = 1e30, 0
        for _ in range(args.runs):
            enc = tiktoken_encoding(args.name, ranks_path)
            t0 = time.perf_counter()
            out = enc.encode_batch(docs, num_threads=t, allowed_special="all")
            best = min(best, time.perf_counter() - t0)
            ids = sum(len(o) for o in out)
        rows.setdefault("tiktoken", {})[t] = (best, ids)
        rows.setdefault("tokenizers", {})[t] = run_tokenizers(json_path, args.file, args.repeat, t,
                                                              args.runs)

    # The references' best case beside their batch APIs: the whole text as one string, one thread
    # (no per-document Python overhead).
    from tokenizers import Tokenizer
    whole = "".join(docs)
    for name, enc_one in (("tiktoken (one str)", lambda: tiktoken_encoding(args.name, ranks_path)),
                          ("tokenizers (one str)", lambda: Tokenizer.from_file(json_path))):
        best = 1e30
        for _ in range(args.runs):
            e = enc_one()
            t0 = time.perf_counter()
            if name.startswith("tiktoken"):
                e.encode(whole, allowed_special="all")
            else:
                e.encode(whole, add_special_tokens=False)
            best = min(best, time.perf_counter() - t0)
        rows[name] = {threads[0]: (best, None)}

    counts = {ids for r in rows.values() for (_, ids) in r.values() if ids is not None}
    print(f"{'MB/s':20s}" + "".join(f"{str(t) + ' thread' + ('s' if t > 1 else ''):>12s}"
                                     for t in threads))
    for name, r in rows.items():
        print(f"{name:20s}" + "".join(f"{nbytes / r[t][0] / 1e6:12.1f}" if t in r else f"{'':>12s}"
                                      for t in threads))
    print("ids per run:", ", ".join(str(c) for c in sorted(counts)),
          "(all equal)" if len(counts) == 1 else "(DIFFER)")


if __name__ == "__main__":
    main()
