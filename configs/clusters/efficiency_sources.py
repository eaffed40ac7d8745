#!/usr/bin/env python3
"""Writes the "efficiency" section of the GPU cluster presets from published measurements.

Run from the repository root: python3 configs/clusters/efficiency_sources.py
It rewrites the "efficiency" object of configs/clusters/dgx-h100.json and dgx-a100-80gb.json
(their other keys are kept). Every figure below names its source; docs/planner.md repeats them.
Only the standard library is needed (CI never runs this: the presets are committed).

GEMM curves (partitioner/efficiency.h): t(M, N, K) = fixed_s + max(2MNK / flops,
2(MK + KN + MN) / bandwidth), fitted by least squares on log time to the points listed (the
same objective as fit_gemm_curve() in partitioner/efficiency.cc; tests/test_planner_efficiency.cc
checks that the C++ fit of the preset's points gives the preset's parameters). The points stay in the file: the
planner corrects the curve toward them near their shapes.

Attention tables: causal FLOP/s in the planner's counting (forward: the causal half of
4·b·s²·h; backward: twice that). FlashAttention's published figures count the forward the
same way and the backward as 2.5× the forward, so backward figures are ×0.8 here, and its
forward+backward figures (3.5× the forward) ×3/3.5.
"""
import json
import math
import os
import re

# OpenXLA's measured H100 SXM (sm_90) GEMM table, bf16 inputs and output, batch 1 entries:
# tensorflow/tensorflow third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h
# (kDefaultMatmulPTable, key "sm_90", commit 372d578b), (M, N, K, TFLOP/s).
XLA_H100_BF16 = """
1024 2048 256 139.52|256 2048 256 41.84|4096 512 512 238.82|512 256 512 21.79|256 2048 4096 285.87
4096 1024 512 343.71|2048 2048 2048 631.98|256 512 4096 91.68|256 1024 256 22.67|4096 4096 256 392.16
2048 512 2048 347.71|4096 4096 4096 783.33|512 4096 1024 373.35|512 256 4096 91.06|256 1024 4096 172.29
4096 2048 512 447.02|2048 256 1024 135.85|512 256 256 11.46|1024 256 1024 68.34|4096 256 2048 304.69
1024 1024 2048 349.98|256 512 256 11.46|256 4096 2048 324.59|1024 512 2048 220.03|512 2048 1024 232.61
4096 512 1024 370.77|1024 2048 2048 524.29|4096 1024 1024 488.06|1024 2048 1024 373.35|4096 4096 512 543.12
256 512 1024 39.11|512 2048 2048 342.39|256 4096 512 138.08|256 1024 1024 72.47|2048 256 512 77.31
1024 256 256 21.96|2048 256 4096 307.49|512 1024 2048 216.48|512 256 1024 39.29|256 256 2048 31.13
4096 512 256 142.48|2048 4096 1024 594.21|4096 4096 2048 738.74|512 512 2048 114.72|4096 512 4096 649.96
4096 1024 256 216.48|1024 4096 1024 490.29|256 4096 256 78.03|256 4096 4096 412.03|4096 1024 4096 738.47
1024 256 4096 169.68|256 2048 512 78.22|2048 256 256 43.58|4096 2048 256 304.00|1024 256 512 40.92
256 512 512 21.96|4096 2048 4096 758.43|2048 2048 1024 493.90|256 1024 512 41.84|1024 1024 512 145.57
2048 512 1024 235.88|512 2048 4096 430.53|2048 1024 1024 373.35|256 256 512 11.46|2048 4096 512 450.40
1024 512 512 82.24|1024 2048 512 237.55|512 2048 256 79.32|2048 256 2048 216.13|1024 4096 4096 738.47
256 256 4096 84.31|512 1024 4096 309.61|512 512 4096 174.54|512 1024 256 43.46|1024 4096 256 209.72
4096 512 2048 521.74|256 4096 1024 225.20|512 512 256 21.62|4096 256 1024 217.18|512 4096 2048 522.25
4096 1024 2048 631.98|2048 4096 256 299.26|2048 4096 4096 753.64|256 256 256 6.45|1024 1024 1024 236.30
1024 256 2048 113.17|2048 512 512 142.78|1024 4096 512 338.93|2048 2048 512 345.48|2048 1024 512 238.40
1024 512 1024 141.28|4096 2048 2048 716.07|256 2048 1024 138.08|2048 2048 256 213.04|512 512 1024 71.24
256 2048 2048 215.78|2048 2048 4096 737.97|4096 2048 1024 593.23|256 512 2048 62.37|1024 512 256 42.91
2048 512 4096 451.15|1024 4096 2048 634.22|2048 1024 256 141.58|512 256 2048 60.13|256 256 1024 19.46
2048 1024 4096 653.13|4096 256 256 82.24|1024 1024 4096 470.11|512 4096 4096 644.12|512 4096 256 134.22
4096 4096 1024 677.44|2048 512 256 83.89|1024 1024 256 82.04|1024 512 4096 298.93|512 1024 512 80.47
2048 4096 2048 715.35|1024 2048 4096 653.53|4096 256 512 137.24|512 512 512 40.72
"""

# Maximum Achievable Matmul FLOPS (stas00/ml-engineering, compute/accelerator/README.md, "BF16"
# MAMF table): the best shape of a brute-force search, bf16, mean of 100 iterations.
MAMF = {"h100": (2048, 2048, 13312, 794.5),   # torch 2.7.0+cu126
        "a100": (1024, 10240, 5120, 271.2)}   # torch 2.6.0+cu126

# FlashAttention-3 paper (Shah et al. 2024, arXiv 2407.08608), Figure 5 (also
# Dao-AILab/flash-attention assets/flash3_fp16_fwd.png): H100 SXM5 forward, causal mask, the
# cuDNN bars (the fused attention Strata's "auto" backend and Transformer Engine run on an
# H100), TFLOP/s at sequence 512 ... 16k for head size 64 (b), 128 (d), 256 (f).
SEQ = [512, 1024, 2048, 4096, 8192, 16384]
H100_CUDNN_FWD = {64: [225, 288, 334, 363, 379, 388],
                  128: [315, 410, 484, 518, 529, 539],
                  256: [308, 391, 450, 483, 497, 509]}
# cuDNN's attention as this project measured it on an H100 in Strata's own runs
# (bench/bench_cuda_kernels.cc in scripts/gpu_check, 2026-11-24, docs/gpu.md; the planner's
# counting), % of the 989 TFLOP/s peak: 124M (seq 1024, head 64) forward 27%, backward 16%;
# 1.3B (seq 2048, head 128) forward 42%, backward 27%. The published curve keeps its shape
# across sequence lengths and is scaled to this level at the measured point of its head size
# (head 256 takes head 128's factors); the backward is the measured share of the forward.
H100_MEASURED = {64: (1024, 0.27 * 989, 0.16 * 989), 128: (2048, 0.42 * 989, 0.27 * 989)}
H100_MEASURED[256] = H100_MEASURED[128]


def h100_attention():
    fwd, bwd = {}, {}
    for h, row in H100_CUDNN_FWD.items():
        seq, f_meas, b_meas = H100_MEASURED[h]
        ref = H100_CUDNN_FWD[128 if h == 256 else h][SEQ.index(seq)]
        fwd[h] = [v * f_meas / ref for v in row]
        bwd[h] = [v * b_meas / f_meas for v in fwd[h]]
    return fwd, bwd


# FlashAttention-2 paper (Dao 2023, arXiv 2307.08691), Figure 4 (c, d) (also
# assets/flash2_a100_fwd_bwd_benchmark.png): A100 80GB SXM4, forward + backward, causal mask,
# FlashAttention-2, TFLOP/s in FlashAttention's counting (3.5× the forward).
A100_FA2_FWDBWD = {64: [88, 119, 140, 156, 165, 171], 128: [99, 133, 155, 173, 182, 189]}
# The forward share of FlashAttention-2's forward+backward time, from the same kernels on an
# H100: FlashAttention-2's forward (FA3 paper Figure 5 (b, d), FlashAttention-2 bars) over its
# forward+backward (FA2 paper Figure 7 (c, d), assets/flash2_h100_fwd_bwd_benchmark.png).
H100_FA2_FWD = {64: [180, 229, 262, 284, 295, 299], 128: [191, 260, 298, 319, 333, 335]}
H100_FA2_FWDBWD = {64: [141, 192, 232, 257, 273, 284], 128: [163, 221, 265, 294, 308, 328]}

# Memory-bound kernels. H100: a device-to-device copy reached 88.8% of 3.35 TB/s and AdamW
# 85-87% in this project's bench_cuda_kernels run (2026-11-24, docs/gpu.md). A100 80GB: a read
# kernel reaches 1.80 of 2.04 TB/s (NVIDIA developer forum, "Trouble to reach peak bandwidth of
# A100", thread 339083, with Nsight Compute agreeing at 88%).
MEMORY = {"h100": (0.888 * 3.35e12, 0.86 * 3.35e12), "a100": (1.80e12, 1.80e12)}

# Idle time between two dependent kernels: the CUPTI timeline of this project's GPT-2 124M step
# on an H100 (scripts/gpu_check step "timeline", docs/gpu.md: 1.28 ms idle in a 32.98 ms step)
# over the ~330 kernels that step issues (12 layers × 26, embedding, head, optimizer).
KERNEL_GAP_S = 1.28e-3 / 330

# The share of a single kernel's benchmark throughput the GPU keeps in a training step (all
# GPUs of a node at their power limit, NCCL's kernels beside the compute): fitted, one figure
# per GPU, by `bench_planner_calibration --fit-sustained` on that GPU's table (docs/planner.md).
SUSTAINED = {"h100": 0.710, "a100": 0.760}


def parse(text):
    pts = []
    for part in text.replace("\n", "|").split("|"):
        if part.strip():
            m, n, k, tf = part.split()
            pts.append((float(m), float(n), float(k), float(tf) * 1e12))
    return pts


def curve_time(x, m, n, k, e=2.0):
    flops, fixed, bw = (math.exp(v) for v in x)
    return fixed + max(2 * m * n * k / flops, e * (m * k + k * n + m * n) / bw)


def fit(points, e=2.0):
    """Nelder-Mead on log(flops, fixed_s, bandwidth), as fit_gemm_curve()."""
    def cost(x):
        return sum(math.log(curve_time(x, m, n, k, e) / (2 * m * n * k / f)) ** 2
                   for m, n, k, f in points)
    fmax = max(p[3] for p in points)
    tmin = min(2 * m * n * k / f for m, n, k, f in points)
    bwmax = max(e * (m * k + k * n + m * n) / (2 * m * n * k / f) for m, n, k, f in points)
    s = [[math.log(fmax * 1.05), math.log(tmin * 0.5), math.log(bwmax * 1.2)]]
    for i in range(3):
        x = list(s[0])
        x[i] += 0.5
        s.append(x)
    f = [cost(x) for x in s]
    for _ in range(2000):
        o = sorted(range(4), key=lambda i: f[i])
        best, second, worst = o[0], o[2], o[3]
        if f[worst] - f[best] < 1e-12:
            break
        c = [sum(s[i][k] for i in o[:3]) / 3 for k in range(3)]
        along = lambda a: [c[k] + a * (s[worst][k] - c[k]) for k in range(3)]
        r = along(-1)
        fr = cost(r)
        if fr < f[best]:
            ex = along(-2)
            fe = cost(ex)
            s[worst], f[worst] = (ex, fe) if fe < fr else (r, fr)
        elif fr < f[second]:
            s[worst], f[worst] = r, fr
        else:
            ct = along(-0.5 if fr < f[worst] else 0.5)
            fc = cost(ct)
            if fc < min(fr, f[worst]):
                s[worst], f[worst] = ct, fc
            else:
                for i in o[1:]:
                    s[i] = [s[best][k] + 0.5 * (s[i][k] - s[best][k]) for k in range(3)]
                    f[i] = cost(s[i])
    b = min(range(4), key=lambda i: f[i])
    return [math.exp(v) for v in s[b]], math.sqrt(f[b] / len(points))


def table(fwd, bwd):
    return {"forward": [[s, h, round(v * 1e12, -9)] for h, row in sorted(fwd.items())
                        for s, v in zip(SEQ, row)],
            "backward": [[s, h, round(v * 1e12, -9)] for h, row in sorted(bwd.items())
                         for s, v in zip(SEQ, row)]}


def h100():
    pts = parse(XLA_H100_BF16)
    pts.append(tuple(float(v) for v in MAMF["h100"][:3]) + (MAMF["h100"][3] * 1e12,))
    (flops, fixed, bw), rms = fit(pts)
    fwd, bwd = h100_attention()
    mem, opt = MEMORY["h100"]
    return {
        "source": "GEMMs: OpenXLA's measured sm_90 table (119 bf16 batch-1 shapes) and the MAMF "
                  "table of stas00/ml-engineering; attention: cuDNN bars of FlashAttention-3 "
                  "Figure 5 scaled to this project's H100 measurement of cuDNN; memory and kernel gap: "
                  "this project's H100 runs (configs/clusters/efficiency_sources.py, "
                  "docs/planner.md); sustained: fitted on the Megatron-Core H100 table",
        "sustained": SUSTAINED["h100"],
        "gemm": {"bf16": {"flops": round(flops, -9), "fixed_s": round(fixed, 9),
                          "bandwidth": round(bw, -9),
                          "points": [[m, n, k, round(f, -9)] for m, n, k, f in pts]}},
        "attention": {"bf16": table(fwd, bwd)},
        "memory_bandwidth": round(mem, -9),
        "optimizer_bandwidth": round(opt, -9),
        "kernel_gap_s": round(KERNEL_GAP_S, 9),
    }, rms


def a100(h100_fixed):
    m, n, k, tf = MAMF["a100"]
    mem, opt = MEMORY["a100"]
    # One published A100 shape: its fixed time is taken as the H100 fit's (a launch and ramp
    # cost, the driver's more than the chip's), its operand bandwidth as the measured
    # memory bandwidth, and flops solves the curve through the point.
    work = 2.0 * m * n * k
    flops = work / (work / (tf * 1e12) - h100_fixed)
    fwd, bwd = {}, {}
    for h, row in A100_FA2_FWDBWD.items():
        share = [a / b for a, b in zip(H100_FA2_FWD[h], H100_FA2_FWDBWD[h])]
        f = [fb * r for fb, r in zip(row, share)]  # forward, FlashAttention's counting
        # backward time = (3.5/fb − 1/fwd) per forward FLOP, in FlashAttention's 2.5× counting
        b25 = [2.5 / (3.5 / fb - 1 / fw) for fb, fw in zip(row, f)]
        fwd[h] = f
        bwd[h] = [v * 0.8 for v in b25]
    return {
        "source": "GEMMs: the MAMF table of stas00/ml-engineering (one shape; fixed time from the "
                  "H100 fit); attention: FlashAttention-2 Figure 4, split by its H100 forward "
                  "share; memory: NVIDIA developer forum measurement "
                  "(configs/clusters/efficiency_sources.py, docs/planner.md); sustained: fitted on "
                  "the Megatron-LM 2021 A100 table",
        "sustained": SUSTAINED["a100"],
        "gemm": {"bf16": {"flops": round(flops, -9), "fixed_s": round(h100_fixed, 9),
                          "bandwidth": round(mem, -9),
                          "points": [[float(m), float(n), float(k), tf * 1e12]]}},
        "attention": {"bf16": table(fwd, bwd)},
        "memory_bandwidth": round(mem, -9),
        "optimizer_bandwidth": round(opt, -9),
        "kernel_gap_s": round(KERNEL_GAP_S, 9),
    }


# Collectives: NCCL's ring all-reduce over NVLink reaches about 80% of the per-direction link
# rate (nccl-tests all_reduce_perf bus bandwidth ≈ 360 of 450 GB/s on an H100 without NVLS,
# ≈ 240 of 300 GB/s on a DGX A100); between nodes 95% of a NIC's line rate is payload.
LINK_EFFICIENCY = {"intra_node": 0.80, "inter_node": 0.95}


def write(path, eff):
    with open(path) as f:
        c = json.load(f)
    c["efficiency"] = eff
    for link, share in LINK_EFFICIENCY.items():
        c[link]["efficiency"] = share
    text = json.dumps(c, indent=2)
    # One line per row of numbers (a point, a table entry).
    text = re.sub(r"\[([^\[\]{}]*)\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    with open(path, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    h, rms = h100()
    print("H100 bf16 GEMM fit: %.1f TFLOP/s, fixed %.2f us, %.2f TB/s (rms log error %.3f)" %
          (h["gemm"]["bf16"]["flops"] / 1e12, h["gemm"]["bf16"]["fixed_s"] * 1e6,
           h["gemm"]["bf16"]["bandwidth"] / 1e12, rms))
    a = a100(h["gemm"]["bf16"]["fixed_s"])
    print("A100 bf16 GEMM curve: %.1f TFLOP/s" % (a["gemm"]["bf16"]["flops"] / 1e12))
    write(os.path.join(here, "dgx-h100.json"), h)
    write(os.path.join(here, "dgx-a100-80gb.json"), a)
