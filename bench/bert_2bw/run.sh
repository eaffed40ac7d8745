#!/usr/bin/env bash
# PipeDream-2BW's claim, measured: the same small BERT trained on the CPU with `2bw` (weights
# stale by one batch, no pipeline flush) and with `1f1b` (a flush every step), pipeline 4, the
# same seed, data and hyper-parameters (configs/train/bert-shakespeare.json: tiny Shakespeare
# as masked-LM samples of its paragraphs). Writes OUT/{1f1b,2bw}.jsonl (the metrics of every
# step), OUT/{1f1b,2bw}.log, and the plot of both loss curves (plot.py) to docs/.
#
# Usage: bench/bert_2bw/run.sh [OUT] [ITERATIONS]   (from the repository root, after
#        scripts/build; needs ../shared/data/tinyshakespeare.txt). 600 iterations take about
#        10 minutes per schedule on 2 cores; the figures are losses, not times.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/strata_bert_2bw}
iters=${2:-600}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
for schedule in 1f1b 2bw; do
  rm -f "$out/$schedule.jsonl"
  mpirun --oversubscribe -np 4 build/strata train --config configs/train/bert-shakespeare.json \
    --set parallel.pipeline=4 --set parallel.schedule=$schedule \
    --set train.micro_batch_size=4 --set train.threads=1 --set train.iterations="$iters" \
    --set log.metrics="$out/$schedule.jsonl" --set log.interval=50 | tee "$out/$schedule.log"
done
python3 bench/bert_2bw/plot.py "$out/1f1b.jsonl" "$out/2bw.jsonl" docs/bert_2bw_vs_1f1b.svg
