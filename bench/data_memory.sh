#!/usr/bin/env bash
# data_memory.sh — host memory and loader speed against corpus size (issue 24): writes a 40 MB
# and a 4 GB indexed dataset of random documents (bench_data write), trains the same small GPT
# on each for a few iterations under /usr/bin/time, and prints each run's peak RSS, their ratio,
# the training step's tokens/s and the loader's tokens/s (bench_data read) side by side.
#
#   bench/data_memory.sh [BUILD_DIR] [WORK_DIR] [LARGE_MB]   (defaults: build, /tmp/strata_data_bench, 4000)
#
# Prints figures; never passes or fails.
set -euo pipefail
BUILD=${1:-build}
WORK=${2:-/tmp/strata_data_bench}
LARGE_MB=${3:-4000}
mkdir -p "$WORK"
for spec in "small 40" "large $LARGE_MB"; do
  set -- $spec
  [ -f "$WORK/$1.idx" ] || "$BUILD/bench/bench_data" write "$WORK/$1" "$2" 50257
done
printf '%-6s %12s %10s %14s %16s\n' dataset size peak_rss train_tok/s loader_tok/s
declare -A rss
for name in small large; do
  log="$WORK/$name.train.log"
  /usr/bin/time -v "$BUILD/strata" train --config /dev/stdin > "$log" 2>&1 <<JSON
{"model": {"preset": "gpt2-124m", "num_layers": 2, "hidden_size": 256, "num_heads": 4,
           "seq_len": 256},
 "train": {"micro_batch_size": 8, "global_batch_size": 8, "iterations": 20, "eval_interval": 0},
 "data": {"source": "indexed", "path": "$WORK/$name"}, "log": {"interval": 1000}}
JSON
  kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$log")
  rss[$name]=$kb
  tok=$(sed -n 's/^done: .*| \([0-9.]* [kM]*\) *tok\/s.*/\1/p' "$log")
  loader=$("$BUILD/bench/bench_data" read "$WORK/$name" 256 8 2000 | sed -n 's/.*: \([0-9.]*\) M tokens\/s/\1 M/p')
  printf '%-6s %12s %8.1f MB %14s %16s\n' "$name" "$(du -h "$WORK/$name.bin" | cut -f1)" \
    "$(echo "$kb / 1024" | bc -l)" "$tok" "$loader"
done
echo "peak RSS large / small: $(echo "${rss[large]} / ${rss[small]}" | bc -l | cut -c1-6)"
