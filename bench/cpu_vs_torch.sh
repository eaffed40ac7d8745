#!/usr/bin/env bash
# cpu_vs_torch.sh — one training step of a 4-layer Llama on the CPU, Strata against PyTorch eager,
# side by side in one run on the same thread count (default 1).
#
# Usage: bench/cpu_vs_torch.sh [BUILD_DIR] [ROUNDS]   (defaults: build, 3)
#   THREADS=N   threads for both (default 1); PYTHON=...  an interpreter with torch (default python3)
#
# The model (bench/gpu/torch_llama.py's, as models/llama/arch.cc specifies it): 4 layers, hidden
# 384, 6 query heads sharing 2 key/value heads, SwiGLU 1024, sequence 256, vocabulary 256, head
# untied, rope theta 10000; micro-batch 8 = the global batch, fp32, AdamW with clipping at 1.0,
# random (PyTorch) or synthetic (Strata) tokens. Each round runs Strata then PyTorch, 8 steps each
# (PyTorch: 2 warm-up, 6 timed; Strata: steps 3–8), so a load that comes and goes hits both; the
# figure of each round is its median step, and the bottom line the median over rounds and the
# ratio Strata / PyTorch (below 1: Strata is faster). It never fails on time.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
threads=${THREADS:-1}
python=${PYTHON:-python3}
if ! "$python" -c 'import torch' 2> /dev/null; then
  echo "cpu_vs_torch: $python cannot import torch (PYTHON=/path/to/python with torch installed)" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/llama4.json" << EOF
{
  "model": {"arch": "llama", "num_layers": 4, "hidden_size": 384, "num_heads": 6,
            "num_key_value_heads": 2, "ffn_hidden_size": 1024, "seq_len": 256, "vocab_size": 256,
            "tie_embeddings": false, "rope_theta": 10000.0},
  "train": {"micro_batch_size": 8, "global_batch_size": 8, "iterations": 8, "eval_interval": 0,
            "threads": $threads},
  "data": {"source": "synthetic"},
  "log": {"interval": 1}
}
EOF
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
"$build/strata" --version | sed -n 3p
echo "threads $threads, $rounds rounds; step ms (median of the round's steps)"
strata_ms=() torch_ms=()
for ((r = 1; r <= rounds; ++r)); do
  s=$(OMP_NUM_THREADS=$threads "$build/strata" train --config "$work/llama4.json" |
    awk '/^iter/ {for (i = 1; i <= NF; ++i) if ($i == "ms") {split($2, it, "/"); if (it[1] > 2) print $(i - 1)}}' |
    median)
  t=$(OMP_NUM_THREADS=$threads "$python" bench/gpu/torch_llama.py --layers 4 --hidden 384 \
    --heads 6 --kv-heads 2 --ffn 1024 --seq 256 --vocab 256 --micro-batch 8 --iters 6 --warmup 2 \
    --compile 0 --device cpu --precision fp32 --tie 0 --rope-theta 10000 |
    "$python" -c 'import json, sys; print(json.loads(sys.stdin.readlines()[-1])["step_ms"])')
  printf 'round %d: strata %.1f ms, torch eager %.1f ms\n' "$r" "$s" "$t"
  strata_ms+=("$s") torch_ms+=("$t")
done
s=$(printf '%s\n' "${strata_ms[@]}" | median)
t=$(printf '%s\n' "${torch_ms[@]}" | median)
awk -v s="$s" -v t="$t" -v torch="$("$python" -c 'import torch; print(torch.__version__)')" \
  'BEGIN {printf "strata %.1f ms, torch %s eager %.1f ms: strata / torch = %.2f\n", s, torch, t, s / t}'
