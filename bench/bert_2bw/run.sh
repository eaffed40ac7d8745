#!/usr/bin/env bash
# PipeDream-2BW's claim, measured: the same small BERT trained on the CPU with `2bw` (weights
# stale by one batch, no pipeline flush) and with `1f1b` (a flush every step), pipeline 4, the
# same seed, data and hyper-parameters (configs/train/bert-shakespeare.json: tiny Shakespeare
# as masked-LM samples of its paragraphs). Writes OUT/{1f1b,2bw}.jsonl (the metrics of every
# step), OUT/{1f1b,2bw}.log, and the plot of both loss curves (plot.py) to docs/.
#
# Usage: bench/bert_2bw/run.sh [OUT] [ITERATIONS] [LR]   (from the repository root, after
#        scripts/build; needs ../shared/data/tinyshakespeare.txt). LR is the peak learning rate
#        (default the config's, 1e-3; min_lr is a tenth of it); the plot is
#        docs/bert_2bw_vs_1f1b.svg at the config's rate, docs/bert_2bw_vs_1f1b_lrLR.svg at
#        another. 600 iterations take 7 to 15 minutes per schedule on 2 cores (more when the
#        machine is shared); the figures are losses, not times.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/strata_bert_2bw}
iters=${2:-600}
lr=${3:-}
plot=docs/bert_2bw_vs_1f1b.svg
lr_sets=()
if [ -n "$lr" ]; then
  plot=docs/bert_2bw_vs_1f1b_lr$lr.svg
  lr_sets=(--set optimizer.lr="$lr" --set optimizer.min_lr="$(python3 -c "print($lr / 10)")")
fi
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
for schedule in 1f1b 2bw; do
  rm -f "$out/$schedule.jsonl"
  mpirun --oversubscribe -np 4 build/strata train --config configs/train/bert-shakespeare.json \
    --set parallel.pipeline=4 --set parallel.schedule=$schedule \
    --set train.micro_batch_size=4 --set train.threads=1 --set train.iterations="$iters" \
    --set log.metrics="$out/$schedule.jsonl" --set log.interval=50 ${lr_sets[@]+"${lr_sets[@]}"} |
    tee "$out/$schedule.log"
done
python3 bench/bert_2bw/plot.py "$out/1f1b.jsonl" "$out/2bw.jsonl" "$plot" "${lr:-1e-3}"
