#!/usr/bin/env bash
# mpi_checkpoint_faults.sh MPIEXEC STRATA_BIN — the fault scenarios of issue 8 on 2 ranks
# (pipeline 2), 8 iterations, a checkpoint every 2:
#   1. rank 1 SIGKILLs itself as iteration 6 starts (STRATA_TEST_KILL_AT_ITER, a test hook):
#      the job must end with a non-zero status; rerunning the same command must resume from
#      iter_4 and reach the final loss of an uninterrupted run, bit for bit (same layout).
#   2. rank 1 SIGKILLs itself while the checkpoint of iteration 4 is being written
#      (STRATA_TEST_KILL_DURING_SAVE): iter_4 must never appear; the rerun resumes from iter_2
#      and reaches the same final loss.
#   3. the same as 1 with parallel.schedule 2bw (both weight versions in the checkpoint; the
#      kill comes as the stretch of batches after iter_4 starts, iteration 5): the rerun reaches
#      the final loss of an uninterrupted 2bw run, bit for bit.
#   4. the same as 2 with checkpoint.async (the shard written by a background thread while
#      training goes on): the kill in the background write of iteration 4 leaves iter_2 the
#      newest checkpoint; the rerun resumes from it and reaches the same final loss.
set -u
mpiexec=$1 strata=$2
work=$(mktemp -d /tmp/strata_faults.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat >"$work/config.json" <<JSON
{"model": {"preset": "tiny", "num_layers": 2, "hidden_size": 32, "num_heads": 4,
           "ffn_hidden_size": 128, "seq_len": 16, "vocab_size": 64},
 "parallel": {"pipeline": 2},
 "train": {"micro_batch_size": 1, "global_batch_size": 4, "iterations": 8, "threads": 1,
           "eval_interval": 0},
 "optimizer": {"lr": 0.01, "warmup_iters": 2},
 "log": {"interval": 100000}}
JSON
run() {  # run DIR METRICS [ENV=VALUE...] [-- STRATA ARGUMENTS...]
  local dir=$1 metrics=$2
  shift 2
  local envs=() extra=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift && extra=("$@")
  env "${envs[@]}" timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$strata" \
    train --config "$work/config.json" --set "checkpoint.dir=$dir" --set checkpoint.interval=2 \
    --set "log.metrics=$metrics" "${extra[@]}" 2>&1
}
final_loss() { sed -n 's/.*"loss": *\([^,}]*\).*/\1/p' "$1" | tail -1; }

fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi; }

"$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$strata" train --config "$work/config.json" \
  --set "log.metrics=$work/ref.jsonl" >/dev/null 2>&1
want=$(final_loss "$work/ref.jsonl")
echo "uninterrupted final loss: $want"

out=$(run "$work/a" "$work/a.jsonl" STRATA_TEST_KILL_AT_ITER=6); rc=$?
echo "--- killed at iteration 6: exit status $rc"
check "the job ends with a non-zero status" '[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]'
check "iter_4 is complete" '[ -f "$work/a/iter_4/metadata.json" ]'
out=$(run "$work/a" "$work/a.jsonl"); rc=$?
echo "$out" | grep -E "resumed|error" || true
check "the rerun succeeds" '[ "$rc" -eq 0 ]'
check "the rerun resumes from iter_4" 'grep -q "resumed from $work/a/iter_4" <<<"$out"'
got=$(final_loss "$work/a.jsonl")
check "final loss $got equals the uninterrupted $want" '[ -n "$want" ] && [ "$got" = "$want" ]'
check "the metrics file holds iterations 1..8 once each" \
  '[ "$(sed -n "s/.*\"iter\": *\([0-9]*\).*/\1/p" "$work/a.jsonl" | tr "\n" " ")" = "1 2 3 4 5 6 7 8 " ]'

out=$(run "$work/b" "$work/b.jsonl" STRATA_TEST_KILL_DURING_SAVE=4); rc=$?
echo "--- killed while saving iteration 4: exit status $rc; left: $(ls "$work/b" | tr '\n' ' ')"
check "the job ends with a non-zero status" '[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]'
check "no iter_4 appeared" '[ ! -e "$work/b/iter_4" ]'
out=$(run "$work/b" "$work/b.jsonl"); rc=$?
echo "$out" | grep -E "resumed|error" || true
check "the rerun resumes from iter_2" 'grep -q "resumed from $work/b/iter_2" <<<"$out"'
got=$(final_loss "$work/b.jsonl")
check "final loss $got equals the uninterrupted $want" '[ -n "$want" ] && [ "$got" = "$want" ]'

"$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$strata" train --config "$work/config.json" \
  --set parallel.schedule=2bw --set "log.metrics=$work/ref2bw.jsonl" >/dev/null 2>&1
want=$(final_loss "$work/ref2bw.jsonl")
echo "uninterrupted 2bw final loss: $want"
out=$(run "$work/c" "$work/c.jsonl" STRATA_TEST_KILL_AT_ITER=5 -- --set parallel.schedule=2bw); rc=$?
echo "--- 2bw killed at iteration 5: exit status $rc"
check "the 2bw job ends with a non-zero status" '[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]'
check "iter_4 holds both weight versions" \
  'grep -qa "param_prev:" "$work/c/iter_4/rank_0.safetensors"'
out=$(run "$work/c" "$work/c.jsonl" -- --set parallel.schedule=2bw); rc=$?
echo "$out" | grep -E "resumed|error" || true
check "the 2bw rerun resumes from iter_4" 'grep -q "resumed from $work/c/iter_4" <<<"$out"'
got=$(final_loss "$work/c.jsonl")
check "2bw final loss $got equals the uninterrupted $want" '[ -n "$want" ] && [ "$got" = "$want" ]'

out=$(run "$work/d" "$work/d.jsonl" STRATA_TEST_KILL_DURING_SAVE=4 -- --set checkpoint.async=true)
rc=$?
echo "--- killed during the background write of iteration 4: exit status $rc; left: $(ls "$work/d" | tr '\n' ' ')"
check "the job ends with a non-zero status" '[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]'
check "no iter_4 appeared" '[ ! -e "$work/d/iter_4" ]'
check "iter_2 is complete" '[ -f "$work/d/iter_2/metadata.json" ]'
out=$(run "$work/d" "$work/d.jsonl" -- --set checkpoint.async=true); rc=$?
echo "$out" | grep -E "resumed|error" || true
check "the rerun resumes from iter_2" 'grep -q "resumed from $work/d/iter_2" <<<"$out"'
want=$(final_loss "$work/ref.jsonl")
got=$(final_loss "$work/d.jsonl")
check "final loss $got equals the uninterrupted $want" '[ -n "$want" ] && [ "$got" = "$want" ]'

[ "$fail" -eq 0 ] && echo "PASS: checkpoint fault scenarios"
exit "$fail"
