#!/usr/bin/env bash
# `gpipe train` under mpirun (Open MPI, oversubscribed on 2 cores): D = 1 over MPI gives the threads
# launcher's parameter hash, losses and evaluation bit for bit (tiny byte LM with 1f1b, convnet with
# gpipe and --tta flip); the report counts the bytes each rank sent (activations and gradients at
# the cell boundary, plus each stage's gradients in the all-reduce with D = 2) as the formulas say;
# a launch of the wrong size is a usage error before any training; a rank killed with SIGKILL mid-
# step makes the other exit non-zero within --comm-timeout naming the rank, the action and the peer;
# and two network namespaces, each a "host" with its own hostname and address, train together over
# Open MPI's TCP transport. Exit 77 (skipped) without MPI.
# Run from the repository root: bash tests/cli/mpi.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"
cli_need_mpi # exit 2 without MPI, then skipped
rc=$probe_rc
# Outside mpirun the singleton has 1 rank: --stages 2 needs 2.
[ "$rc" = 2 ] && grep -q "launched with 1 MPI rank, but --data-parallel 1 x --stages 2 needs D x K = 2" \
    "$TMP/probe.err" || bad "--launcher mpi --stages 2 alone: exit $rc, $(cat "$TMP/probe.err")"

printf '{"family": "transformer", "vocab": 256, "dim": 16, "heads": 2, "d_ff": 32, "layers": 2, "seq_len": 16}\n' \
    >"$TMP/lm.json"
cli_write_corpus "$TMP/corpus"
cli_write_idx "$TMP/syn"
LM=(--model "$TMP/lm.json" --data "$TMP/corpus" --steps 3 --batch 8
    --eval-size 4 --threads 1 --quiet --seed 5 --stages 2)
CN=(--model convnet --data "$TMP/syn" --steps 2 --batch 16 --micro-batches 4 --eval-size 16
    --threads 1 --quiet --seed 5 --stages 2)


run lm_thr "${LM[@]}" --micro-batches 4 --schedule 1f1b --report "$TMP/lm_thr.json"
cli_mpirun lm_mpi 2 "${LM[@]}" --micro-batches 4 --schedule 1f1b --report "$TMP/lm_mpi.json" --trace "$TMP/lm_mpi_trace.json"
# (--tta flip: the mirrored test images go through the ranks' stages as well)
run cn_thr "${CN[@]}" --remat none --tta flip --report "$TMP/cn_thr.json"
cli_mpirun cn_mpi 2 "${CN[@]}" --remat none --tta flip --report "$TMP/cn_mpi.json"
cli_mpirun lm_d2 4 "${LM[@]}" --data-parallel 2 --micro-batches 2 --report "$TMP/lm_d2.json"
# Rank 0 alone prints.
[ "$(grep -c '^trained 3 steps' "$TMP/lm_mpi.out")" = 1 ] || bad "lm_mpi: not exactly one summary line"
# --remat's default under MPI: cell (a rank sees only its own host's memory, and the ranks must
# plan alike), said once, by rank 0.
[ "$(grep -c '^remat: cell (the default under MPI, ' "$TMP/lm_mpi.out")" = 1 ] ||
    bad "lm_mpi: no single remat line naming the MPI default: $(grep '^remat' "$TMP/lm_mpi.out")"

python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
HEADER = 72  # bytes of a message header: 6 int32, 4 int64 dimensions, 2 uint64
for name in ("lm", "cn"):
    thr, mpi = (json.load(open(f"{d}/{name}_{b}.json")) for b in ("thr", "mpi"))
    need(mpi["params_fnv1a64"] == thr["params_fnv1a64"],
         f"{name}: MPI params {mpi['params_fnv1a64']} != threads {thr['params_fnv1a64']}")
    need(mpi["train"]["final_loss"] == thr["train"]["final_loss"], f"{name}: final loss differs")
    need(mpi["eval"] == thr["eval"], f"{name}: eval {mpi['eval']} != {thr['eval']}")
    p = mpi["pipeline"]
    need(p["launcher"] == "mpi" and p["ranks"] == 2 and p["data_parallel"] == 1, f"{name}: {p}")
    need(len(p["stage_peak_bytes"]) == 2 and all(s["parameters"] > 0 for s in p["stage_peak_bytes"]),
         f"{name}: stage_peak_bytes {p['stage_peak_bytes']}")
    need(thr["pipeline"]["partition"] == p["partition"], f"{name}: partitions differ")
need("tta_accuracy" in json.load(open(f"{d}/cn_mpi.json"))["eval"], "cn_mpi: no --tta figures")
# The LM's cell boundary carries (b, T, d) = (2, 16, 16) floats per micro-batch, M = 4 of them:
# stage 0 sends activations, stage 1 their gradients, nothing to the all-reduce with D = 1.
b = json.load(open(f"{d}/lm_mpi.json"))["pipeline"]["bytes_sent_last_step"]
want = 4 * (2 * 16 * 16 * 4 + HEADER)
need([(e["rank"], e["p2p"], e["allreduce"]) for e in b] == [(0, want, 0), (1, want, 0)],
     f"lm bytes_sent_last_step {b}, expected p2p {want} each")
# D = 2: 4 ranks, each replica's batch of 4 in M = 2 micro-batches of 2; each rank gives its
# stage's gradients (its parameter bytes) to the all-reduce.
r = json.load(open(f"{d}/lm_d2.json"))
p = r["pipeline"]
need(p["ranks"] == 4 and p["data_parallel"] == 2, f"lm_d2: {p}")
want = 2 * (2 * 16 * 16 * 4 + HEADER)
for e in p["bytes_sent_last_step"]:
    stage_params = p["stage_peak_bytes"][e["stage"]]["parameters"]
    need(e["p2p"] == want and e["allreduce"] == stage_params,
         f"lm_d2 rank {e['rank']}: p2p {e['p2p']} (want {want}), allreduce {e['allreduce']} "
         f"(want {stage_params})")
# The trace has one track per rank.
t = json.load(open(f"{d}/lm_mpi_trace.json"))
ev = t["traceEvents"] if isinstance(t, dict) else t
tids = {e.get("tid") for e in ev if e.get("ph") == "X"}
need(tids == {0, 1}, f"trace tracks {tids}")
finish("mpi reports")
PY

# Usage errors: the MPI options without MPI, threads under an MPI launcher.
"$GPIPE" train "${LM[@]}" --data-parallel 2 >"$TMP/u1.out" 2>"$TMP/u1.err"
rc=$?
[ "$rc" = 2 ] && grep -q -- "--data-parallel: only with the MPI launcher" "$TMP/u1.err" ||
    bad "--data-parallel outside mpirun: exit $rc, $(cat "$TMP/u1.err")"
timeout 120 "${MPIRUN[@]}" -np 2 "$GPIPE" train "${LM[@]}" --launcher threads >"$TMP/u2.out" 2>"$TMP/u2.err"
rc=$?
[ "$rc" != 0 ] && grep -q "started by an MPI launcher with 2 ranks, but --launcher threads was given" \
    "$TMP/u2.err" || bad "--launcher threads under mpirun: exit $rc, $(head -c 400 "$TMP/u2.err")"
"$GPIPE" train "${LM[@]}" --gpu-comm nccl >"$TMP/u3.out" 2>"$TMP/u3.err"
rc=$?
[ "$rc" = 2 ] && grep -q -- "--gpu-comm: only with the MPI launcher" "$TMP/u3.err" ||
    bad "--gpu-comm outside mpirun: exit $rc, $(cat "$TMP/u3.err")"
# NCCL runs between GPUs: asked for with CPU stages, every rank fails saying so.
timeout 120 "${MPIRUN[@]}" -np 2 "$GPIPE" train "${LM[@]}" --gpu-comm nccl >"$TMP/u4.out" 2>"$TMP/u4.err"
rc=$?
[ "$rc" != 0 ] && grep -q -- "--gpu-comm nccl: NCCL runs between CUDA GPUs, and the stages compute on the CPU (give --device cuda)" \
    "$TMP/u4.err" || bad "--gpu-comm nccl on CPUs: exit $rc, $(head -c 600 "$TMP/u4.err")"
# --plan auto under mpirun: every rank would search, time and trial plans on its own
timeout 120 "${MPIRUN[@]}" -np 2 "$GPIPE" train "${LM[@]}" --plan auto >"$TMP/u5.out" 2>"$TMP/u5.err"
rc=$?
[ "$rc" = 2 ] && grep -q -- "--plan auto: plans the threads launcher's stages" "$TMP/u5.err" ||
    bad "--plan auto under mpirun: exit $rc, $(head -c 600 "$TMP/u5.err")"
"$GPIPE" train --help | grep -q -- "--comm-timeout SECONDS" || bad "train --help lacks --comm-timeout"
"$GPIPE" bench --help | grep -q -- "--data-parallel D" || bad "bench --help lacks --data-parallel"

# A launch of the wrong size: a usage error from rank 0, before any training.
timeout 120 "${MPIRUN[@]}" -np 3 "$GPIPE" train "${LM[@]}" --data-parallel 2 --micro-batches 2 \
    >"$TMP/mis.out" 2>"$TMP/mis.err"
rc=$?
[ "$rc" != 0 ] || bad "mismatched launch: exit 0"
grep -q "launched with 3 MPI ranks, but --data-parallel 2 x --stages 2 needs D x K = 4 ranks" \
    "$TMP/mis.err" || bad "mismatched launch: no clear message: $(head -c 600 "$TMP/mis.err")"
! grep -q "^training on" "$TMP/mis.out" || bad "mismatched launch: training started"

# SIGKILL of rank 1 in the middle of training. Open MPI's mpirun ends every rank when one
# dies; with --enable-recovery it lets the survivor run, and gpipe's own timeout stops it.
kill_test() {
    local name=$1
    shift
    local T=3
    # Each rank's own exit status goes to $name.codes (mpirun --enable-recovery reports 0).
    # GP_KILL_TAG marks this run's ranks: other gpipe processes on the machine are not ours.
    GP_KILL_TAG=$TMP "${MPIRUN[@]}" "$@" -x GP_KILL_TAG -np 2 sh -c '"$0" "$@"; echo "rank $OMPI_COMM_WORLD_RANK exit $?" >>'"$TMP/$name.codes" \
        "$GPIPE" train --model "$TMP/lm.json" --data "$TMP/corpus" \
        --steps 100000 --batch 8 --micro-batches 4 --stages 2 --threads 1 --log-every 1 \
        --comm-timeout $T >"$TMP/$name.out" 2>"$TMP/$name.err" &
    local job=$! pid="" t0
    for _ in $(seq 1 300); do # until rank 1 has trained a step
        if grep -q "step 2/" "$TMP/$name.err" 2>/dev/null; then
            for p in $(pgrep -x gpipe); do
                grep -qz "^OMPI_COMM_WORLD_RANK=1$" "/proc/$p/environ" 2>/dev/null &&
                    grep -qzx "GP_KILL_TAG=$TMP" "/proc/$p/environ" 2>/dev/null && pid=$p
            done
            [ -n "$pid" ] && break
        fi
        sleep 0.1
    done
    if [ -z "$pid" ]; then
        bad "$name: rank 1 never started training: $(tail -c 400 "$TMP/$name.err")"
        kill "$job" 2>/dev/null
        wait "$job"
        return
    fi
    t0=$(date +%s.%N)
    kill -9 "$pid"
    local waited=0
    while kill -0 "$job" 2>/dev/null && [ $waited -lt 300 ]; do sleep 0.1; waited=$((waited + 1)); done
    if kill -0 "$job" 2>/dev/null; then
        bad "$name: still running 30 s after rank 1 was killed (timeout $T s)"
        kill "$job"
    fi
    wait "$job"
    local rc=$? dt
    dt=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    echo "$name: mpirun exited $rc ${dt}s after rank 1 was killed (timeout $T s); $(tr '\n' ' ' <"$TMP/$name.codes" 2>/dev/null)"
    if [ "$name" = kill_default ]; then
        [ "$rc" != 0 ] || bad "$name: mpirun exited 0 after rank 1 was killed"
    else
        grep -q "^rank 0 exit [1-9]" "$TMP/$name.codes" ||
            bad "$name: rank 0 did not exit non-zero: $(cat "$TMP/$name.codes" 2>&1)"
        # The kill lands in a message between the stages or in a collective over all ranks
        # (the optimizer step's): either way the message names the rank it waited for.
        grep -Eq "rank 0 \(stage 0\): timed out after $T s .*rank 1 \(stage 1\)|rank 0: timed out after $T s waiting in the .* over 2 ranks, with rank 1 " "$TMP/$name.err" ||
            bad "$name: no message naming rank 0, the action and rank 1: $(grep -v '^  ' "$TMP/$name.err" | tail -c 800)"
    fi
}
kill_test kill_default
kill_test kill_recovery --enable-recovery

# Two hosts: network namespaces gpns0/gpns1 joined by a veth pair (10.77.0.1, 10.77.0.2, which
# exist only inside them), each with its own hostname (unshare --uts) and /etc/hosts; mpirun
# runs in the first and starts the second's daemon through an rsh agent that enters the
# namespace (in place of ssh). Only Open MPI's TCP transport is allowed.
NS0=gpns$$a NS1=gpns$$b
netns_cleanup() {
    ip netns del "$NS0" 2>/dev/null
    ip netns del "$NS1" 2>/dev/null
    rm -rf "/etc/netns/$NS0" "/etc/netns/$NS1"
}
netns_setup() {
    ip netns add "$NS0" && ip netns add "$NS1" &&
        ip link add "v$$a" type veth peer name "v$$b" &&
        ip link set "v$$a" netns "$NS0" && ip link set "v$$b" netns "$NS1" &&
        ip netns exec "$NS0" ip addr add 10.77.0.1/24 dev "v$$a" &&
        ip netns exec "$NS1" ip addr add 10.77.0.2/24 dev "v$$b" &&
        ip netns exec "$NS0" ip link set "v$$a" up && ip netns exec "$NS1" ip link set "v$$b" up &&
        ip netns exec "$NS0" ip link set lo up && ip netns exec "$NS1" ip link set lo up &&
        mkdir -p "/etc/netns/$NS0" "/etc/netns/$NS1" &&
        for n in "$NS0" "$NS1"; do
            printf '127.0.0.1 localhost\n10.77.0.1 gphost0\n10.77.0.2 gphost1\n' >"/etc/netns/$n/hosts" || return 1
        done
}
if ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
    echo "SKIP (two hosts): ip (iproute2) or unshare is missing"
elif ! netns_setup 2>"$TMP/netns.err"; then
    echo "SKIP (two hosts): cannot make network namespaces here (needs root and CAP_SYS_ADMIN): $(head -c 300 "$TMP/netns.err")"
    netns_cleanup
else
    cat >"$TMP/nsrsh" <<EOF
#!/bin/sh
# rsh agent: "HOST COMMAND..." runs COMMAND in HOST's namespace, under HOST's name
host=\$1; shift
case \$host in gphost0) ns=$NS0;; gphost1) ns=$NS1;; *) echo "nsrsh: unknown host \$host" >&2; exit 1;; esac
echo "\$host" >>"$TMP/nsrsh.log"
exec ip netns exec \$ns unshare --uts sh -c "hostname \$host; \$*"
EOF
    chmod +x "$TMP/nsrsh"
    printf 'gphost0 slots=1\ngphost1 slots=1\n' >"$TMP/hosts"
    timeout 300 ip netns exec "$NS0" unshare --uts sh -c "hostname gphost0 && exec mpirun \
        --hostfile $TMP/hosts --mca plm_rsh_agent $TMP/nsrsh --mca btl tcp,self \
        --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
        -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -np 2 \
        $GPIPE train ${LM[*]} --micro-batches 4 --schedule 1f1b --report $TMP/lm_hosts.json" \
        >"$TMP/hosts.out" 2>"$TMP/hosts.err" || bad "two hosts: mpirun failed: $(tail -c 800 "$TMP/hosts.err")"
    grep -qx gphost1 "$TMP/nsrsh.log" 2>/dev/null || bad "two hosts: no daemon was started on gphost1"
    if [ -f "$TMP/lm_hosts.json" ]; then
        python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
h, t = (json.load(open(f"{d}/lm_{n}.json")) for n in ("hosts", "thr"))
need(h["params_fnv1a64"] == t["params_fnv1a64"], f"two hosts: params {h['params_fnv1a64']} != {t['params_fnv1a64']}")
finish("two hosts")
PY
    fi
    netns_cleanup
fi

cli_finish mpi
