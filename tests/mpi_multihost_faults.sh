#!/usr/bin/env bash
# mpi_multihost_faults.sh MPIEXEC STRATA_RUN STRATA_BIN — multi-host faults for real (issue 27).
# Two network namespaces joined by a veth pair play two hosts, each with a hostname of its own
# (Open MPI names its shared-memory segments, and Strata its hosts, after it). Open MPI starts the
# far host's daemon through an rsh agent that enters that namespace. A 4-rank `strata train` job,
# pipeline 2 x data 2, puts stage 0 (world ranks 0, 1) on host A and stage 1 (ranks 2, 3) on host
# B: activations, gradients and the tied embedding's sum cross the link over Open MPI's TCP
# transport; the data-parallel pairs talk through shared memory inside a host. Checks:
#   a. the losses and gradient norms of every iteration equal the same job's on one host, bit for
#      bit;
#   b. `ip link set down` on the link mid-run (under launch/strata-run --max-restarts): on each
#      host a rank prints its watchdog line naming the operation and a peer on the other host, and
#      every rank process is gone, within comm.timeout_s + 5 s of the cut; the job ends with a
#      non-zero status (mpirun waits for the daemon it cannot reach, so strata-run stops it
#      comm.timeout_s after a rank's abort line). The timings are printed;
#   c. with the link back up before the relaunch, strata-run resumes the job from its newest
#      checkpoint and it ends with the uninterrupted run's final loss, bit for bit.
# Needs root, iproute2 (ip netns, veth) and util-linux (unshare); exits 77 (ctest: skipped) with
# the reason where namespaces cannot be created. The namespaces, the veth pair, the processes
# left in them and Open MPI's files named after the two hostnames are removed on every exit.
set -u
mpiexec=$1 strata_run=$2 strata=$3
timeout_s=5
limit=$((timeout_s + 5))

skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "not root: creating network namespaces needs root"
command -v ip >/dev/null || skip "no ip command (Debian package iproute2)"
command -v unshare >/dev/null || skip "no unshare command (Debian package util-linux)"

# Names with this shell's pid: tests running at the same time do not collide. Interface names
# have at most 15 characters.
id=$$
nsA=strata-mh$id-a nsB=strata-mh$id-b
vethA=smh${id}a vethB=smh${id}b
hostA=smh$id-a hostB=smh$id-b
ipA=10.231.0.1 ipB=10.231.0.2 net=10.231.0.0/24
work=$(mktemp -d /tmp/strata_multihost.XXXXXX)
cleanup() {
  local ns p
  for ns in "$nsA" "$nsB"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  ip netns del "$nsA" 2>/dev/null
  ip netns del "$nsB" 2>/dev/null
  ip link del "$vethA" 2>/dev/null  # still in this namespace if setting up failed half-way
  [ -n "${STRATA_TEST_KEEP:-}" ] || rm -rf "$work"
  rm -rf /tmp/ompi."$hostA".* /tmp/ompi."$hostB".* /dev/shm/*."$hostA".* \
    /dev/shm/*."$hostB".*
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ip netns add "$nsA" 2>"$work/err" || skip "cannot create a network namespace: $(cat "$work/err")"
ip netns add "$nsB" 2>"$work/err" || skip "cannot create a network namespace: $(cat "$work/err")"
ip link add "$vethA" type veth peer name "$vethB" 2>"$work/err" ||
  skip "cannot create a veth pair: $(cat "$work/err")"
ip netns exec "$nsA" unshare --uts true 2>"$work/err" ||
  skip "cannot give a namespace its own hostname (unshare --uts): $(cat "$work/err")"
set -e
ip link set "$vethA" netns "$nsA"
ip link set "$vethB" netns "$nsB"
ip -n "$nsA" addr add "$ipA/24" dev "$vethA"
ip -n "$nsB" addr add "$ipB/24" dev "$vethB"
for ns_dev in "$nsA $vethA" "$nsB $vethB"; do
  set -- $ns_dev
  ip -n "$1" link set lo up
  ip -n "$1" link set "$2" up
done
set +e

# The rsh agent: `agent HOST COMMAND...` runs the command in HOST's namespace and hostname, as ssh
# would run it on that host.
cat >"$work/agent" <<SH
#!/bin/sh
host=\$1
shift
case \$host in
  $ipA) ns=$nsA name=$hostA ;;
  $ipB) ns=$nsB name=$hostB ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c 'hostname "\$0" && exec /bin/sh -c "\$1"' \
  "\$name" "\$*"
SH
chmod +x "$work/agent"
printf '%s slots=2\n%s slots=2\n' "$ipA" "$ipB" >"$work/hosts"
# A command on host A (mpirun's host), for at most 300 s.
on_host_a() {
  timeout 300 ip netns exec "$nsA" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' \
    "$hostA" "$@"
}

interval=100 iterations=300
cat >"$work/config.json" <<JSON
{"model": {"preset": "tiny", "num_layers": 2, "hidden_size": 32, "num_heads": 4,
           "ffn_hidden_size": 128, "seq_len": 16, "vocab_size": 64},
 "parallel": {"pipeline": 2, "data": 2},
 "train": {"micro_batch_size": 1, "global_batch_size": 8, "iterations": $iterations,
           "threads": 1, "eval_interval": 0},
 "optimizer": {"lr": 0.01, "warmup_iters": 2},
 "comm": {"timeout_s": $timeout_s},
 "checkpoint": {"interval": $interval},
 "log": {"interval": 100000}}
JSON
# Open MPI between the two hosts: the rsh agent, TCP on the veth for the daemons and the ranks,
# shared memory inside a host. The two "hosts" share this machine's cores, which Open MPI cannot
# see: waits must yield (Strata follows mpi_yield_when_idle, runtime/comm/watchdog.h). Each rank's
# output also goes to a file on its own host (--output-filename): mpirun never gets the far
# host's lines while the link is down.
two_hosts() {  # two_hosts TAG: strata-run's arguments for a job over both hosts
  local a
  for a in --mca plm_rsh_agent "$work/agent" --mca pml ob1 --mca btl tcp,vader,self \
    --mca btl_tcp_if_include "$net" --mca oob_tcp_if_include "$net" \
    --mca mpi_yield_when_idle 1 --output-filename "$work/out_$1"; do
    printf -- '--mpi-arg=%s\n' "$a"
  done
  printf -- '--hostfile=%s\n' "$work/hosts"
}
export MPIRUN=$mpiexec STRATA_BIN=$strata
run() {  # run TAG [strata-run arguments...] — config, checkpoints and metrics of TAG
  local tag=$1
  shift
  python3 "$strata_run" --oversubscribe "$@" --config "$work/config.json" \
    --set "checkpoint.dir=$work/ckpt_$tag" --set "log.metrics=$work/$tag.jsonl"
}
steps() { sed -n 's/.*"iter":\([0-9]*\),"loss":\([^,]*\),.*"grad_norm":\([^,]*\),.*/\1 \2 \3/p' "$1"; }
final_loss() { steps "$1" | tail -1 | cut -d' ' -f2; }
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
within() { awk -v e="$1" -v l="$2" 'BEGIN { exit !(e != "" && e <= l) }'; }
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi; }

echo "== hosts: $hostA ($nsA, $ipA) and $hostB ($nsB, $ipB)"
mapfile -t mh < <(two_hosts dry)
dry=$(on_host_a python3 "$strata_run" --oversubscribe "${mh[@]}" --config "$work/config.json" \
  --set "checkpoint.dir=$work/ckpt_dry" --dry-run 2>&1)
table=$(sed -n '/rank  *tp/,/^ *3 /p' <<<"$dry")
echo "${table:-$dry}"
check "strata places world ranks 0, 1 on host A and 2, 3 on host B" \
  '[ "$(awk '"'"'$1 ~ /^[0-9]$/ { printf "%s ", $5 }'"'"' <<<"$table")" = "$hostA $hostA $hostB $hostB " ]'

echo "== a. the job on one host, then over the two"
timeout 300 python3 "$strata_run" --oversubscribe --config "$work/config.json" \
  --set "checkpoint.dir=$work/ckpt_one" --set "log.metrics=$work/one.jsonl" >"$work/one.log" 2>&1
rc_one=$?
mapfile -t mh < <(two_hosts two)
t0=$(now)
on_host_a python3 "$strata_run" --oversubscribe "${mh[@]}" \
  --config "$work/config.json" --set "checkpoint.dir=$work/ckpt_two" \
  --set "log.metrics=$work/two.jsonl" >"$work/two.log" 2>&1
rc_two=$?
echo "two hosts: exit status $rc_two, $(since "$t0" "$(now)") s for $iterations iterations"
want=$(final_loss "$work/one.jsonl")
check "both runs end with status 0 (one host $rc_one, two hosts $rc_two)" \
  '[ "$rc_one" -eq 0 ] && [ "$rc_two" -eq 0 ] || { tail -n 20 "$work/one.log" "$work/two.log"; false; }'
check "$iterations iterations, losses and gradient norms identical to the one-host run (final loss $want)" \
  '[ "$(steps "$work/one.jsonl" | wc -l)" -eq "$iterations" ] &&
   cmp -s <(steps "$work/one.jsonl") <(steps "$work/two.jsonl")'

echo "== b. the link cut mid-run, under strata-run --max-restarts 2"
mapfile -t mh < <(two_hosts cut)
on_host_a python3 "$strata_run" --oversubscribe --max-restarts 2 --restart-delay 2 "${mh[@]}" \
  --config "$work/config.json" --set "checkpoint.dir=$work/ckpt_cut" \
  --set "log.metrics=$work/cut.jsonl" >"$work/cut.log" 2>&1 &
job=$!
# The rank processes (strata) still alive in namespace $1.
ranks_in() {
  local p n=0
  for p in $(ip netns pids "$1" 2>/dev/null); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = strata ] &&
      [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] && n=$((n + 1))
  done
  echo "$n"
}
# Mid-run: two iterations after the first checkpoint (not inside the save's closing barrier).
deadline=$(($(date +%s) + 120))
until [ -e "$work/ckpt_cut/iter_$interval/metadata.json" ] &&
  [ "$(steps "$work/cut.jsonl" | tail -1 | cut -d' ' -f1)" -ge $((interval + 2)) ] ||
  [ "$(date +%s)" -gt "$deadline" ] || ! kill -0 "$job" 2>/dev/null; do sleep 0.02; done
t_down=$(now)
ip -n "$nsA" link set "$vethA" down
echo "link down at iteration $(steps "$work/cut.jsonl" | tail -1 | cut -d' ' -f1)"
declare -A line_at line_text
gone_a="" gone_b="" failed_at="" up_at=""
while kill -0 "$job" 2>/dev/null; do
  t=$(now)
  for r in 0 1 2 3; do
    if [ -z "${line_at[$r]:-}" ]; then
      f=$work/out_cut/1/rank.$r/stderr
      l=$(grep -m1 -h "watchdog:" "$f" 2>/dev/null)
      # When it was written: the file's last change (the line is the rank's last word).
      if [ -n "$l" ]; then line_at[$r]=$(since "$t_down" "$(stat -c %.6Y "$f")"); line_text[$r]=$l; fi
    fi
  done
  [ -z "$gone_a" ] && [ "$(ranks_in "$nsA")" -eq 0 ] && gone_a=$(since "$t_down" "$(now)")
  [ -z "$gone_b" ] && [ "$(ranks_in "$nsB")" -eq 0 ] && gone_b=$(since "$t_down" "$(now)")
  if [ -z "$failed_at" ] && grep -q "^strata-run: the job failed" "$work/cut.log"; then
    failed_at=$(since "$t_down" "$(now)")
    ip -n "$nsA" link set "$vethA" up  # back before the relaunch (2 s later)
    up_at=$(since "$t_down" "$(now)")
  fi
  [ -n "$failed_at" ] && [ -n "$gone_a" ] && [ -n "$gone_b" ] &&
    [ -n "${line_at[0]:-}${line_at[1]:-}" ] && [ -n "${line_at[2]:-}${line_at[3]:-}" ] && break
  if within "$(since "$t_down" "$t")" 120; then sleep 0.05; else break; fi
done
[ -z "$up_at" ] && ip -n "$nsA" link set "$vethA" up
for r in 0 1 2 3; do
  [ -n "${line_at[$r]:-}" ] && echo "rank $r (host $([ $r -lt 2 ] && echo A || echo B)), $(
    )${line_at[$r]} s after the cut: ${line_text[$r]}"
done
grep -E "^strata-run" "$work/cut.log"
echo "timings after the cut: ranks gone on host A ${gone_a:-never} s, on host B ${gone_b:-never} s;" \
  "job failed ${failed_at:-never} s; link up ${up_at:-} s (limit for the ranks: $limit s)"
# A watchdog line that names the operation and the peer on the other host: its world rank (host A
# holds ranks 0 and 1) for a transfer or a ring all-reduce; for another collective (a barrier,
# a small all-reduce: MPI does not say which member is missing), a group with members on both
# hosts (world, pp, mp, embedding; the dp pairs stay inside a host).
names_far_peer() {  # names_far_peer R
  local text=${line_text[$1]:-} far
  [ -n "$text" ] && within "${line_at[$1]}" "$limit" || return 1
  grep -q "watchdog: no progress for $timeout_s s in [a-z_]* " <<<"$text" || return 1
  for far in $([ "$1" -lt 2 ] && echo 2 3 || echo 0 1); do
    grep -q "world rank $far\b" <<<"$text" && return 0
  done
  grep -qE "in [a-z_]+ \(group (world|pp|mp|embedding), [0-9]+ ranks" <<<"$text" &&
    ! grep -q "world rank" <<<"$text"
}
check "a rank on host A names the operation and a peer on host B within $limit s" \
  'names_far_peer 0 || names_far_peer 1'
check "a rank on host B names the operation and a peer on host A within $limit s" \
  'names_far_peer 2 || names_far_peer 3'
check "every rank process on host A is gone within $limit s (${gone_a:-never} s)" \
  'within "$gone_a" "$limit"'
check "every rank process on host B is gone within $limit s (${gone_b:-never} s)" \
  'within "$gone_b" "$limit"'
status=$(sed -n 's/^strata-run: the job failed (exit status \([0-9]*\)).*/\1/p' "$work/cut.log" | head -1)
# The ranks' limit, then comm.timeout_s for mpirun to end the job, then at most 6 s for it to
# stop on strata-run's signals (launch/strata-run).
limit_job=$((limit + timeout_s + 6))
check "the job ends with a non-zero status (${status:-none}) within $limit_job s" \
  '[ -n "$status" ] && [ "$status" -ne 0 ] && within "$failed_at" "$limit_job"'

echo "== c. the relaunch with the link back up"
wait "$job"
rc_cut=$?
got=$(final_loss "$work/cut.jsonl")
grep -E "resumed from" "$work/cut.log" | head -2
check "the job completes after one restart (exit status $rc_cut)" \
  '[ "$rc_cut" -eq 0 ] && [ "$(grep -c "^strata-run: the job failed" "$work/cut.log")" -eq 1 ] ||
   { tail -n 30 "$work/cut.log"; false; }'
check "the relaunch resumes from a checkpoint (iter_$interval or later)" \
  'grep -q "resuming from iter_[1-9]" "$work/cut.log" && grep -q "resumed from $work/ckpt_cut/iter_" "$work/cut.log"'
check "final loss $got equals the uninterrupted run's $want" '[ -n "$want" ] && [ "$got" = "$want" ]'

[ "$fail" -eq 0 ] && echo "PASS: multi-host faults"
exit "$fail"
