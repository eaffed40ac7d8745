#!/usr/bin/env python3
"""Side-by-side throughput table: Strata metrics JSONL files and torch_{gpt,llama,bert}.py JSON lines.

  python3 bench/gpu/summarize.py --strata gpt2-124m=OUT/strata_gpt2-124m.jsonl \\
      --strata gpt-1.3b=OUT/strata_gpt-1.3b.jsonl \\
      --strata llama-3.2-1b=OUT/strata_llama-3.2-1b.jsonl --strata-cudnn OUT/strata_cudnn.jsonl \\
      --torch OUT/torch.jsonl [--skip 5] [--peak-tflops 989]

Strata files hold one object per iteration (docs/contracts.md: iter, step_ms, tokens_per_s,
tflops_per_gpu, mfu, mem_peak_bytes); the first --skip iterations are warm-up (cuBLAS heuristics,
first allocations) and are left out, the rest give medians. `mfu` is taken from the file when Strata
filled it, else computed as tflops_per_gpu / --peak-tflops (marked '*'; equal to model-FLOP MFU
for recompute none/selective, where Strata's hardware and model FLOPs are the same).
--strata-cudnn files hold the same runs with train.attention_backend=cudnn, several models in one
file, each line tagged with its "label" (scripts/gpu_check writes them so, to stay within the
device tool's 8 files); they become rows of impl "strata-cudnn", and a line with an "error" key
(the run's exit status and last output line) goes into the row's note.
torch_gpt.py and torch_llama.py lines (one format) are already medians over their timed
iterations; they are matched to Strata runs by "label". Missing or unreadable inputs become a row
saying so, never a crash: this runs at the end of scripts/gpu_check, whatever failed before it.

After the table: the Strata / torch.compile (and torch eager) tokens/s ratio of each --ratio-label
(default gpt2-124m, llama-3.2-1b and bert-large, those the table has), cuDNN's attention against Strata's
for every model, and each model's targets (TARGETS: issue 7's for GPT, the Llama issue's for
llama-3.2-1b) met or not, for each Strata row of the model.
"""
import argparse
import json
import os
import statistics
import sys

# The throughput targets of the issues, by label: "ratio", Strata's tokens/s at least this many
# times torch.compile's (same model, same session); "mfu", at least this model-FLOP MFU.
TARGETS = {
    "gpt2-124m": {"ratio": 1.0},
    "gpt-1.3b": {"mfu": 0.45},
    "llama-3.2-1b": {"ratio": 1.1, "mfu": 0.50},
    "qwen3-30b-a3b-4l": {"ratio": 2.0},  # issue 37: against transformers' Qwen3-MoE compiled
}


def fmt_si(x):
    if x is None:
        return "-"
    for unit, f in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= f:
            return f"{x / f:.2f} {unit}"
    return f"{x:.1f}"


def fmt_bytes(b):
    if b is None:
        return "-"
    return f"{b / 2**30:.2f} GiB"


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def read_jsonl(path):
    rows, bad = [], 0
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                bad += 1  # e.g. a line cut by a killed run
    return rows, bad


def strata_row(label, path, skip, peak):
    row = {"label": label, "impl": "strata", "file": path}
    if not os.path.exists(path):
        row["note"] = "no metrics file (run failed or skipped)"
        return row
    recs, bad = read_jsonl(path)
    return strata_stats(row, recs, bad, skip, peak)


def strata_stats(row, recs, bad, skip, peak):
    """Fills `row` with the medians of one Strata run's metrics records; `bad` lines were
    unreadable."""
    recs = [r for r in recs if isinstance(r, dict) and "iter" in r]
    total = len(recs)
    timed = [r for r in recs if r["iter"] > skip]
    if not timed and recs:  # fewer iterations than the warm-up: use what there is, say so
        timed = recs
        row["note"] = f"only {total} iterations: warm-up not skipped"
    if not timed:
        row["note"] = "metrics file has no iterations"
        return row

    def med(key):
        vals = [r[key] for r in timed if isinstance(r.get(key), (int, float))]
        return statistics.median(vals) if vals else None

    row.update(iters=len(timed), of=total, step_ms=med("step_ms"),
               tokens_per_s=med("tokens_per_s"), tflops=med("tflops_per_gpu"))
    mfu = med("mfu")
    if mfu is None and row["tflops"] is not None:
        mfu, row["mfu_computed"] = row["tflops"] / peak, True
    row["mfu"] = mfu
    mems = [r["mem_peak_bytes"] for r in timed if isinstance(r.get("mem_peak_bytes"), (int, float))]
    row["mem"] = max(mems) if mems else None
    losses = [r["loss"] for r in recs if isinstance(r.get("loss"), (int, float))]
    if losses:
        row["loss"] = (losses[0], losses[-1])
    skipped = sum(1 for r in timed if r.get("skipped"))
    notes = [row.get("note")] if row.get("note") else []
    if skipped:
        notes.append(f"{skipped} non-finite steps")
    if bad:
        notes.append(f"{bad} unreadable lines")
    if notes:
        row["note"] = "; ".join(notes)
    return row


def strata_cudnn_rows(paths, labels, skip, peak):
    """Rows of impl "strata-cudnn" from files of lines tagged with "label": one per label of
    `labels` (the --strata runs), then one per other label the files hold."""
    by_label, bad, missing = {}, {}, []
    for path in paths:
        if not os.path.exists(path):
            missing.append(path)
            continue
        recs, bad[path] = read_jsonl(path)
        for r in recs:
            if isinstance(r, dict) and "label" in r:
                by_label.setdefault(r["label"], []).append(r)
    rows = []
    for label in dict.fromkeys(labels + list(by_label)):
        row = {"label": label, "impl": "strata-cudnn", "file": ", ".join(paths)}
        recs = by_label.get(label)
        if not recs:
            row["note"] = ("no metrics file (run failed or skipped)" if len(missing) == len(paths)
                           else f"no lines labelled {label} (run failed or skipped)")
            rows.append(row)
            continue
        errors = ["error: " + str(r["error"])[:120] for r in recs if "error" in r]
        iters = [r for r in recs if "error" not in r]
        if iters:
            strata_stats(row, iters, 0, skip, peak)
        notes = errors + ([row["note"]] if row.get("note") else [])
        if notes:
            row["note"] = "; ".join(notes)
        if errors:
            row["failed"] = True
        rows.append(row)
    for path, n in bad.items():
        if n:
            rows.append({"label": "?", "impl": "strata-cudnn",
                         "note": f"{n} unreadable lines in {path}"})
    return rows


def torch_rows(path):
    if not os.path.exists(path):
        return [{"label": "?", "impl": "torch", "note": f"no file {path}"}]
    recs, bad = read_jsonl(path)
    rows = []
    for r in recs:
        if not isinstance(r, dict) or "impl" not in r:
            continue
        row = {"label": r.get("label") or "?", "impl": r["impl"]}
        if "error" in r:
            row["note"] = "error: " + str(r["error"])[:120]
        else:
            row.update(iters=r.get("iters"), step_ms=r.get("step_ms"),
                       tokens_per_s=r.get("tokens_per_s"), tflops=r.get("tflops_per_gpu"),
                       mfu=r.get("mfu"), mem=r.get("mem_peak_bytes"),
                       loss=(r.get("loss_first"), r.get("loss_last")))
            if r.get("first_step_s") is not None and r.get("compile"):
                row["note"] = f"first step {r['first_step_s']:.0f} s (compile)"
        rows.append(row)
    if bad:
        rows.append({"label": "?", "impl": "torch", "note": f"{bad} unreadable lines in {path}"})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", action="append", default=[], metavar="LABEL=FILE",
                    help="a Strata metrics JSONL file (LABEL defaults to the file's stem)")
    ap.add_argument("--strata-cudnn", action="append", default=[], metavar="FILE",
                    help="Strata runs with cuDNN attention, lines tagged with their \"label\" "
                         "(scripts/gpu_check's strata_cudnn.jsonl)")
    ap.add_argument("--torch", action="append", default=[], metavar="FILE",
                    help="torch_gpt.py output (JSON lines)")
    ap.add_argument("--skip", type=int, default=5, help="warm-up iterations left out (Strata)")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="peak dense TFLOP/s for a computed MFU (989: H100/H200 SXM bf16)")
    ap.add_argument("--ratio-label", action="append", default=None, metavar="LABEL",
                    help="label whose Strata / torch.compile ratio is printed (repeatable; "
                         "default gpt2-124m and llama-3.2-1b, those the table has)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    args = ap.parse_args()

    rows = []
    for spec in args.strata:
        label, sep, path = spec.partition("=")
        if not sep:
            path, label = spec, os.path.splitext(os.path.basename(spec))[0]
        rows.append(strata_row(label, path, args.skip, args.peak_tflops))
    if args.strata_cudnn:
        rows.extend(strata_cudnn_rows(args.strata_cudnn, [r["label"] for r in rows], args.skip,
                                      args.peak_tflops))
    for path in args.torch:
        rows.extend(torch_rows(path))
    if not rows:
        ap.error("nothing to summarize: give --strata and/or --torch")

    # Group by label (first-seen order), Strata first within a label.
    order = {}
    for r in rows:
        order.setdefault(r["label"], len(order))
    rank = {"strata": 0, "strata-cudnn": 1, "torch-eager": 2, "torch.compile": 3}
    rows.sort(key=lambda r: (order[r["label"]], rank.get(r["impl"], 4)))

    head = (f"{'run':<12} {'impl':<14} {'iters':>6} {'step ms':>9} {'tokens/s':>10} "
            f"{'TFLOP/s':>8} {'MFU':>7} {'peak mem':>10}  {'loss first->last':<17} note")
    print(f"medians after {args.skip} warm-up iterations (Strata); MFU against "
          f"{args.peak_tflops:g} TFLOP/s")
    print(head)
    print("-" * len(head))
    for r in rows:
        iters = "-" if r.get("iters") is None else (
            f"{r['iters']}/{r['of']}" if "of" in r else str(r["iters"]))
        mfu = "-" if r.get("mfu") is None else (
            f"{100 * r['mfu']:.1f}%" + ("*" if r.get("mfu_computed") else ""))
        loss = r.get("loss")
        loss_s = "-" if not loss or None in loss else f"{loss[0]:.3f}->{loss[1]:.3f}"
        print(f"{r['label']:<12} {r['impl']:<14} {iters:>6} {fmt(r.get('step_ms'), '.1f'):>9} "
              f"{fmt_si(r.get('tokens_per_s')):>10} {fmt(r.get('tflops'), '.1f'):>8} {mfu:>7} "
              f"{fmt_bytes(r.get('mem')):>10}  {loss_s:<17} {r.get('note', '')}")
    if any(r.get("mfu_computed") for r in rows):
        print("* MFU computed from tflops_per_gpu (Strata left mfu null)")
    if args.strata_cudnn:
        print("strata-cudnn: the same Strata run with train.attention_backend=cudnn "
              "(strata: Strata's attention kernels)")

    def row_of(label, impl):
        return next((r for r in rows if r["label"] == label and r["impl"] == impl
                     and r.get("tokens_per_s")), None)

    def ratio(name, label, impl_a, impl_b):
        a, b = row_of(label, impl_a), row_of(label, impl_b)
        if a and b:
            failed = "".join(f"; {r['impl']} failed, see its note"
                             for r in (a, b) if r.get("failed"))
            print(f"ratio {name} ({label}): tokens/s {a['tokens_per_s'] / b['tokens_per_s']:.3f}x"
                  f"  ({fmt_si(a['tokens_per_s'])} vs {fmt_si(b['tokens_per_s'])}{failed})")
        else:
            print(f"ratio {name} ({label}): n/a (missing run)")

    # The comparison: Strata vs torch.compile, same model and batch; with cuDNN's
    # attention too, and cuDNN's against Strata's attention for every model (what "auto" picks).
    labels = args.ratio_label or [lab for lab in ("gpt2-124m", "llama-3.2-1b", "bert-large",
                                                  "qwen3-30b-a3b-4l")
                                  if any(r["label"] == lab for r in rows)]
    for lab in labels:
        print()
        for impl in ("torch.compile", "torch-eager"):
            ratio(f"Strata / {impl}", lab, "strata", impl)
        if args.strata_cudnn:
            for impl in ("torch.compile", "torch-eager"):
                ratio(f"Strata-cudnn / {impl}", lab, "strata-cudnn", impl)
    if args.strata_cudnn:
        print()
        for label in dict.fromkeys(r["label"] for r in rows if r["impl"] == "strata"):
            ratio("Strata-cudnn / Strata", label, "strata-cudnn", "strata")

    # Targets: each Strata row (either attention backend) of a model that has targets.
    lines = []
    for label, target in TARGETS.items():
        for impl in ("strata", "strata-cudnn"):
            if not any(r["label"] == label and r["impl"] == impl for r in rows):
                continue
            a, parts = row_of(label, impl), []
            if "ratio" in target:
                b = row_of(label, "torch.compile")
                if a and b:
                    x = a["tokens_per_s"] / b["tokens_per_s"]
                    parts.append(f"{x:.3f}x torch.compile (>= {target['ratio']:g}x: "
                                 f"{'met' if x >= target['ratio'] else 'NOT met'})")
                else:
                    parts.append(f"ratio to torch.compile n/a (>= {target['ratio']:g}x: "
                                 "a run missing)")
            if "mfu" in target:
                m = a.get("mfu") if a else None
                if m is not None:
                    parts.append(f"MFU {100 * m:.1f}% (>= {100 * target['mfu']:g}%: "
                                 f"{'met' if m >= target['mfu'] else 'NOT met'})")
                else:
                    parts.append(f"MFU n/a (>= {100 * target['mfu']:g}%: no run)")
            lines.append(f"target {label} {impl}: " + "; ".join(parts))
    if lines:
        print()
        print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
