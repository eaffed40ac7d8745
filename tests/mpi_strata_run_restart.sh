#!/usr/bin/env bash
# mpi_strata_run_restart.sh STRATA_RUN STRATA_BIN — launch/strata-run --max-restarts on 2 ranks
# (pipeline 2), 8 iterations, a checkpoint every 2:
#   1. rank 1 dies at iteration 6 once (a wrapper sets STRATA_TEST_KILL_AT_ITER for the first
#      launch only): strata-run relaunches, the job resumes from iter_4 and ends with the final
#      loss of an uninterrupted run, bit for bit; one restart line;
#   2. rank 1 dies at iteration 6 every time: the relaunch gets no further than iter_4, so
#      strata-run gives up with the reason instead of using every restart;
#   3. and 4. a stop request (SIGTERM) to strata-run, while the job runs and during the delay
#      before a restart: exit status 4, never a restart.
set -u
strata_run=$1 strata=$2
work=$(mktemp -d /tmp/strata_restart.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat >"$work/config.json" <<JSON
{"model": {"preset": "tiny", "num_layers": 2, "hidden_size": 32, "num_heads": 4,
           "ffn_hidden_size": 128, "seq_len": 16, "vocab_size": 64},
 "parallel": {"pipeline": 2},
 "train": {"micro_batch_size": 1, "global_batch_size": 4, "iterations": 8, "threads": 1,
           "eval_interval": 0},
 "optimizer": {"lr": 0.01, "warmup_iters": 2},
 "checkpoint": {"interval": 2},
 "log": {"interval": 100000}}
JSON
# The rank program: rank 1 of the first launch (or of every launch with ALWAYS) dies at 6.
cat >"$work/strata" <<SH
#!/usr/bin/env bash
if [ "\${OMPI_COMM_WORLD_RANK:-0}" = 1 ] && { [ -n "\${ALWAYS:-}" ] || [ ! -e "$work/died" ]; }; then
  touch "$work/died"
  export STRATA_TEST_KILL_AT_ITER=6
fi
exec "$strata" "\$@"
SH
chmod +x "$work/strata"
final_loss() { sed -n 's/.*"loss": *\([^,}]*\).*/\1/p' "$1" | tail -1; }
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi; }
launch() {  # launch DIR METRICS [ENV=VALUE...]
  local dir=$1 metrics=$2
  shift 2
  env "$@" STRATA_BIN="$work/strata" timeout 240 python3 "$strata_run" --oversubscribe \
    --max-restarts 3 --restart-delay 0 --config "$work/config.json" \
    --set "checkpoint.dir=$dir" --set "log.metrics=$metrics" 2>&1
}

STRATA_BIN="$strata" python3 "$strata_run" --oversubscribe --config "$work/config.json" \
  --set "checkpoint.dir=$work/ref" \
  --set "log.metrics=$work/ref.jsonl" >/dev/null 2>&1
want=$(final_loss "$work/ref.jsonl")
echo "uninterrupted final loss: $want"

out=$(launch "$work/a" "$work/a.jsonl"); rc=$?
echo "$out" | grep -E "^strata-run|resumed" || true
check "the job completes after one restart (exit status $rc)" \
  '[ "$rc" -eq 0 ] && [ "$(grep -c "^strata-run: the job failed" <<<"$out")" -eq 1 ]'
check "the restart resumes from iter_4" \
  'grep -q "restart 1 of 3 in 0 s, resuming from iter_4" <<<"$out" && grep -q "resumed from $work/a/iter_4" <<<"$out"'
got=$(final_loss "$work/a.jsonl")
check "final loss $got equals the uninterrupted $want" '[ -n "$want" ] && [ "$got" = "$want" ]'

out=$(launch "$work/b" "$work/b.jsonl" ALWAYS=1); rc=$?
echo "$out" | grep -E "^strata-run" || true
check "a job failing at the same step ends non-zero (exit status $rc)" '[ "$rc" -ne 0 ]'
check "strata-run gives up after one restart, naming the reason" \
  'grep -q "keeps failing at the same step; giving up after 1 restart" <<<"$out"'

# 3. A stop request to strata-run (SIGTERM, as Slurm sends at a time limit) while the job runs:
#    the job saves and exits 4 and strata-run does not restart it (before, mpirun ended the job
#    on the SIGTERM and strata-run relaunched it to completion). The signal goes to strata-run
#    alone (pkill -P: the child of `timeout`, which would signal its whole process group).
cat >"$work/long.json" <<JSON
{"model": {"preset": "tiny", "num_layers": 2, "hidden_size": 32, "num_heads": 4,
           "ffn_hidden_size": 128, "seq_len": 16, "vocab_size": 64},
 "parallel": {"pipeline": 2},
 "train": {"micro_batch_size": 1, "global_batch_size": 4, "iterations": 100000, "threads": 1,
           "eval_interval": 0},
 "checkpoint": {"interval": 100000},
 "log": {"interval": 100000}}
JSON
STRATA_BIN="$strata" timeout 240 python3 "$strata_run" --oversubscribe --max-restarts 3 \
  --restart-delay 0 --config "$work/long.json" --set "checkpoint.dir=$work/c" \
  --set "log.metrics=$work/c.jsonl" >"$work/c.out" 2>&1 &
pid=$!
for _ in $(seq 600); do [ -s "$work/c.jsonl" ] && break; sleep 0.05; done
pkill -TERM -P "$pid"
wait "$pid"; rc=$?
grep -E "^strata-run|^stopped" "$work/c.out" || true
check "SIGTERM to strata-run: the job saves and exits 4, no restart (exit status $rc)" \
  '[ "$rc" -eq 4 ] && grep -q "^stopped by SIGUSR1 after iteration" "$work/c.out" &&
   ! grep -q "restart 1 of" "$work/c.out" && ls "$work/c" | grep -q "^iter_"'
# 4. A stop request during the restart delay ends strata-run at once, with status 4.
rm -f "$work/died"
STRATA_BIN="$work/strata" timeout 240 python3 "$strata_run" --oversubscribe --max-restarts 3 \
  --restart-delay 60 --config "$work/config.json" --set "checkpoint.dir=$work/d" \
  --set "log.metrics=$work/d.jsonl" >"$work/d.out" 2>&1 &
pid=$!
for _ in $(seq 1200); do grep -q "restart 1 of 3 in 60 s" "$work/d.out" && break; sleep 0.05; done
start=$(date +%s)
pkill -TERM -P "$pid"
wait "$pid"; rc=$?
took=$(($(date +%s) - start))
grep -E "^strata-run" "$work/d.out" || true
check "SIGTERM during the restart delay: exit status $rc is 4 within ${took} s, no relaunch" \
  '[ "$rc" -eq 4 ] && [ "$took" -lt 10 ] &&
   grep -q "stopped on request (SIGTERM) before the restart" "$work/d.out"'

[ "$fail" -eq 0 ] && echo "PASS: strata-run restarts"
exit "$fail"
