#!/usr/bin/env bash
# Tied embeddings ("tie_embeddings": true) through `gpipe train`: one device and K = 2, 3 with
# the tie spanning the stages (gpipe, 1f1b, zbh1, interleaved, zbv; remat cell, none,
# selective) give the same losses, parameter hash and evaluation bit for bit, and differ from
# the untied model's; a checkpoint stores the tied matrix once (under the embedding's name, with
# "tied" in its metadata) and resumes on another K to the same bits; an untied run refuses a
# tied checkpoint, naming the config that saved it; a head of another shape is a config error;
# `gpipe bench --tie-embeddings` is for the Transformer workloads only.
# Under mpirun (skipped without MPI): K = 2 and 3 give the threads' bits, and a set saved by
# 2 ranks (the head's part without the matrix) resumes on 3 ranks and on threads.
# Run from the repository root: bash tests/cli/tied.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

printf '{"family": "transformer", "vocab": 256, "dim": 16, "heads": 2, "d_ff": 32, "layers": 2, "seq_len": 16, "dropout": 0.1, "tie_embeddings": true}\n' \
    >"$TMP/tied.json"
sed 's/, "tie_embeddings": true//' "$TMP/tied.json" >"$TMP/untied.json"
cli_write_corpus "$TMP/corpus"
LM=(--model "$TMP/tied.json" --data "$TMP/corpus" --steps 4 --batch 8 --micro-batches 4
    --eval-size 4 --threads 1 --quiet --seed 5)

# same NAME...: each run's report has the first's step losses, parameters and evaluation.
same() {
    python3 - "$TMP" "$@" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d, names = sys.argv[1], sys.argv[2:]
r = {n: json.load(open(f"{d}/{n}.json")) for n in names}
a = r[names[0]]
for n in names[1:]:
    b = r[n]
    need(a["train"]["step_losses"] == b["train"]["step_losses"],
         f"{n}: losses {b['train']['step_losses']} vs {a['train']['step_losses']}")
    need(a["params_fnv1a64"] == b["params_fnv1a64"],
         f"{n}: params {b['params_fnv1a64']} vs {a['params_fnv1a64']}")
    need(a["eval"] == b["eval"], f"{n}: eval {b['eval']} vs {a['eval']}")
finish("FAIL: tied runs:")
PY
}

run one "${LM[@]}" --report "$TMP/one.json"
run k2 "${LM[@]}" --stages 2 --report "$TMP/k2.json"
run k3 "${LM[@]}" --stages 3 --schedule 1f1b --remat none --report "$TMP/k3.json"
run k3z "${LM[@]}" --stages 3 --schedule zbh1 --remat selective --report "$TMP/k3z.json"
run il "${LM[@]}" --stages 2 --schedule interleaved --report "$TMP/il.json"
run zbv "${LM[@]}" --stages 2 --schedule zbv --remat none --report "$TMP/zbv.json"
same one k2 k3 k3z il zbv
run untied "${LM[@]/$TMP\/tied.json/$TMP/untied.json}" --stages 2 --report "$TMP/untied_run.json"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
a, b = (json.load(open(f"{d}/{n}.json")) for n in ("one", "untied_run"))
need(a["params_fnv1a64"] != b["params_fnv1a64"], "tied and untied trained to the same parameters")
need(a["train"]["step_losses"][0] != b["train"]["step_losses"][0], "tied and untied: same first loss")
finish("FAIL: tied vs untied:")
PY

# --- checkpoints: stored once, resumed on another K --------------------------------------------
run ck2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/ck" --stop-after 2
cp -r "$TMP/ck" "$TMP/ck_untied"
python3 - "$TMP/ck/ckpt-00000002.safetensors" <<'PY' || fail=$((fail + 1))
import json, struct, sys
from clicheck import finish, need
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
names = set(h) - {"__metadata__"}
need("layers.0.weight" in names and "layers.0.weight.adam_m" in names, f"no embedding: {sorted(names)}")
need(not any(x.startswith("layers.5.weight") for x in names), f"the head's copy was stored: {sorted(names)}")
need(h["__metadata__"].get("tied") == "layers.5.weight=layers.0.weight", f"metadata {h['__metadata__'].get('tied')}")
finish("FAIL: tied checkpoint file:")
PY
run r3 "${LM[@]}" --stages 3 --checkpoint-dir "$TMP/ck" --resume --report "$TMP/r3.json" &&
    cli_same_run one r3
if "$GPIPE" train "${LM[@]/$TMP\/tied.json/$TMP/untied.json}" --checkpoint-dir "$TMP/ck_untied" \
    --resume >"$TMP/wrong.out" 2>"$TMP/wrong.err"; then
    bad "an untied model resumed a tied checkpoint"
fi
# (the CLI compares the saved model config first; the library's own check is test_checkpoint's)
grep -q 'was saved from model config .*"tie_embeddings": true' "$TMP/wrong.err" ||
    bad "untied from tied: $(tail -c 400 "$TMP/wrong.err")"

printf '{"input": {"shape": [16], "dtype": "int32"}, "tie_embeddings": true, "layers": [{"kind": "embedding", "vocab": 256, "dim": 16}, {"kind": "linear", "in": 16, "out": 128, "bias": false}]}\n' \
    >"$TMP/shape.json"
"$GPIPE" train --model "$TMP/shape.json" --data "$TMP/corpus" --steps 1 >"$TMP/shape.out" 2>"$TMP/shape.err"
rc=$?
[ "$rc" != 0 ] && grep -q "tie_embeddings.*weight has shape (128, 16)" "$TMP/shape.err" ||
    bad "a head of another shape: exit $rc, $(tail -c 400 "$TMP/shape.err")"

# gpipe bench ties the Transformer workloads only.
"$GPIPE" bench --workload C1 --tie-embeddings >"$TMP/bc1.out" 2>"$TMP/bc1.err"
rc=$?
[ "$rc" = 2 ] && grep -q -- "--tie-embeddings: only for --workload T1, T2 or T3 (got C1)" "$TMP/bc1.err" ||
    bad "bench C1 --tie-embeddings: exit $rc, $(cat "$TMP/bc1.err")"

# --- MPI ---------------------------------------------------------------------------------------
[ "$fail" = 0 ] || cli_finish tied
cli_need_mpi
# Under ASan, no leak check from here on: Open MPI's plugins leave their own allocations behind
# at exit (the runs above were checked).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
cli_mpirun m2 2 "${LM[@]}" --stages 2 --schedule 1f1b --report "$TMP/m2.json"
cli_mpirun m3 3 "${LM[@]}" --stages 3 --report "$TMP/m3.json"
same one m2 m3
cli_mpirun mck 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/mck" --stop-after 2
cp -r "$TMP/mck" "$TMP/mck_thr"
cli_mpirun mr3 3 "${LM[@]}" --stages 3 --checkpoint-dir "$TMP/mck" --resume --report "$TMP/mr3.json" &&
    cli_same_run one mr3
run mthr "${LM[@]}" --checkpoint-dir "$TMP/mck_thr" --resume --report "$TMP/mthr.json" &&
    cli_same_run one mthr
cli_finish tied
