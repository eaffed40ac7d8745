#!/usr/bin/env bash
# mpi_input_error_one_rank.sh MPIEXEC STRATA_BIN — bad data that only some ranks read (issue 39,
# item 9): an llm.c shard with one token id above model.vocab_size, read by the rank whose
# sequences hold it while the others wait for it in the step's collectives. The job must end
# with exit status 2 and the data error's one line (file, byte, what was expected) within
# seconds, under data 2 and under pipeline 2 — never after comm.timeout_s (60 s here) with only
# the watchdog's line. Before the fix both layouts hung until the watchdog, and the data error
# was never printed.
set -u
mpiexec=$1 strata=$2
work=$(mktemp -d /tmp/strata_input_error.XXXXXX)
trap 'rm -rf "$work"' EXIT
# 20000 tokens below 60, and 5000 at token 15000 (byte 1024 + 2·15000 of the shard).
python3 - "$work/shard_000000.bin" <<'PY'
import random, struct, sys
random.seed(1)
n = 20000
toks = [random.randrange(0, 60) for _ in range(n)]
toks[15000] = 5000
header = [20240520, 1, n] + [0] * 253
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack("<%dH" % n, *toks))
PY
cat >"$work/config.json" <<JSON
{"model": {"preset": "tiny", "num_layers": 2, "hidden_size": 32, "num_heads": 4,
           "ffn_hidden_size": 128, "seq_len": 16, "vocab_size": 64},
 "train": {"micro_batch_size": 2, "global_batch_size": 4, "iterations": 400, "threads": 1,
           "eval_interval": 0},
 "data": {"source": "tokens", "path": "$work/shard_*.bin"},
 "comm": {"timeout_s": 60},
 "log": {"interval": 100000}}
JSON
fail=0
flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
for layout in parallel.data=2 parallel.pipeline=2; do
  start=$(date +%s.%N)
  timeout -k 5 120 "$mpiexec" "${flags[@]}" -np 2 "$strata" train --config "$work/config.json" \
    --set "$layout" > "$work/out.txt" 2>&1
  rc=$?
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  line="error: $work/shard_000000.bin: byte 31024: token ids below the model's vocabulary 64"
  if [ "$rc" != 2 ] || ! grep -qF "$line" "$work/out.txt" || grep -q watchdog "$work/out.txt" ||
     awk -v t="$took" 'BEGIN { exit !(t > 30) }'; then
    echo "FAIL: $layout: exit $rc after ${took}s (want 2 within 30 s, with the data error's line)"
    cat "$work/out.txt"
    fail=1
  else
    echo "ok: $layout: exit 2 after ${took}s: $(grep -F "$line" "$work/out.txt" | head -1)"
  fi
done
exit $fail
