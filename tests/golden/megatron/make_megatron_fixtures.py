#!/usr/bin/env python3
"""Megatron-Core compatibility fixtures for Strata's indexed dataset (runtime/data/indexed.h).

(a) Writes, with megatron-core's own IndexedDatasetBuilder:
      mc_uint16.{idx,bin}  300 documents of 0..150 uint16 tokens, one sequence per document
                           (what tools/preprocess_data.py writes for GPT), three of them empty
      mc_int32.{idx,bin}   250 documents of 0..120 int32 tokens up to 199999, every tenth one
                           split into 2 or 3 sequences (as --split-sentences writes)
    and the expected documents, mc_uint16.json and mc_int32.json:
      {"dtype": ..., "documents": [[token, ...], ...], "sequence_lengths": [[n, ...], ...]}
    then reads both back with IndexedDataset and checks them against those lists.
(b) Reads strata_written.{idx,bin} (Strata's IndexedDatasetWriter over mc_uint16.json's
    documents; tests/test_data_formats.cc writes it when STRATA_UPDATE_GOLDEN=1) with
    megatron-core's IndexedDataset and checks the same documents and tokens, and that its bytes
    equal mc_uint16's (Megatron's builder and Strata's writer agree byte for byte).

Usage:  python3 make_megatron_fixtures.py [--out DIR] [--check-only]
Needs megatron-core (pip install megatron-core; it imports torch). Deterministic: the documents
come from numpy's PCG64 seeded 24, so re-running rewrites identical files.
"""
import argparse
import json
import os
import sys

import numpy

from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


def make_documents(rng, count, max_len, vocab, split_every):
    docs, seqs = [], []
    for i in range(count):
        n = int(rng.integers(0, max_len + 1))
        if i in (7, 150, count - 1):
            n = 0
        tokens = rng.integers(0, vocab, size=n).tolist()
        lengths = [n]
        if split_every and i % split_every == 3 and n >= 3:
            parts = int(rng.integers(2, 4))
            cuts = sorted(rng.choice(numpy.arange(1, n), size=parts - 1, replace=False).tolist())
            bounds = [0] + cuts + [n]
            lengths = [bounds[k + 1] - bounds[k] for k in range(parts)]
        docs.append(tokens)
        seqs.append(lengths)
    return docs, seqs


def build(prefix, dtype, docs, seqs):
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for tokens, lengths in zip(docs, seqs):
        builder.add_document(numpy.array(tokens, dtype=numpy.int64), lengths)
    builder.finalize(prefix + ".idx")


def read_documents(prefix):
    """The documents of a dataset as Megatron reads it: each document's sequences, joined."""
    ds = IndexedDataset(prefix, mmap=True)
    di = ds.document_indices
    docs = []
    for d in range(len(di) - 1):
        parts = [ds[s].tolist() for s in range(int(di[d]), int(di[d + 1]))]
        docs.append([t for p in parts for t in p])
    return ds, docs


def check(prefix, expected, dtype_name):
    ds, docs = read_documents(prefix)
    assert ds.index.dtype.__name__ == dtype_name, (prefix, ds.index.dtype)
    assert len(docs) == len(expected), (prefix, len(docs), len(expected))
    for d, (got, want) in enumerate(zip(docs, expected)):
        assert got == want, f"{prefix}: document {d} differs"
    print(f"ok: {prefix} read by megatron-core: {len(docs)} documents, "
          f"{sum(map(len, docs))} {dtype_name} tokens as expected")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=here)
    ap.add_argument("--check-only", action="store_true", help="skip (a), only read and check")
    args = ap.parse_args()
    out = args.out

    variants = {
        "uint16": dict(dtype=numpy.uint16, count=300, max_len=150, vocab=65500, split_every=0),
        "int32": dict(dtype=numpy.int32, count=250, max_len=120, vocab=200000, split_every=10),
    }
    rng = numpy.random.default_rng(24)
    for name, v in variants.items():
        prefix = os.path.join(out, "mc_" + name)
        docs, seqs = make_documents(rng, v["count"], v["max_len"], v["vocab"], v["split_every"])
        if not args.check_only:
            build(prefix, v["dtype"], docs, seqs)
            with open(prefix + ".json", "w") as f:
                json.dump({"dtype": name, "documents": docs, "sequence_lengths": seqs}, f,
                          separators=(",", ":"))
                f.write("\n")
        with open(prefix + ".json") as f:
            expected = json.load(f)
        check(prefix, expected["documents"], name)

    strata = os.path.join(out, "strata_written")
    if not os.path.exists(strata + ".idx"):
        print(f"missing {strata}.idx: run STRATA_UPDATE_GOLDEN=1 build/tests/test_data_formats "
              "--gtest_filter='*StrataWritten*' first", file=sys.stderr)
        return 1
    with open(os.path.join(out, "mc_uint16.json")) as f:
        expected = json.load(f)["documents"]
    check(strata, expected, "uint16")
    for ext in (".idx", ".bin"):
        with open(strata + ext, "rb") as a, open(os.path.join(out, "mc_uint16" + ext), "rb") as b:
            assert a.read() == b.read(), f"strata_written{ext} differs from mc_uint16{ext}"
    print("ok: strata_written.{idx,bin} are byte-identical to megatron-core's mc_uint16.{idx,bin}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
