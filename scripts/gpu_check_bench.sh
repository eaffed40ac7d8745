# scripts/gpu_check_bench.sh — the benchmark steps of scripts/gpu_check (sourced by it, never run
# alone): kernels, the Strata throughput runs (bench124m, bench1p3b, benchllama1b,
# benchbertlarge, benchqwen3moe, each also with cuDNN's attention), context parallelism's
# (benchcontext), profile, timeline, the PyTorch
# references (torch124m, torch1p3b, torchllama1b, torchbertlarge, torchqwen3moe) and the table (summarize, summary). They
# use gpu_check's settings and helpers (ROOT, OUT, LOGDIR, BUILD_DIR, PEAK_TFLOPS, STEP, note,
# wanted); gpu_check's header documents each step.

# kernels: bench/bench_cuda_kernels.cc's table (into this step's log, so gpu_check.log, and at
# the end into summary.txt); its per-model lines make the note; its JSON stays in $LOGDIR.
step_kernels() {
  STEP=kernels
  local exe=$BUILD_DIR/bench/bench_cuda_kernels out=$LOGDIR/kernels.txt
  rm -f "$out" "$LOGDIR/kernels.json"
  [ -x "$exe" ] || { echo "no $exe (see the build step)"; note "no bench_cuda_kernels binary"; return 1; }
  local args=(--peak-bf16 "$PEAK_TFLOPS" --json "$LOGDIR/kernels.json")
  [ -n "${HBM_GBPS:-}" ] && args+=(--hbm-gbps "$HBM_GBPS")
  "$exe" "${args[@]}" | tee "$out"
  local rc=$?
  if grep -q 'no CUDA device' "$out"; then note "no CUDA device"; return 1; fi
  # "summary 124m bf16: gemm 41-72%, attention fwd 38% bwd 25%, memory-bound 40-85% of HBM"
  note "$(grep '^summary [^ ]* [bf]' "$out" | sed -E 's/^summary //; s/attention /attn /;
    s/memory-bound/mem/; s/ of HBM//' | awk 'NR > 1 { printf "; " } { printf "%s", $0 }')"
  if grep -q 'FAILED:' "$out"; then note "$(grep -c 'FAILED:' "$out") kernel row(s) FAILED, see the log"; rc=1; fi
  return "$rc"
}

# strata_bench LABEL CONFIG: one throughput run, metrics to $OUT/strata_LABEL.jsonl; then the
# same config with cuDNN's attention (train.attention_backend=cudnn), whose metrics lines, tagged
# {"label": LABEL, "attention_backend": "cudnn", ...}, go to $OUT/strata_cudnn.jsonl (one file for
# both models: $OUT holds at most 8). The step's status is the first run's; the cuDNN run's
# outcome goes to the note, and a failure also to the file as an "error" line for the table. It
# gets what the step's limit leaves (less a margin), so it cannot turn the step into a TIMEOUT.
strata_bench() {
  local label=$1 cfg=$2 m=$OUT/strata_$1.jsonl
  local cm=$OUT/strata_cudnn.jsonl cmetrics=$LOGDIR/strata_$1-cudnn.jsonl
  local clog=$LOGDIR/${STEP}_cudnn.log old=$LOGDIR/strata_cudnn.jsonl.old
  local tag="{\"label\":\"$label\",\"attention_backend\":\"cudnn\","
  rm -f "$m" "$cmetrics" "$clog"
  if [ -f "$cm" ]; then  # drop an earlier run's lines of this label (the copy is not in $OUT)
    grep -vF "$tag" "$cm" > "$old"; cat "$old" > "$cm"
  fi
  "$BUILD_DIR/strata" train --config "$ROOT/$cfg" --dry-run 2>&1 | tail -n 12
  # Strata's own attention kernels here; the cuDNN run follows ("auto" picks cuDNN where it runs
  # the shape, so the config's default is the second run).
  "$BUILD_DIR/strata" train --config "$ROOT/$cfg" --set train.attention_backend=strata \
    --set "log.metrics=$m"
  local rc=$?
  timeout 10 nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv 2>/dev/null
  local done_line
  done_line=$(grep -m1 '^done:' "$LOGDIR/$STEP.log" 2>/dev/null | cut -c1-200)
  note "$done_line"  # now, in case the step is ended during the cuDNN run; both in one line below

  local left=$((${STEP_LIMIT:-600} - SECONDS - 20)) crc how
  if [ "$left" -lt 30 ]; then
    rm -f "$LOGDIR/$STEP.note"
    note "${done_line:+$done_line; }cudnn attn: skipped, ${left}s left of the step's ${STEP_LIMIT:-600}s"
    return "$rc"
  fi
  echo "== the same with train.attention_backend=cudnn (limit ${left}s)"
  timeout -k 5 "$left" "$BUILD_DIR/strata" train --config "$ROOT/$cfg" \
    --set train.attention_backend=cudnn --set "log.metrics=$cmetrics" 2>&1 | tee "$clog"
  crc=${PIPESTATUS[0]}
  [ -f "$cmetrics" ] && sed "s/^{/$tag/" "$cmetrics" >> "$cm"
  if [ "$crc" = 0 ]; then
    # "final loss 7.1234 | 612.3 k tok/s | peak memory 31.25 GiB": the done line, shortened so
    # that both runs' fit the note
    how=$(grep -m1 '^done:' "$clog" | sed -E 's/^done: [^|]*\| //;
      s/ \| (val|floor) [^|]*[^ |]//g; s/ per rank$//')
  else
    if [ "$crc" = 124 ] || [ "$crc" = 137 ]; then how="killed after ${left}s"
    else  # its last line: the error, without the "[rank 0 host ...] error: " prefix
      how="failed rc=$crc: $(grep -v '^[[:space:]]*$' "$clog" | tail -n 1 |
        sed -E 's/^\[rank [0-9]+ host [^]]*\] (error: )?//' | cut -c1-90)"
    fi
    python3 -c 'import json, sys
print(json.dumps({"label": sys.argv[1], "attention_backend": "cudnn", "error": sys.argv[2]},
                 separators=(",", ":")))' "$label" "$how" >> "$cm"
  fi
  rm -f "$LOGDIR/$STEP.note"
  note "${done_line:+$done_line; }cudnn attn: $how"
  return "$rc"
}
step_bench124m() { STEP=bench124m; strata_bench gpt2-124m configs/bench/gpt2-124m-gpu.json; }
step_bench1p3b() { STEP=bench1p3b; strata_bench gpt-1.3b configs/bench/gpt-1.3b-gpu.json; }
step_benchllama1b() {
  STEP=benchllama1b; strata_bench llama-3.2-1b configs/bench/llama-3.2-1b-gpu.json
}
step_benchbertlarge() {
  STEP=benchbertlarge; strata_bench bert-large configs/bench/bert-large-gpu.json
}
step_benchqwen3moe() {
  STEP=benchqwen3moe; strata_bench qwen3-30b-a3b-4l configs/bench/qwen3-30b-a3b-4l-gpu.json
}

# benchcontext: ring attention's blocks against the unsplit flash kernels (bench_cuda_kernels
# --context-seqs), then Llama-3.2-1B at 32768 tokens on the one GPU (selective recompute, or full
# if that fails): the ratios, tokens/s and peak memory in the note.
step_benchcontext() {
  STEP=benchcontext
  local exe=$BUILD_DIR/bench/bench_cuda_kernels out=$LOGDIR/context_kernels.txt rc=0
  local cfg=configs/bench/llama-3.2-1b-gpu.json m=$OUT/strata_llama-1b-32k.jsonl how rec
  rm -f "$out" "$m"
  if [ -x "$exe" ]; then
    "$exe" --models= --types bf16 --context-seqs 8192,16384,32768 --peak-bf16 "$PEAK_TFLOPS" |
      tee "$out"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    grep -q 'FAILED:' "$out" && rc=1
    # "ring c2 S=32768 bf16: per token 1.043 x ..." -> "c2 32k 1.04"
    note "blocks per token vs unsplit: $(sed -nE 's/^ring (c[0-9]+) S=([0-9]+)[^:]*: per token ([0-9.]+).*/\1 \2 \3/p' "$out" |
      awk '{ printf "%s%s@%dk %.2f", NR > 1 ? ", " : "", $1, $2 / 1024, $3 }')"
  else
    note "no $exe"; rc=1
  fi
  for rec in selective full; do
    echo "== Llama-3.2-1B at 32768 tokens, recompute $rec"
    "$BUILD_DIR/strata" train --config "$ROOT/$cfg" --set model.seq_len=32768 \
      --set train.micro_batch_size=1 --set train.global_batch_size=1 --set train.iterations=8 \
      --set optimizer.warmup_iters=2 --set "train.recompute=$rec" --set "log.metrics=$m" \
      2>&1 | tee "$LOGDIR/benchcontext_$rec.log"
    if [ "${PIPESTATUS[0]}" = 0 ]; then
      how=$(grep -m1 '^done:' "$LOGDIR/benchcontext_$rec.log" | sed -E 's/^done: [^|]*\| //')
      note "llama-1b 32k ($rec recompute): $how"
      return "$rc"
    fi
    note "llama-1b 32k ($rec recompute) failed: $(tail -n 1 "$LOGDIR/benchcontext_$rec.log" | cut -c1-80)"
  done
  return 1
}

# profile: `strata profile` on the GPU (GPT-2 124M, bf16, micro-batches 8 and 16) writes the
# per-layer times; `strata plan --profile` must accept them, and its predicted iteration time
# for the benchmark's own layout (one H100, b = 16, no recompute) is set beside the step time
# bench124m measured.
step_profile() {
  STEP=profile
  local S=$BUILD_DIR/strata prof=$OUT/profile_gpt2-124m.json cluster=$LOGDIR/one-h100.json rc=0
  rm -f "$prof" "$LOGDIR/plan_profile.json"
  "$S" profile --config "$ROOT/configs/bench/gpt2-124m-gpu.json" --micro-batch-sizes 8,16 \
    --repeat 5 --out "$prof" || { note "strata profile failed"; return 1; }
  cat "$prof"
  python3 - "$ROOT/configs/clusters/dgx-h100.json" "$cluster" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(name="one-h100", nodes=1, gpus_per_node=1, nics_per_node=1)
json.dump(c, open(sys.argv[2], "w"))
PY
  "$S" plan --model gpt2-124m --cluster "$cluster" --global-batch-size 16 --precision bf16 \
    --profile "$prof" --fix tensor=1,pipeline=1,data=1,micro_batch_size=16,recompute=none \
    --json "$LOGDIR/plan_profile.json" || rc=1
  # The profile ran the config's attention ("auto": cuDNN), as did bench124m's second run.
  note "$(python3 - "$LOGDIR/plan_profile.json" "$LOGDIR/strata_gpt2-124m-cudnn.jsonl" <<'PY'
import json, statistics, sys
try:
    plans = json.load(open(sys.argv[1]))["plans"]
    pred = plans[0]["predicted"]["iteration_s"]
except Exception as e:
    print("plan with the profile: none (%s)" % e); sys.exit(0)
text = "planner with the GPU profile: %.1f ms/iteration" % (1e3 * pred)
try:
    steps = [json.loads(l)["step_ms"] for l in open(sys.argv[2]) if l.strip()]
    med = statistics.median(steps[5:] or steps)
    text += ", bench124m (cuDNN attention) measured %.1f ms (%+.0f%%)" % (med, 100 * (1e3 * pred / med - 1))
    if abs(1e3 * pred / med - 1) > 0.2:
        text += "; OFF BY MORE THAN 20%"
except Exception:
    text += " (no bench124m metrics to compare)"
print(text)
PY
)"
  # The planner's contract (tests/test_profile_time.cc on the CPU): within 20% of the run.
  grep -q "OFF BY MORE THAN 20%" "$LOGDIR/profile.note" && rc=1
  return $rc
}

# timeline: a CUPTI timeline of GPT-2 124M's training (8 iterations, the config's default
# attention) with bench/gpu/cupti_trace.cc preloaded; bench/gpu/timeline_summary.py prints the
# last iteration's GPU busy and idle time, its longest idle gaps and its kernels by time. The
# trace (Perfetto / chrome://tracing) stays in $LOGDIR/timeline_gpt2-124m.json.gz.
step_timeline() {
  STEP=timeline
  local so=$LOGDIR/cupti_trace.so trace=$LOGDIR/timeline_gpt2-124m.json lib inc
  lib=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu -name 'libcupti.so*' 2>/dev/null | head -1)
  inc=$(find /usr/local/cuda*/ -name cupti.h 2>/dev/null | head -1)
  if [ -z "$lib" ] || [ -z "$inc" ]; then note "no CUPTI (libcupti.so, cupti.h) found"; return 1; fi
  g++ -O2 -shared -fPIC "$ROOT/bench/gpu/cupti_trace.cc" -I"$(dirname "$inc")" \
    -L"$(dirname "$lib")" -l:"$(basename "$lib")" -Wl,-rpath,"$(dirname "$lib")" -o "$so" ||
    { note "cannot build cupti_trace.so"; return 1; }
  rm -f "$trace" "$trace.gz"
  STRATA_CUPTI_TRACE=$trace LD_PRELOAD=$so "$BUILD_DIR/strata" train \
    --config "$ROOT/configs/bench/gpt2-124m-gpu.json" --set train.iterations=8 \
    --set log.interval=1 || { note "traced run failed"; return 1; }
  python3 "$ROOT/bench/gpu/timeline_summary.py" "$trace" | tee "$LOGDIR/timeline.txt"
  local rc=$?
  gzip -f "$trace"
  note "$(head -1 "$LOGDIR/timeline.txt" | sed 's/^timeline: //')"
  return $rc
}

# torch_bench LABEL ARGS...: eager and torch.compile, JSON lines appended to $OUT/torch.jsonl;
# the script is bench/gpu/$TORCH_SCRIPT (default torch_gpt.py).
torch_bench() {
  local label=$1; shift
  if [ "$TORCH_CUDA" != 1 ]; then echo "torch with CUDA not available"; note "no torch+CUDA"; return 1; fi
  python3 "$ROOT/bench/gpu/${TORCH_SCRIPT:-torch_gpt.py}" --label "$label" \
    --peak-tflops "$PEAK_TFLOPS" "$@" \
    | tee "$LOGDIR/$STEP.jsonl"
  local rc=$?
  cat "$LOGDIR/$STEP.jsonl" >> "$OUT/torch.jsonl"
  note "$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l); print(r["impl"], ("%.0f tok/s %.1f%% MFU" % (r["tokens_per_s"], 100*r["mfu"])) if "error" not in r else "error", end="; ")' "$LOGDIR/$STEP.jsonl" 2>/dev/null)"
  return $rc
}
step_torch124m() {
  STEP=torch124m
  torch_bench gpt2-124m --layers 12 --hidden 768 --heads 12 --seq 1024 --vocab 50257 \
    --micro-batch 16 --global-batch 16 --iters 20 --warmup 5 --compile 0,1
}
step_torch1p3b() {
  STEP=torch1p3b
  torch_bench gpt-1.3b --layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab 50257 \
    --micro-batch 4 --global-batch 16 --iters 10 --warmup 3 --compile 0,1
}
# hf_check SCRIPT: the reference's own check against transformers (fp32, CPU, seconds), whose
# result ends the step's note; fails when it differs (skipped where transformers is missing).
hf_check() {
  local hf=$LOGDIR/${STEP}_hf.jsonl hrc
  python3 "$ROOT/bench/gpu/$1" --check-hf > "$hf" 2> "$LOGDIR/${STEP}_hf.err"
  hrc=$?
  cat "$hf"
  if ! python3 -c 'import transformers' 2>/dev/null; then
    note "hf check: skipped (no transformers)"
    return 0
  fi
  note "hf check: $(python3 -c 'import json, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("%s, %d case(s), logits max abs diff %.2g" % ("ok" if rs and all(r["ok"] for r in rs)
      else "FAILED", len(rs), max([r["logits_max_abs_diff"] for r in rs] or [float("nan")])))' \
    "$hf" 2>/dev/null || echo "FAILED rc=$hrc")"
  return $hrc
}

# Llama 3.2 1B as configs/bench/llama-3.2-1b-gpu.json trains it (the preset's shape, tied head,
# rope theta and llama3 scaling; seq 2048, 4 micro-batches of 4); then the reference's check
# against transformers' LlamaForCausalLM.
step_torchllama1b() {
  STEP=torchllama1b
  TORCH_SCRIPT=torch_llama.py torch_bench llama-3.2-1b --layers 16 --hidden 2048 --heads 32 \
    --kv-heads 8 --ffn 8192 --seq 2048 --vocab 128256 --tie 1 --rope-theta 500000 \
    --rope-scaling 32,1,4,8192 --rms-eps 1e-5 \
    --micro-batch 4 --global-batch 16 --iters 10 --warmup 3 --compile 0,1
  local rc=$?
  hf_check torch_llama.py || rc=1
  return $rc
}

# BERT-large as configs/bench/bert-large-gpu.json trains it (seq 512, 2 micro-batches of 32,
# sequences of random real length from 256, 15% predicted); then the reference's check against
# transformers' BertForPreTraining.
step_torchbertlarge() {
  STEP=torchbertlarge
  TORCH_SCRIPT=torch_bert.py torch_bench bert-large --layers 24 --hidden 1024 --heads 16 \
    --ffn 4096 --seq 512 --vocab 30522 --min-length 256 \
    --micro-batch 32 --global-batch 64 --iters 10 --warmup 3 --compile 0,1
  local rc=$?
  hf_check torch_bert.py || rc=1
  return $rc
}

# Qwen3-30B-A3B cut to 4 layers as configs/bench/qwen3-30b-a3b-4l-gpu.json trains it (128 experts
# of 768, top-8, QK-norm, head_dim 128, seq 2048, 4 micro-batches of 2, the balancing loss at
# 0.001), the experts as transformers' grouped_mm implementation runs them; then the reference's
# check against transformers' Qwen3MoeForCausalLM (logits, loss and balancing loss).
step_torchqwen3moe() {
  STEP=torchqwen3moe
  TORCH_SCRIPT=torch_qwen3_moe.py torch_bench qwen3-30b-a3b-4l --layers 4 --hidden 2048 \
    --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --top-k 8 --moe-ffn 768 --seq 2048 \
    --vocab 151936 --rope-theta 1000000 --rms-eps 1e-6 --router-aux-loss-coef 0.001 \
    --experts-impl grouped_mm --micro-batch 2 --global-batch 8 --iters 10 --warmup 3 --compile 0,1
  local rc=$?
  hf_check torch_qwen3_moe.py || rc=1
  return $rc
}

# The table: each model whose bench step runs now, or whose metrics file is already in $OUT.
summarize() {
  local strata=() label step
  for label in gpt2-124m:bench124m gpt-1.3b:bench1p3b llama-3.2-1b:benchllama1b \
    bert-large:benchbertlarge qwen3-30b-a3b-4l:benchqwen3moe; do
    step=${label#*:}; label=${label%%:*}
    if wanted "$step" || [ -f "$OUT/strata_$label.jsonl" ]; then
      strata+=(--strata "$label=$OUT/strata_$label.jsonl")
    fi
  done
  python3 "$ROOT/bench/gpu/summarize.py" --skip 5 --peak-tflops "$PEAK_TFLOPS" ${strata[@]+"${strata[@]}"} \
    --strata-cudnn "$OUT/strata_cudnn.jsonl" --torch "$OUT/torch.jsonl" --json "$LOGDIR/bench.json" \
    > "$OUT/bench.txt" 2>&1
}
step_summary() { STEP=summary; summarize; cat "$OUT/bench.txt"; }
