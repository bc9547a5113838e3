#!/usr/bin/env bash
# gpipe launch, the supervisor over mpirun (Open MPI, oversubscribed on this host):
# - 4 ranks (D = 1, K = 4) checkpointing every step: a random rank SIGKILLed twice (once in the
#   middle of a save) and one SIGSTOPped once, in an order, at steps and on ranks drawn from a
#   seed printed first (GP_LAUNCH_SEED=S repeats a run); the job finishes on the survivors (4,
#   3, 2, then 1 stage) with the parameters of an uninterrupted run bit for bit, the report's
#   restarts (step, reason, rank, D, K, T) and a --metrics line for each;
# - D = 2, K = 2 and one SIGKILL: the restart keeps D (D = 2, K = 1), bit-identical to an
#   uninterrupted D = 2 run;
# - D = 2, K = 1 and one SIGKILL: D must change (D = 1 with M = 8, the same micro-batches): the
#   report says the bits change and the final loss and evaluation stay within 1e-6 relative;
# - a host list: the failed rank's host (by Open MPI's by-slot mapping) loses all its slots, and
#   the next launcher gets the hosts left; under srun (a stand-in) the node srun names is
#   excluded from the next step;
# - its own cases: too few processes left (--min-np), restarts exhausted (--max-restarts), the
#   user's interrupt (SIGINT: every rank ended, a resumable checkpoint left, the same command
#   resuming to the uninterrupted bits), a launcher that cannot start, a checkpoint folder locked
#   by a live job (and a lock left by an ended one not in the way), usage errors.
# Exit 77 (skipped) without MPI. Run from the repository root: bash tests/cli/launch.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"
cli_need_mpi

SEED=${GP_LAUNCH_SEED:-$(( $(date +%s) % 32768 ))}
echo "launch: seed $SEED (GP_LAUNCH_SEED=$SEED repeats the ranks, steps and order struck)"
RANDOM=$SEED

printf '{"family": "transformer", "vocab": 256, "dim": 32, "heads": 2, "d_ff": 64, "layers": 4, "seq_len": 16, "dropout": 0.1}\n' \
    >"$TMP/lm.json"
cli_write_corpus "$TMP/corpus"
STEPS=200
LM=(--model "$TMP/lm.json" --data "$TMP/corpus" --steps "$STEPS" --batch 8 --micro-batches 4
    --eval-size 4 --threads 1 --quiet --seed 3)
# Every step checkpointed; a stopped rank is given up on after 3 s.
JOB=(--checkpoint-every 1 --keep 2 --comm-timeout 3)
LAUNCHER=(--launcher "${MPIRUN[*]}")

# launch NAME ARGS...: gpipe launch in the background, its pid in $lpid.
launch() {
    local name=$1
    shift
    "$GPIPE" launch "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    lpid=$!
}
# rank_pid DIR R: the pid of world rank R of the job training into checkpoint folder DIR.
rank_pid() {
    local p
    for p in $(pgrep -f -- "--checkpoint-dir $1 "); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
            echo "$p"
            return 0
        fi
    done
    return 1
}
# newest DIR: the step of the newest committed checkpoint in DIR (0: none).
newest() {
    local f
    f=$(ls "$1" 2>/dev/null | grep -E '^ckpt-[0-9]+\.safetensors(\.index\.json)?$' | tail -1)
    [ -n "$f" ] && echo $((10#$(echo "$f" | sed -E 's/^ckpt-0*([0-9]+).*/\1/;s/^$/0/'))) || echo 0
}
# wait_for NAME DIR JOBS STEP: until the supervisor NAME has started its JOBS-th job and DIR holds
# a checkpoint of STEP or later; false if the supervisor ends first or after 120 s.
wait_for() {
    local i
    for i in $(seq 1 6000); do
        kill -0 "$lpid" 2>/dev/null || return 1
        if [ "$(grep -c '^launch: starting' "$TMP/$1.out")" -ge "$3" ] && [ "$(newest "$2")" -ge "$4" ]; then
            return 0
        fi
        sleep 0.02
    done
    return 1
}
# one_kill NAME DIR R STEP ARGS...: gpipe launch ARGS (its checkpoint folder DIR), world rank R
# SIGKILLed once DIR holds step STEP; $rc: the supervisor's exit status.
one_kill() {
    local name=$1 dir=$2 r=$3 step=$4 pid
    shift 4
    launch "$name" "$@"
    if wait_for "$name" "$dir" 1 "$step" && pid=$(rank_pid "$dir" "$r"); then
        kill -9 "$pid"
    else
        bad "$name: no rank $r to strike at step $step: $(tail -c 600 "$TMP/$name.err")"
    fi
    wait "$lpid"
    rc=$?
}
# no_ranks_left DIR: no process of a job training into DIR is left.
no_ranks_left() {
    local left
    left=$(pgrep -f -- "--checkpoint-dir $1 " | grep -vx "$$" || true)
    [ -z "$left" ] || bad "processes of the job on $1 left behind: $(ps -o pid,stat,args -p "${left//$'\n'/,}")"
}

# --- the reference: an uninterrupted run (D = 1: the bits of every K, threads or MPI) -----------
run straight "${LM[@]}" --stages 4 --report "$TMP/straight.json"

# --- 4 ranks, two SIGKILLs (one in the middle of a save) and a SIGSTOP --------------------------
D=$TMP/ck
kinds=(save kill stop)
for i in 2 1; do # Fisher-Yates from the seed
    j=$((RANDOM % (i + 1)))
    t=${kinds[$i]} kinds[$i]=${kinds[$j]} kinds[$j]=$t
done
at=$((8 + RANDOM % 20))
launch faults --np 4 "${LAUNCHER[@]}" -- train "${LM[@]}" "${JOB[@]}" --stages 4 --checkpoint-dir "$D" \
    --report "$TMP/faults.json" --metrics "$TMP/faults.jsonl"
struck=() midsave=0
for e in 0 1 2; do
    nranks=$((4 - e))
    rank=$((RANDOM % nranks))
    kind=${kinds[$e]}
    echo "strike $((e + 1)): $kind rank $rank of $nranks at step $at or later"
    if ! wait_for faults "$D" $((e + 1)) "$at"; then
        bad "strike $((e + 1)): the job did not reach step $at with $nranks ranks: $(tail -c 600 "$TMP/faults.err")"
        break
    fi
    pid=$(rank_pid "$D" "$rank") || { bad "strike $((e + 1)): no process of rank $rank"; break; }
    case $kind in
    save)
        # In the middle of a save: the rank is stopped while its part's temporary file (named
        # with its pid) is there, and killed while stopped, so the save is surely cut short.
        # Watched for up to 60 s, not a count of looks: a save is short, and under a sanitizer
        # on a loaded host a step can outlast any fixed number of them.
        until_s=$((SECONDS + 60))
        while [ "$SECONDS" -lt "$until_s" ]; do
            compgen -G "$D/*.tmp.$pid" >/dev/null || continue
            kill -STOP "$pid"
            if compgen -G "$D/*.tmp.$pid" >/dev/null; then
                midsave=1
                break
            fi
            kill -CONT "$pid"
        done
        kill -9 "$pid" ;;
    kill) kill -9 "$pid" ;;
    stop) kill -STOP "$pid" ;;
    esac
    struck+=("$kind:$rank")
    at=$((at + 20 + RANDOM % 20))
done
wait "$lpid"
rc=$?
[ "$rc" = 0 ] || bad "gpipe launch ended with exit $rc: $(tail -c 800 "$TMP/faults.err")"
echo "struck ${struck[*]}"
[ "$midsave" = 1 ] || bad "the kill in the middle of a save found no temporary file of its rank"
no_ranks_left "$D"
python3 - "$TMP/straight.json" "$TMP/faults.json" "$TMP/faults.jsonl" "${struck[@]}" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
a, b = (json.load(open(p)) for p in sys.argv[1:3])
lines = [json.loads(l) for l in open(sys.argv[3])]
struck = [s.split(":") for s in sys.argv[4:]]
need(b["steps"] == a["steps"], f"ended at step {b['steps']}, expected {a['steps']}")
need(a["params_fnv1a64"] == b["params_fnv1a64"],
     f"after the faults: params {b['params_fnv1a64']} vs uninterrupted {a['params_fnv1a64']}")
need(a["eval"] == b["eval"], f"eval {b['eval']} vs {a['eval']}")
r = b.get("restarts", [])
need(len(r) == len(struck), f"restarts {r}, expected {len(struck)}")
for i, (e, (kind, rank)) in enumerate(zip(r, struck)):
    need(e["ranks"] == [int(rank)], f"restart {i + 1}: ranks {e['ranks']}, struck rank {rank}")
    want = "hung: stopped" if kind == "stop" else "killed by signal 9"
    need(e["reason"].startswith(want), f"restart {i + 1}: reason {e['reason']!r} after {kind}")
    need((e["data_parallel"], e["stages"], e["tensor_parallel"]) == (1, 3 - i, 1),
         f"restart {i + 1}: D, K, T = {e['data_parallel']}, {e['stages']}, {e['tensor_parallel']}, expected 1, {3 - i}, 1")
    need(e["bit_identical"] is True, f"restart {i + 1}: bit_identical {e['bit_identical']}")
    need(0 < e["step"] < a["steps"], f"restart {i + 1}: step {e['step']}")
    need(e.get("restart_s", 0) > 0, f"restart {i + 1}: no restart_s")
need(r == sorted(r, key=lambda e: e["step"]), f"restart steps out of order: {r}")
ml = [l for l in lines if l["type"] == "restart"]
need([{k: v for k, v in l.items() if k != "type"} for l in ml] ==
     [{k: v for k, v in e.items() if k != "restart_s"} for e in r],
     f"--metrics restart lines {ml} vs the report's {r}")
finish()
PY
for n in 1 2 3; do
    grep -q "^launch: restart $n of at most 3: rank " "$TMP/faults.out" || bad "no line for restart $n"
done

# The sanitizer builds (GP_TEST_QUICK) run the faults on 4 ranks and the supervisor's own cases;
# the layouts of other meshes, host lists and srun are the same code under other inputs.
if [ -z "${GP_TEST_QUICK:-}" ]; then
# --- D = 2, K = 2, one SIGKILL: D kept, K = 1 --------------------------------------------------
cli_mpirun d2 4 "${LM[@]}" --data-parallel 2 --stages 2 --report "$TMP/d2.json"
D2=$TMP/ck_d2
rank=$((RANDOM % 4))
one_kill d2k "$D2" "$rank" $((10 + RANDOM % 30)) --np 4 "${LAUNCHER[@]}" -- train "${LM[@]}" "${JOB[@]}" \
    --data-parallel 2 --stages 2 --checkpoint-dir "$D2" --report "$TMP/d2k.json"
[ "$rc" = 0 ] || bad "D = 2: gpipe launch failed: $(tail -c 800 "$TMP/d2k.err")"
python3 - "$TMP/d2.json" "$TMP/d2k.json" "$rank" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
a, b = (json.load(open(p)) for p in sys.argv[1:3])
need(a["params_fnv1a64"] == b["params_fnv1a64"],
     f"D = 2 after a kill: params {b['params_fnv1a64']} vs uninterrupted {a['params_fnv1a64']}")
r = b.get("restarts", [])
need(len(r) == 1 and r[0]["ranks"] == [int(sys.argv[3])], f"restarts {r}")
need(r and (r[0]["data_parallel"], r[0]["stages"], r[0]["processes"]) == (2, 1, 2), f"restarts {r}")
finish("FAIL: D = 2:")
PY

# --- D = 2, K = 1, one SIGKILL: D must change (D = 1 on the same 8 micro-batches) -------------
# The plan search's mesh: other bits (the replicas' partial sums added in another grouping), the
# same micro-batches (dropout keys, shapes); float32 rounding alone: the final loss and
# evaluation within 1e-6 relative of the uninterrupted D = 2 run, and the report says the bits
# changed.
cli_mpirun d2k1 2 "${LM[@]}" --data-parallel 2 --stages 1 --report "$TMP/d2k1.json"
DD=$TMP/ck_dchange
one_kill dchange "$DD" $((RANDOM % 2)) $((10 + RANDOM % 30)) --np 2 "${LAUNCHER[@]}" -- train "${LM[@]}" \
    "${JOB[@]}" --data-parallel 2 --stages 1 --checkpoint-dir "$DD" --report "$TMP/dchange.json"
[ "$rc" = 0 ] || bad "D change: gpipe launch failed: $(tail -c 800 "$TMP/dchange.err")"
grep -q "D or T changed: the bits differ" "$TMP/dchange.out" || bad "D change: no line says the bits change"
python3 - "$TMP/d2k1.json" "$TMP/dchange.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
a, b = (json.load(open(p)) for p in sys.argv[1:3])
r = b.get("restarts", [])
need(len(r) == 1 and (r[0]["data_parallel"], r[0]["stages"], r[0]["micro_batches"]) == (1, 1, 8)
     and r[0]["bit_identical"] is False, f"restarts {r}")
for what, x, y in (("final loss", a["train"]["final_loss"], b["train"]["final_loss"]),
                   ("eval loss", a["eval"]["loss"], b["eval"]["loss"])):
    need(abs(x - y) <= 1e-6 * abs(x), f"{what} {y} vs uninterrupted D = 2 {x}")
finish("FAIL: D change:")
PY
# The same under --grad-sum tree: the replicas' sums are the top of one tree over the 8
# micro-batches, so the run on D = 1 ends with the uninterrupted D = 2 run's parameters.
cli_mpirun d2k1t 2 "${LM[@]}" --grad-sum tree --data-parallel 2 --stages 1 --report "$TMP/d2k1t.json"
DT=$TMP/ck_dchange_tree
one_kill dtree "$DT" $((RANDOM % 2)) $((10 + RANDOM % 30)) --np 2 "${LAUNCHER[@]}" -- train "${LM[@]}" \
    "${JOB[@]}" --grad-sum tree --data-parallel 2 --stages 1 --checkpoint-dir "$DT" \
    --report "$TMP/dtree.json"
[ "$rc" = 0 ] || bad "D change, tree sum: gpipe launch failed: $(tail -c 800 "$TMP/dtree.err")"
grep -q "(the same bits as an uninterrupted run)" "$TMP/dtree.out" ||
    bad "D change, tree sum: no line says the bits stay"
python3 - "$TMP/d2k1t.json" "$TMP/dtree.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
a, b = (json.load(open(p)) for p in sys.argv[1:3])
r = b.get("restarts", [])
need(len(r) == 1 and r[0]["data_parallel"] == 1 and r[0]["bit_identical"] is True,
     f"restarts {r}")
need(a["params_fnv1a64"] == b["params_fnv1a64"],
     f"parameters {b['params_fnv1a64']} vs uninterrupted D = 2 {a['params_fnv1a64']}")
finish("FAIL: D change, tree sum:")
PY
# A checkpoint resumes on another D only with as many micro-batches in all.
if timeout 300 "${MPIRUN[@]}" -np 1 "$GPIPE" train "${LM[@]}" --data-parallel 1 --stages 1 \
    --checkpoint-dir "$DD" --resume >"$TMP/dfew.out" 2>"$TMP/dfew.err"; then
    bad "D change: 1 x 4 micro-batches resumed a run of 1 x 8"
fi
grep -q -- "--data-parallel 1 x --micro-batches 4 = 4 micro-batches in all differ from the checkpoint's 1 x 8 = 8" \
    "$TMP/dfew.err" || bad "D change: $(tail -c 400 "$TMP/dfew.err")"

# --- a host list: the failed host's slots go ---------------------------------------------------
# Two hosts in the hostfile, run on this one by a launcher that keeps each hostfile it is given
# and starts mpirun without it: rank 3 is on nodeB by Open MPI's by-slot mapping (mpirun names
# this host, which is not in the list), so nodeB's 2 slots go and the job restarts on nodeA's 2.
printf 'nodeA slots=2\nnodeB slots=2\n' >"$TMP/hosts"
cat >"$TMP/fake-mpirun" <<'SH'
#!/usr/bin/env bash
n=$(ls "$HOSTS_LOG".* 2>/dev/null | wc -l)
args=()
while [ $# -gt 0 ]; do
    if [ "$1" = --hostfile ]; then cp "$2" "$HOSTS_LOG.$n"; shift 2; else args+=("$1"); shift; fi
done
exec mpirun --oversubscribe --bind-to none "${args[@]}"
SH
export HOSTS_LOG=$TMP/given
DH=$TMP/ck_hosts
one_kill hosts "$DH" 3 10 --np 4 --hostfile "$TMP/hosts" --launcher "bash $TMP/fake-mpirun" -- train \
    "${LM[@]}" "${JOB[@]}" --stages 4 --checkpoint-dir "$DH" --report "$TMP/hosts.json"
[ "$rc" = 0 ] || bad "hostfile: gpipe launch failed: $(tail -c 800 "$TMP/hosts.err")"
[ "$(cat "$TMP/given.0")" = "$(cat "$TMP/hosts")" ] || bad "hostfile: the first job's hosts: $(cat "$TMP/given.0")"
[ "$(cat "$TMP/given.1" 2>/dev/null)" = "nodeA slots=2" ] ||
    bad "hostfile: the restart's hosts: $(cat "$TMP/given.1" 2>/dev/null)"
python3 - "$TMP/straight.json" "$TMP/hosts.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
a, b = (json.load(open(p)) for p in sys.argv[1:3])
need(a["params_fnv1a64"] == b["params_fnv1a64"],
     f"hostfile: params {b['params_fnv1a64']} vs uninterrupted {a['params_fnv1a64']}")
r = b.get("restarts", [])
need(len(r) == 1 and r[0]["ranks"] == [3] and r[0].get("host") == "nodeB" and
     r[0]["processes"] == 2 and r[0]["stages"] == 2,
     f"restarts {r}")
finish("FAIL: hostfile:")
PY

# --- srun: the node named by srun's line excluded from the next step ----------------------------
# A stand-in named srun that keeps its arguments and runs mpirun (whose line names this host).
mkdir "$TMP/bin"
cat >"$TMP/bin/srun" <<'SH'
#!/usr/bin/env bash
echo "$*" >>"$SRUN_LOG"
args=()
while [ $# -gt 0 ]; do
    case $1 in
    -n) args+=(-np "$2"); shift 2 ;;
    --exclude=* | --kill-on-bad-exit*) shift ;;
    *) args+=("$1"); shift ;;
    esac
done
exec mpirun --oversubscribe --bind-to none "${args[@]}"
SH
chmod +x "$TMP/bin/srun"
export SRUN_LOG=$TMP/srun.log SLURM_NTASKS_PER_NODE=1
DS=$TMP/ck_srun
one_kill srun "$DS" 1 10 --np 2 --launcher "$TMP/bin/srun --kill-on-bad-exit=1" -- train "${LM[@]}" \
    "${JOB[@]}" --stages 2 --checkpoint-dir "$DS" --report "$TMP/srun.json"
[ "$rc" = 0 ] || bad "srun: gpipe launch failed: $(tail -c 800 "$TMP/srun.err")"
unset SLURM_NTASKS_PER_NODE
[ "$(cut -d' ' -f1-3 "$TMP/srun.log" | head -1)" = "--kill-on-bad-exit=1 -n 2" ] ||
    bad "srun: the first step: $(head -1 "$TMP/srun.log")"
[ "$(cut -d' ' -f1-4 "$TMP/srun.log" | sed -n 2p)" = "--kill-on-bad-exit=1 -n 1 --exclude=$(hostname)" ] ||
    bad "srun: the restart: $(sed -n 2p "$TMP/srun.log")"
python3 - "$TMP/straight.json" "$TMP/srun.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
a, b = (json.load(open(p)) for p in sys.argv[1:3])
need(a["params_fnv1a64"] == b["params_fnv1a64"],
     f"srun: params {b['params_fnv1a64']} vs uninterrupted {a['params_fnv1a64']}")
r = b.get("restarts", [])
need(len(r) == 1 and r[0]["ranks"] == [1] and r[0]["stages"] == 1, f"restarts {r}")
finish("FAIL: srun:")
PY

fi # GP_TEST_QUICK

# --- too few processes left; restarts exhausted -------------------------------------------------
for c in minnp:--min-np:2 maxr:--max-restarts:0; do
    IFS=: read -r name opt val <<<"$c"
    one_kill "$name" "$TMP/ck_$name" 1 5 --np 2 "$opt" "$val" "${LAUNCHER[@]}" -- train "${LM[@]}" \
        "${JOB[@]}" --stages 2 --checkpoint-dir "$TMP/ck_$name"
    [ "$rc" = 1 ] || bad "$name: exit $rc, expected 1"
    grep -q "gpipe launch: stopping: rank 1 (host .*) killed by signal 9" "$TMP/$name.err" ||
        bad "$name: no stopping message: $(tail -c 600 "$TMP/$name.err")"
    no_ranks_left "$TMP/ck_$name"
done
grep -q "1 process(es) are left, fewer than a mesh of at least --min-np 2 needs" "$TMP/minnp.err" ||
    bad "--min-np: $(tail -c 400 "$TMP/minnp.err")"
grep -q "the 0 restart(s) allowed (--max-restarts) are used up" "$TMP/maxr.err" ||
    bad "--max-restarts: $(tail -c 400 "$TMP/maxr.err")"

# --- the user's interrupt, and the lock ---------------------------------------------------------
DI=$TMP/ck_int
launch int --np 2 "${LAUNCHER[@]}" -- train "${LM[@]}" "${JOB[@]}" --stages 2 --checkpoint-dir "$DI"
ipid=$lpid
wait_for int "$DI" 1 10 || bad "interrupt: the job did not reach step 10"
# A second supervisor on the same folder is refused while the job runs.
"$GPIPE" launch --np 2 "${LAUNCHER[@]}" -- train "${LM[@]}" "${JOB[@]}" --stages 2 --checkpoint-dir "$DI" \
    >"$TMP/locked.out" 2>"$TMP/locked.err"
rc=$?
[ "$rc" = 1 ] || bad "locked folder: exit $rc, expected 1"
grep -q "is in use by a job still running (gpipe launch pid $ipid on host " "$TMP/locked.err" ||
    bad "locked folder: $(cat "$TMP/locked.err")"
kill -INT "$ipid"
wait "$ipid"
rc=$?
[ "$rc" = 130 ] || bad "interrupt: exit $rc, expected 130: $(tail -c 600 "$TMP/int.err")"
no_ranks_left "$DI"
grep -q "gpipe launch: interrupted: every rank has ended; the newest complete checkpoint is $DI/ckpt-" \
    "$TMP/int.err" || bad "interrupt: $(tail -c 600 "$TMP/int.err")"
[ -f "$DI/gpipe-launch.lock" ] || bad "interrupt: the lock file is gone"
# The same command again: the lock of the ended job is not in the way, and it resumes.
"$GPIPE" launch --np 2 "${LAUNCHER[@]}" -- train "${LM[@]}" "${JOB[@]}" --stages 2 --checkpoint-dir "$DI" \
    --report "$TMP/resumed.json" >"$TMP/resumed.out" 2>"$TMP/resumed.err" ||
    bad "after the interrupt: $(tail -c 600 "$TMP/resumed.err")"
grep -q "^resume: loaded $DI/ckpt-" "$TMP/resumed.out" || bad "after the interrupt: did not resume"
python3 - "$TMP/straight.json" "$TMP/resumed.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
a, b = (json.load(open(p)) for p in sys.argv[1:3])
need(b["train"]["first_step"] > 0, "after the interrupt: started at step 0")
need(a["params_fnv1a64"] == b["params_fnv1a64"],
     f"interrupted and resumed: params {b['params_fnv1a64']} vs uninterrupted {a['params_fnv1a64']}")
need(b.get("restarts") == [], f"restarts {b.get('restarts')}")
finish("FAIL: interrupt:")
PY

# --- a launcher that cannot start; usage errors -------------------------------------------------
"$GPIPE" launch --np 2 --launcher "$TMP/no-such-mpirun -x" -- train "${LM[@]}" --stages 2 \
    --checkpoint-dir "$TMP/ck_nolauncher" >"$TMP/nol.out" 2>"$TMP/nol.err"
rc=$?
[ "$rc" = 1 ] || bad "missing launcher: exit $rc, expected 1"
grep -q "gpipe launch: --launcher: cannot start '$TMP/no-such-mpirun': No such file or directory" \
    "$TMP/nol.err" || bad "missing launcher: $(cat "$TMP/nol.err")"
usage() {
    local want=$1
    shift
    "$GPIPE" launch "$@" >"$TMP/u.out" 2>"$TMP/u.err"
    local rc=$?
    [ "$rc" = 2 ] || bad "gpipe launch $*: exit $rc, expected 2"
    grep -q -- "$want" "$TMP/u.err" || bad "gpipe launch $*: $(cat "$TMP/u.err")"
}
usage "--np: required" -- train "${LM[@]}" --checkpoint-dir "$TMP/u"
usage "--checkpoint-dir is required" --np 2 -- train "${LM[@]}"
usage "expected -- train" --np 2
usage "--np 3: not --data-parallel 1 x --stages 2" --np 3 -- train "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/u"
usage "--min-np 3: more than --np 2" --np 2 --min-np 3 -- train "${LM[@]}" --checkpoint-dir "$TMP/u"
cli_finish launch
