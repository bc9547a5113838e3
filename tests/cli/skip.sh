#!/usr/bin/env bash
# Skip connections in configs (`"name"` on a layer, `add` and `concat` merges with `"from"`):
# a classifier whose skips cross stages trains to the single-device parameters, loss and
# evaluation for every K, schedule and re-materialization mode, relayed through the stages
# between (a given partition), resumed on another K, and under MPI (one stage per rank, and
# D = 2 replicas); each pipeline message carries its cut's skips (the MPI report's bytes),
# `gpipe plan` counts them in the stash and on the links, the timeline draws the transfers that
# carry skips; bad configs exit 2 naming the layer and what was expected; with Fashion-MNIST
# installed, examples/dense_fashion.json learns on K = 2 and 3.
# Run from the repository root: bash tests/cli/skip.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"
cli_write_idx "$TMP/syn"

# r1 (layer 1, a (4, 28, 28) map) is read by an add (4) and a concat (6).
cat >"$TMP/skip.json" <<'JSON'
{"input": {"shape": [1, 28, 28]},
 "layers": [
  {"kind": "conv2d", "in": 1, "out": 4, "kernel": 3, "pad": 1, "name": "c1"},
  {"kind": "relu", "name": "r1"},
  {"kind": "conv2d", "in": 4, "out": 4, "kernel": 3, "pad": 1},
  {"kind": "relu"},
  {"kind": "add", "from": "r1"},
  {"kind": "conv2d", "in": 4, "out": 4, "kernel": 3, "pad": 1},
  {"kind": "concat", "from": "r1"},
  {"kind": "maxpool2d", "kernel": 2, "name": "p"},
  {"kind": "flatten"},
  {"kind": "linear", "in": 1568, "out": 32},
  {"kind": "relu"},
  {"kind": "linear", "in": 32, "out": 10}
 ]}
JSON

C=(--model "$TMP/skip.json" --data "$TMP/syn" --batch 16 --eval-size 16 --threads 1 --quiet
   --seed 5)
A=("${C[@]}" --steps 2)
A4=("${A[@]}" --micro-batches 4)
COMBOS="2:gpipe:none 2:1f1b:cell 3:1f1b:none 3:gpipe:cell 3:zbh1:cell 3:gpipe:selective
        2:interleaved:none 2:zbv:cell"
run ref "${A4[@]}" --report "$TMP/ref.json"
for c in $COMBOS; do
    IFS=: read -r k s r <<<"$c"
    run "t_$k$s$r" "${A4[@]}" --stages "$k" --schedule "$s" --remat "$r" --report "$TMP/t_$k$s$r.json"
done
# r1 ends cell 0 at cut 2; r1 relayed through stages 1 and 2 to the concat at 6.
run p4 "${A4[@]}" --stages 4 --partition 0,2,5,7 --remat none --report "$TMP/p4.json" \
    --timeline "$TMP/p4.svg"
run p2 "${A4[@]}" --stages 2 --partition 0,2 --schedule zbh1 --report "$TMP/p2.json"
grep -q "send/recv with skips" "$TMP/p4.svg" && grep -q "SEND_ACT + skips 1" "$TMP/p4.svg" &&
    grep -q "RECV_GRAD + skips 1" "$TMP/p4.svg" ||
    bad "the timeline does not draw the transfers that carry skips: $(grep -c skips "$TMP/p4.svg")"

# A checkpoint saved on K = 2 after 2 of 4 steps resumes on K = 3 to the bits of 4 steps on one
# device.
R=("${C[@]}" --micro-batches 4 --steps 4)
run r_ref "${R[@]}" --report "$TMP/r_ref.json"
run r_k2 "${R[@]}" --stages 2 --checkpoint-dir "$TMP/ck" --checkpoint-every 2
rm -f "$TMP"/ck/ckpt-00000004*
run r_k3 "${R[@]}" --stages 3 --checkpoint-dir "$TMP/ck" --resume --report "$TMP/r_k3.json"

# MPI: the same bits as threads; cut 3 carries r1 beside the activation, (4, 4, 28, 28) floats
# twice per message.
mpi=0
if "$GPIPE" train --model convnet --launcher mpi --stages 2 2>&1 | grep -q "MPI support was not built" ||
    ! command -v mpirun >/dev/null; then
    echo "(MPI part skipped: no MPI in this gpipe or no mpirun)"
else
    mpi=1
    cli_need_mpi
    # (under ASan, Open MPI's plugins leave their own allocations behind at exit; the threaded
    # runs above keep leak detection)
    saved_asan=${ASAN_OPTIONS-}
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    cli_mpirun m3 3 "${A4[@]}" --launcher mpi --stages 3 --partition 0,3,6 --schedule 1f1b \
        --report "$TMP/m3.json"
    run t3 "${A4[@]}" --stages 3 --partition 0,3,6 --schedule 1f1b --report "$TMP/t3.json"
    cli_mpirun d2k2 4 "${A[@]}" --launcher mpi --data-parallel 2 --stages 2 --micro-batches 2 \
        --report "$TMP/d2k2.json"
    cli_mpirun d2k1 2 "${A[@]}" --launcher mpi --data-parallel 2 --stages 1 --micro-batches 2 \
        --report "$TMP/d2k1.json"
    export ASAN_OPTIONS="$saved_asan"
fi

# The plan of partition 0,3,6: cut 3 and cut 6 carry r1 (50176 bytes a micro-batch of 4) beside
# the activation (50176), so stage 1 stashes 4 x 100352 (remat cell, gpipe) beside the state it
# rebuilds for one micro-batch (3 maps), and each link carries M x (100352 + 72) bytes a way.
"$GPIPE" plan --model "$TMP/skip.json" --stages 3 --micro-batches 4 --batch 16 \
    --partition 0,3,6 --report "$TMP/plan.json" >"$TMP/plan.out" 2>"$TMP/plan.err" ||
    bad "gpipe plan failed: $(cat "$TMP/plan.err")"

python3 - "$TMP" "$COMBOS" "$mpi" <<'PY' || fail=$((fail + 1))
import sys
from clicheck import finish, load, need
d, combos, mpi = sys.argv[1], sys.argv[2].split(), sys.argv[3] == "1"
ref = load(d, "ref")
names = ["t_" + c.replace(":", "") for c in combos] + ["p4", "p2"] + (["m3", "t3"] if mpi else [])
for n in names:
    r = load(d, n)
    need(r.get("params_fnv1a64") == ref.get("params_fnv1a64"),
         f"{n}: params {r.get('params_fnv1a64')} != one device's {ref.get('params_fnv1a64')}")
    need(r.get("train", {}).get("final_loss") == ref["train"]["final_loss"], f"{n}: final loss differs")
    need(r.get("eval") == ref.get("eval"), f"{n}: eval {r.get('eval')} != {ref.get('eval')}")
need(load(d, "p4").get("pipeline", {}).get("partition") == [0, 2, 5, 7], "p4: partition not used")
need(load(d, "r_k3").get("params_fnv1a64") == load(d, "r_ref").get("params_fnv1a64"),
     "resumed on K = 3 from K = 2: not the one-device parameters")
MAP, HEADER = 4 * 4 * 28 * 28 * 4, 72
if mpi:
    b = load(d, "m3")["pipeline"]["bytes_sent_last_step"]
    msg = 4 * (2 * MAP + HEADER)
    need([(e["rank"], e["p2p"]) for e in b] == [(0, msg), (1, 2 * msg), (2, msg)],
         f"m3 bytes_sent_last_step {b}, expected p2p {msg}, {2 * msg}, {msg}")
    k2, k1 = load(d, "d2k2"), load(d, "d2k1")
    need(k2.get("params_fnv1a64") == k1.get("params_fnv1a64") and
         k2["train"]["final_loss"] == k1["train"]["final_loss"],
         f"D = 2: K = 2 params {k2.get('params_fnv1a64')} != K = 1 {k1.get('params_fnv1a64')}")
p = load(d, "plan")["pipeline"]
c1 = p["cells"][1]
need(c1["peak_bytes"]["activations"] == 4 * 2 * MAP + 3 * MAP,
     f"plan: stage 1 activations {c1['peak_bytes']['activations']}, expected {4 * 2 * MAP + 3 * MAP}")
need(c1["bytes_per_step"]["pipeline"] == 2 * 4 * (2 * MAP + HEADER),
     f"plan: stage 1 pipeline bytes {c1['bytes_per_step']['pipeline']}")
finish("skip reports")
PY

# Bad configs: exit 2, the key's path and what was expected.
bad_config() { # NEEDLE INDEX LAYER-JSON
    python3 - "$TMP/skip.json" "$2" "$3" >"$TMP/bad.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["layers"][int(sys.argv[2])] = json.loads(sys.argv[3])
print(json.dumps(m))
PY
    "$GPIPE" train --model "$TMP/bad.json" --data "$TMP/syn" --steps 1 >"$TMP/bad.out" 2>"$TMP/bad.err"
    local rc=$?
    [ "$rc" = 2 ] && grep -qF -- "$1" "$TMP/bad.err" ||
        bad "layers[$2] = $3: exit $rc, expected 2 and '$1': $(head -c 300 "$TMP/bad.err")"
}
bad_config 'layers[4].from: no layer is named "nope"' 4 '{"kind": "add", "from": "nope"}'
bad_config 'layers[4].from: layer "p" is layers[7], after this one' 4 '{"kind": "add", "from": "p"}'
bad_config 'layers[4].from: missing' 4 '{"kind": "add"}'
bad_config 'layers[4].from: expected the name of an earlier layer, got a number' 4 '{"kind": "add", "from": 1}'
bad_config 'layers[3].from: unknown key for a relu layer (expected one of: kind, name)' 3 '{"kind": "relu", "from": "r1"}'
bad_config 'layers[3].name: duplicate layer name "c1" (layers[0] has it)' 3 '{"kind": "relu", "name": "c1"}'
bad_config 'layers[3].name: expected a non-empty string' 3 '{"kind": "relu", "name": ""}'
bad_config 'layers[10] (add): layer 10 (add): input (1, 32) and layer 1'"'"'s output (1, 4, 28, 28): expected the same shape' \
    10 '{"kind": "add", "from": "r1"}'
bad_config 'layer 8 (concat): input (1, 8, 14, 14) and layer 1'"'"'s output (1, 4, 28, 28): expected shapes that differ in dimension 1 at most' \
    8 '{"kind": "concat", "from": "r1"}'

# The example: a DenseNet-like classifier whose long skip crosses every balanced cut learns
# Fashion-MNIST on K = 2 and 3 (chance 0.10; 0.7 after 300 steps, see its README line).
FASHION=/usr/share/datasets/fashion-mnist
# (Not under GP_TEST_QUICK, which the sanitizer builds set: 200 steps there take minutes.)
if [ "${GP_TEST_QUICK:-0}" = 1 ]; then
    echo "(example part skipped under GP_TEST_QUICK)"
elif [ -e "$FASHION/train-images-idx3-ubyte.gz" ] || [ -e "$FASHION/train-images-idx3-ubyte" ]; then
    for k in 2 3; do
        run "ex$k" --model examples/dense_fashion.json --data "$FASHION" --stages "$k" --steps 100 \
            --batch 64 --micro-batches 4 --eval-size 2000 --lr 0.05 --quiet --report "$TMP/ex$k.json"
    done
    python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import sys
from clicheck import finish, load, need
d = sys.argv[1]
for k in (2, 3):
    r = load(d, f"ex{k}")
    acc = r.get("eval", {}).get("accuracy", 0)
    # well above chance (0.1); the threshold leaves room for other CPUs' float rounding
    need(acc > 0.45, f"examples/dense_fashion.json on K = {k}: test accuracy {acc} after 100 steps")
    print(f"dense_fashion K = {k}: accuracy {acc} after 100 steps, partition {r.get('pipeline', {}).get('partition')}")
finish("skip example")
PY
else
    echo "(example part skipped: no Fashion-MNIST under $FASHION)"
fi

cli_finish skip
