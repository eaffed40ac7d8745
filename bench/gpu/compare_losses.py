#!/usr/bin/env python3
"""Compare the per-iteration losses of two Strata metrics JSONL files (reference, then test).

  python3 bench/gpu/compare_losses.py CPU.jsonl CUDA.jsonl --rel 1e-4      # fp32: GPU == CPU
  python3 bench/gpu/compare_losses.py CPU.jsonl BF16.jsonl --rel 5e-2 --must-decrease

Exit 0 when every iteration of the test run is finite and within --rel (relative to the
reference loss) and, with --must-decrease, its last loss is below its first; 1 otherwise; 2 on
unreadable input. Used by scripts/gpu_check for the end-to-end GPU-vs-CPU check through the
`strata` command itself (the same property as tests/test_cuda_backend.cc TrainingMatchesTheCpuRun).
"""
import argparse
import json
import math
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                out[r["iter"]] = r["loss"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("test")
    ap.add_argument("--rel", type=float, default=1e-4)
    ap.add_argument("--must-decrease", action="store_true")
    a = ap.parse_args()
    try:
        ref, test = losses(a.ref), losses(a.test)
    except (OSError, ValueError, KeyError) as e:
        print(f"unreadable input: {e}")
        return 2
    common = sorted(set(ref) & set(test))
    if not common or len(test) < len(ref):
        print(f"iterations: reference {len(ref)}, test {len(test)}: incomplete run")
        return 1
    worst, worst_it, bad = 0.0, None, 0
    for it in common:
        r, t = ref[it], test[it]
        if t is None or not math.isfinite(t):
            print(f"iter {it}: non-finite test loss {t}")
            bad += 1
            continue
        rel = abs(t - r) / max(abs(r), 1e-12)
        if rel > worst:
            worst, worst_it = rel, it
        if rel > a.rel:
            bad += 1
            if bad <= 5:
                print(f"iter {it}: reference {r:.6f}, test {t:.6f}, rel diff {rel:.2e} > {a.rel:g}")
    first, last = test[common[0]], test[common[-1]]
    print(f"{len(common)} iterations; max rel diff {worst:.2e} (iter {worst_it}); "
          f"test loss {first:.4f} -> {last:.4f}; reference {ref[common[0]]:.4f} -> {ref[common[-1]]:.4f}")
    if a.must_decrease and not last < first:
        print("test loss did not decrease")
        bad += 1
    print("PASS" if bad == 0 else "FAIL")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
