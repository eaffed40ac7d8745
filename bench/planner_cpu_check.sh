#!/usr/bin/env bash
# planner_cpu_check.sh — the planner's predicted iteration time against Strata's own 2-rank runs
# on this machine's CPU (issue 25): `strata profile --cluster-out` writes this CPU's curves
# (GEMMs, attention, memory-bound kernels, optimizer, the link between two ranks) into a cluster
# file; then for each layout — tensor 2; pipeline 2 with 1f1b, interleaved and zb-h1; data 2 —
# `strata train --dry-run --cluster` gives the planner's prediction of the config as it runs, and
# the same config is trained under mpirun -np 2: the median step of the iterations after the
# first two is the measurement. Prints predicted, measured and the error per layout with the
# run's CPU share (CPU time of the two ranks over twice the wall time: 1.00 when each rank had
# a core to itself), the load average before and after (timings on a busy machine are
# disturbed: say so when quoting them), and draws the pipeline-1f1b prediction above its
# measured trace (pp2-1f1b.svg).
#
#   bench/planner_cpu_check.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, a new temporary dir)
#   CONFIG=FILE ITERATIONS=N   override the model (configs/bench/planner-cpu-check.json) and the
#                              iterations per run (12)
#
# Prints figures; never passes or fails.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${2:-$(mktemp -d /tmp/strata_planner_check.XXXXXX)}
CONFIG=${CONFIG:-configs/bench/planner-cpu-check.json}
ITERATIONS=${ITERATIONS:-12}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPI=(mpirun -np 2 --oversubscribe)
STRATA=("$BUILD/strata")

echo "machine: $(getconf _NPROCESSORS_ONLN) core(s); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "profiling this CPU (2 ranks at once) -> $OUT/cpu-profiled.json"
"${MPI[@]}" "${STRATA[@]}" profile --config "$CONFIG" --cluster-out "$OUT/cpu-profiled.json" \
  | sed 's/^/  /'

# name | --set overrides
layouts=(
  "tensor 2|parallel.tensor=2"
  "pipeline 2 1f1b|parallel.pipeline=2 parallel.schedule=1f1b"
  "pipeline 2 interleaved|parallel.pipeline=2 parallel.schedule=interleaved parallel.virtual_stages=2"
  "pipeline 2 zb-h1|parallel.pipeline=2 parallel.schedule=zb-h1"
  "data 2|parallel.data=2"
)
printf '\n%-24s %12s %12s %8s %10s\n' layout predicted_s measured_s error cpu_share
for entry in "${layouts[@]}"; do
  name=${entry%%|*}
  tag=$(echo "$name" | tr ' ' '-' | sed 's/pipeline-2/pp2/; s/tensor-2/tp2/; s/data-2/dp2/')
  sets=()
  for s in ${entry#*|} "train.iterations=$ITERATIONS"; do sets+=(--set "$s"); done
  predicted=$("${MPI[@]}" "${STRATA[@]}" train --config "$CONFIG" "${sets[@]}" --dry-run \
                --cluster "$OUT/cpu-profiled.json" |
              python3 -c 'import re, sys
text = sys.stdin.read()
# "  iteration 231 ms: ..." under "predicted on", in the units strata prints.
num, unit = re.search(r"^  iteration (\S+) (h|min|s|ms|µs):", text[text.index("predicted on"):],
                      re.M).groups()
print(float(num) * {"h": 3600, "min": 60, "s": 1, "ms": 1e-3, "µs": 1e-6}[unit])')
  /usr/bin/time -f "%e %U %S" -o "$OUT/$tag.time" "${MPI[@]}" "${STRATA[@]}" train \
    --config "$CONFIG" "${sets[@]}" --set "log.metrics=\"$OUT/$tag.jsonl\"" \
    --set "log.trace=\"$OUT/$tag.trace\"" > "$OUT/$tag.log" 2>&1
  measured=$(python3 -c 'import sys, json, statistics
steps = [json.loads(l)["step_ms"] / 1e3 for l in open(sys.argv[1])]
print(statistics.median(steps[2:]))' "$OUT/$tag.jsonl")
  python3 -c 'import sys
p, m = float(sys.argv[2]), float(sys.argv[3])
wall, user, system = (float(x) for x in open(sys.argv[4]).read().split()[-3:])
print("%-24s %12.4f %12.4f %+7.1f%% %10.2f" % (sys.argv[1], p, m, (p / m - 1) * 100,
                                              (user + system) / (2 * wall)))' \
    "$name" "$predicted" "$measured" "$OUT/$tag.time"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"${STRATA[@]}" plan --model "$CONFIG" --cluster "$OUT/cpu-profiled.json" --precision fp32 \
  --global-batch-size 16 --nodes 1 --top 1 \
  --fix tensor=1,pipeline=2,data=1,micro_batch_size=4,schedule=1f1b,recompute=none \
  --svg "$OUT/pp2-1f1b.svg" --measured "$OUT/pp2-1f1b.trace" > /dev/null
echo "pipeline 2 1f1b, predicted above measured: $OUT/pp2-1f1b.svg (files in $OUT)"
