#!/usr/bin/env bash
# mpi_watchdog_check.sh MPIEXEC PROBE TIMEOUT_S [nccl] — the watchdog test: runs
# mpi_watchdog_probe on 2 ranks (on the NCCL backend with "nccl"), where rank 1 waits for a send
# that never comes, and requires that the job
#   - exits with a non-zero status,
#   - prints rank 1's watchdog line naming peer, group, bytes and schedule step,
#   - ends within TIMEOUT_S + 5 seconds of launch (start-up included).
# Exits 77 (skipped) when the probe says SKIPPED (no CUDA device per rank for nccl).
set -u
mpiexec=$1 probe=$2 timeout_s=$3 backend=${4:-mpi}
limit=$((timeout_s + 5))

start=$(date +%s.%N)
# The outer timeout only keeps a broken watchdog from hanging ctest; it fails the check below.
out=$(timeout $((limit + 30)) "$mpiexec" --oversubscribe --allow-run-as-root -np 2 \
      "$probe" "$timeout_s" "$backend" 2>&1)
rc=$?
if grep -q '^SKIPPED' <<<"$out"; then printf '%s\n' "$out"; exit 77; fi
end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
printf '%s\n' "$out"
echo "--- exit status $rc after $elapsed s (limit $limit s)"

expected="[rank 1] watchdog: no progress for ${timeout_s} s in recv from world rank 0 (group world, 4096 bytes) at schedule step \"probe: recv-forward mb 0\""
fail=0
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited with status 0"; fail=1; fi
if ! grep -qF -- "$expected" <<<"$out"; then echo "FAIL: no line: $expected"; fail=1; fi
if awk -v e="$elapsed" -v l="$limit" 'BEGIN { exit !(e > l) }'; then
  echo "FAIL: took $elapsed s, more than $limit s"; fail=1
fi
[ "$fail" -eq 0 ] && echo "PASS: watchdog fired, job aborted with status $rc in $elapsed s"
exit "$fail"
