#!/usr/bin/env bash
# The tensor axis from the command line (--tensor-parallel T in train, plan and bench): bad
# values exit 2 naming the option; a layout that does not divide exits 1 naming the layer, the
# dimension and the mesh axis; T = 2 trains with losses and evaluation within 1e-5 of T = 1,
# each shard's device holding less; the bytes each shard gives to the tensor axis per step equal
# the formula (per block two all-reduces of a micro-batch's (rows, d_model) floats forward, two
# backward, two more in the recomputed forward; the embedding's forward, the head's backward and
# the split cross-entropy's 3 floats a row) and the plan's prediction; a run saved with T = 2
# resumes with T = 1; bench reports the mesh. Under mpirun (when built and installed): T = 2 over
# MPI gives the threads run's parameters bit for bit, and a launch of the wrong size names D x K x
# T. Run from the repository root: bash tests/cli/mesh.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

printf '{"family": "transformer", "vocab": 256, "dim": 16, "heads": 2, "d_ff": 32, "layers": 2, "seq_len": 16}\n' \
    >"$TMP/lm.json"
cli_write_corpus "$TMP/corpus"
LM=(--model "$TMP/lm.json" --data "$TMP/corpus" --steps 4 --batch 8 --micro-batches 2
    --eval-size 4 --threads 1 --quiet --seed 5)

expect_train() { # STATUS NEEDLE ARGS...
    local want=$1 needle=$2 rc
    shift 2
    "$GPIPE" train "$@" >"$TMP/x.out" 2>"$TMP/x.err"
    rc=$?
    [ "$rc" = "$want" ] && grep -qF -- "$needle" "$TMP/x.err" ||
        bad "gpipe train $*: exit $rc (want $want), stderr: $(head -c 400 "$TMP/x.err")"
}

for cmd in train plan bench; do
    "$GPIPE" $cmd --help | grep -q -- "--tensor-parallel T" || bad "$cmd --help lacks --tensor-parallel"
done
for v in 0 -1 two 1.5; do expect_train 2 "--tensor-parallel" "${LM[@]}" --tensor-parallel "$v"; done
expect_train 1 'layer 0 (embedding): vocab = 256 does not divide evenly over mesh axis "tensor" of size 3' \
    "${LM[@]}" --tensor-parallel 3
expect_train 1 'layer 2 (transformer_block): heads = 2 does not divide evenly over mesh axis "tensor" of size 4' \
    "${LM[@]}" --tensor-parallel 4
"$GPIPE" plan --model "$TMP/lm.json" --tensor-parallel 3 --gflops 10 >"$TMP/p3.out" 2>"$TMP/p3.err"
rc=$?
[ "$rc" = 1 ] && grep -qF 'vocab = 256 does not divide evenly over mesh axis "tensor" of size 3' "$TMP/p3.err" ||
    bad "plan --tensor-parallel 3: exit $rc, $(cat "$TMP/p3.err")"

run t1 "${LM[@]}" --stages 1 --report "$TMP/t1.json"
run t2 "${LM[@]}" --tensor-parallel 2 --remat cell --report "$TMP/t2.json"
run t2k2 "${LM[@]}" --tensor-parallel 2 --stages 2 --schedule 1f1b --remat cell --report "$TMP/t2k2.json"
grep -q "tensor parallel: each stage's layers split over 2 shards" "$TMP/t2.out" || bad "t2: no mesh line"
grep -q "^stage 0 shard 1 peak" "$TMP/t2.out" || bad "t2: no per-shard summary line"
"$GPIPE" plan --model "$TMP/lm.json" --tensor-parallel 2 --batch 8 --micro-batches 2 --gflops 10 \
    --report "$TMP/plan2.json" >"$TMP/plan2.out" 2>"$TMP/plan2.err" || bad "plan T=2: $(cat "$TMP/plan2.err")"
"$GPIPE" plan --model "$TMP/lm.json" --tensor-parallel 2 --stages 2 --schedule 1f1b --batch 8 \
    --micro-batches 2 --gflops 10 --report "$TMP/plan2k2.json" >/dev/null 2>"$TMP/plan2k2.err" ||
    bad "plan T=2 K=2: $(cat "$TMP/plan2k2.err")"

python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
t1, t2, t2k2 = (json.load(open(f"{d}/{n}.json")) for n in ("t1", "t2", "t2k2"))
# Across T: the same losses and evaluation within 1e-5 (the row-split sums reorder).
for name, r in (("t2", t2), ("t2k2", t2k2)):
    for a, b in zip(r["train"]["step_losses"], t1["train"]["step_losses"]):
        need(abs(a - b) <= 1e-5 * abs(b), f"{name}: loss {a} vs T=1 {b}")
    need(abs(r["eval"]["loss"] - t1["eval"]["loss"]) <= 1e-5 * t1["eval"]["loss"],
         f"{name}: eval {r['eval']} vs {t1['eval']}")
    need(r["pipeline"]["tensor_parallel"] == 2, f"{name}: tensor_parallel {r['pipeline']}")
# Each shard holds less than the whole model: the split layers halve.
whole = t1["pipeline"]["stage_peak_bytes"][0]["parameters"]
shards = t2["pipeline"]["stage_peak_bytes"]
need([(s["stage"], s["shard"]) for s in shards] == [(0, 0), (0, 1)], f"t2: {shards}")
need(all(whole / 2 < s["parameters"] < whole for s in shards), f"t2: shard parameters {shards} vs {whole}")
# Bytes to the tensor axis per shard per step: M micro-batches of N = 4 x 16 rows of C = 16.
M, N, C, L = 2, 4 * 16, 16, 2
act = N * C * 4
fwd = act * (1 + 2 * L)            # embedding all-reduce, two per block
bwd = act * (2 * L + 1) + 3 * N * 4  # two per block, the head's input gradient, the loss' rows
want = M * (2 * fwd + bwd)         # remat cell: the forward twice
got = [e["tensor"] for e in t2["pipeline"]["bytes_sent_last_step"]]
need(got == [want, want], f"t2: tensor bytes {got}, formula {want}")
# The plan predicts the same bytes and the same parameter bytes per device.
for plan, run in (("plan2", t2), ("plan2k2", t2k2)):
    p = json.load(open(f"{d}/{plan}.json"))["pipeline"]
    need(p["tensor_parallel"] == 2, f"{plan}: {p}")
    meas = {(e["stage"], e["shard"]): e["tensor"] for e in run["pipeline"]["bytes_sent_last_step"]}
    peaks = {(e["stage"], e["shard"]): e["parameters"] for e in run["pipeline"]["stage_peak_bytes"]}
    for c in p["cells"]:
        k = c["stage"]
        need(c["bytes_per_step"]["tensor"] == meas[(k, 0)] == meas[(k, 1)],
             f"{plan} stage {k}: plan {c['bytes_per_step']['tensor']} vs measured {meas}")
        need(c["peak_bytes"]["parameters"] == peaks[(k, 0)],
             f"{plan} stage {k}: plan parameters {c['peak_bytes']['parameters']} vs {peaks}")
    need(p["partition"] == run["pipeline"]["partition"], f"{plan}: cells {p['partition']} vs {run['pipeline']['partition']}")
finish("mesh reports")
PY

# Saved with T = 2 on 2 stages, resumed with T = 1 on one device: the run ends as the T = 2 run
# straight through, to rounding.
run save2 "${LM[@]}" --tensor-parallel 2 --stages 2 --schedule 1f1b --checkpoint-dir "$TMP/ck" \
    --stop-after 2 --report "$TMP/save2.json"
run resume1 "${LM[@]}" --stages 1 --checkpoint-dir "$TMP/ck" --resume --report "$TMP/resume1.json"
grep -q "resumed at step 2" "$TMP/resume1.out" || bad "resume1: $(head -c 300 "$TMP/resume1.out")"
python3 - "$TMP/t2k2.json" "$TMP/resume1.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
a, b = (json.load(open(p)) for p in sys.argv[1:3])
need(b["train"]["first_step"] == 2, f"resume1: first_step {b['train']['first_step']}")
for x, y in zip(a["train"]["step_losses"][2:], b["train"]["step_losses"]):
    need(abs(x - y) <= 1e-5 * abs(x), f"resume1: loss {y} vs straight {x}")
finish("resume across T")
PY

# bench: T2-style layers on 2 shards.
if "$GPIPE" bench --workload T2 --layers 2 --d-ff 512 --tensor-parallel 2 --batch 4 --micro-batches 2 \
    --steps 1 --warmup 0 --quiet --report "$TMP/bench.json" >"$TMP/bench.out" 2>"$TMP/bench.err"; then
    python3 - "$TMP/bench.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
r = json.load(open(sys.argv[1]))
p = r["pipeline"]
need(p["tensor_parallel"] == 2 and p["stages"] == 1, f"bench: {p}")
need(len(p["stage_peak_bytes"]) == 2, f"bench: {p['stage_peak_bytes']}")
b = p["bytes_sent_last_step"]
need(len(b) == 2 and b[0]["tensor"] == b[1]["tensor"] > 0, f"bench bytes {b}")
need("ff512" in r["model"], f"bench model {r['model']}")
finish("bench mesh")
PY
else
    bad "bench T2 --tensor-parallel 2: $(tail -c 400 "$TMP/bench.err")"
fi

# Under mpirun: T = 2 over MPI is the threads run bit for bit; a wrong launch names D x K x T.
if "$GPIPE" train --model convnet --launcher mpi --stages 2 2>&1 | grep -q "MPI support was not built" ||
    ! command -v mpirun >/dev/null; then
    echo "mpirun part skipped: no MPI support or no mpirun"
else
    cli_need_mpi
    cli_mpirun m2 2 "${LM[@]}" --tensor-parallel 2 --report "$TMP/m2.json"
    python3 - "$TMP/t2.json" "$TMP/m2.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
thr, mpi = (json.load(open(p)) for p in sys.argv[1:3])
need(mpi["params_fnv1a64"] == thr["params_fnv1a64"],
     f"MPI T=2 params {mpi['params_fnv1a64']} != threads {thr['params_fnv1a64']}")
need(mpi["train"]["step_losses"] == thr["train"]["step_losses"], "MPI T=2 losses differ")
b = mpi["pipeline"]["bytes_sent_last_step"]
tb = [e["tensor"] for e in thr["pipeline"]["bytes_sent_last_step"]]
need([(e["rank"], e["shard"], e["p2p"], e["tensor"]) for e in b] == [(0, 0, 0, tb[0]), (1, 1, 0, tb[1])],
     f"MPI T=2 bytes {b}")
finish("mpi mesh")
PY
    timeout 120 "${MPIRUN[@]}" -np 3 "$GPIPE" train "${LM[@]}" --stages 2 --tensor-parallel 2 \
        >"$TMP/mis.out" 2>"$TMP/mis.err"
    rc=$?
    [ "$rc" != 0 ] && grep -q "launched with 3 MPI ranks, but --data-parallel 1 x --stages 2 x --tensor-parallel 2 needs D x K x T = 4 ranks" \
        "$TMP/mis.err" || bad "mismatched mesh launch: exit $rc, $(head -c 500 "$TMP/mis.err")"
fi

cli_finish mesh
