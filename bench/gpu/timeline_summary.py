#!/usr/bin/env python3
"""Where one training iteration's time goes on the GPU, from a cupti_trace timeline.

Usage: timeline_summary.py TRACE.json[.gz] [--top N]

TRACE is what bench/gpu/cupti_trace.cc writes (Chrome trace events: pid 1 the GPU's kernels,
memcpys and memsets, pid 0 the host's CUDA runtime calls). Iterations are told apart by the
optimizer: the first AdamW kernel after a pause of more than 5 ms of AdamW-free work starts the
next one. Of the last complete iteration it prints:
  - its length, the GPU's busy time (the union of all GPU activity) and its idle time;
  - the longest idle gaps, with the GPU activity before and after each (a gap before the first
    kernel of a micro-batch is the host preparing it; one after a device-to-host copy is the
    host reacting to a synchronisation);
  - the kernels by total time (name, calls, ms, share of the busy time);
  - the host's CUDA runtime calls by total time.
The first line is a one-line summary (scripts/gpu_check puts it in its note).
"""
import argparse
import collections
import gzip
import json
import re
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def short(name, width=70):
    # Strata's kernels: strip the mangled namespace prefix down to the kernel's own name.
    m = re.search(r"strata\S*?N__\w+?_\d+_(\w+?)_cu_\w+?(\d+)(\D\w*)", name)
    if m:
        name = "strata:" + re.sub(r"^\d+", "", m.group(3))
    return name[:width]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    events = load(args.trace)
    gpu = sorted((e for e in events if e.get("pid") == 1), key=lambda e: e["ts"])
    api = [e for e in events if e.get("pid") == 0]
    adam = [e["ts"] for e in gpu if "adamw" in e["name"].lower()]
    starts = [t for i, t in enumerate(adam) if i == 0 or t - adam[i - 1] > 5000]
    if len(starts) < 2:
        print("timeline: fewer than two optimizer steps in %s" % args.trace)
        return 1
    t0, t1 = starts[-2], starts[-1]
    window = [e for e in gpu if t0 <= e["ts"] < t1]
    busy, last, prev, gaps = 0.0, t0, None, []
    for e in window:
        s, end = e["ts"], e["ts"] + e["dur"]
        if s > last:
            gaps.append((s - last, last - t0, prev["name"] if prev else "", e["name"]))
        busy += max(0.0, end - max(s, last))
        last = max(last, end)
        prev = e
    span = t1 - t0
    idle = span - busy
    gaps.sort(reverse=True)
    big = [g for g in gaps if g[0] >= 100]
    print("timeline: iteration %.2f ms, GPU busy %.2f ms (%.1f%%), idle %.2f ms; longest gap "
          "%.2f ms; %d gaps >= 0.1 ms hold %.2f ms"
          % (span / 1e3, busy / 1e3, 100 * busy / span, idle / 1e3,
             (gaps[0][0] if gaps else 0) / 1e3, len(big), sum(g[0] for g in big) / 1e3))
    print("\nlongest idle gaps (us, at ms into the iteration, after -> before):")
    for g, at, before, after in gaps[:args.top]:
        print("  %9.1f us at %8.2f ms  %s -> %s" % (g, at / 1e3, short(before, 50), short(after, 50)))
    per = collections.defaultdict(lambda: [0, 0.0])
    for e in window:
        k = per[short(e["name"])]
        k[0] += 1
        k[1] += e["dur"]
    print("\nGPU work by total time:")
    for name, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print("  %9.3f ms %5.1f%% %5d  %s" % (t / 1e3, 100 * t / busy, n, name))
    calls = collections.defaultdict(lambda: [0, 0.0])
    for e in api:
        if t0 <= e["ts"] < t1:
            k = calls[re.sub(r"_v\d+$", "", e["name"])]
            k[0] += 1
            k[1] += e["dur"]
    print("\nhost CUDA runtime calls by total time (a synchronising call waits for the GPU):")
    for name, (n, t) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:8]:
        print("  %9.3f ms %5d  %s" % (t / 1e3, n, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
