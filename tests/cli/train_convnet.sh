#!/usr/bin/env bash
# `gpipe train` on the convnet: a few steps with --report give valid JSON
# with the required keys and sane values; the same seed gives the same
# parameter hash, another seed another; epochs, micro-batches, the memory
# limit and log lines on a small synthetic IDX set; a failed report write.
# Run from the repository root: bash tests/cli/train_convnet.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

# A small IDX data set: 90 training and 40 test images.
cli_write_idx "$TMP/syn" 90 40

# The real Fashion-MNIST when installed (the default --data), else the small set.
DATA=()
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "note: Fashion-MNIST not installed, using the synthetic set"
    DATA=(--data "$TMP/syn")
fi

COMMON=(--model convnet --steps 3 --batch 16 --eval-size 64 --threads 1 --quiet "${DATA[@]}")
run a "${COMMON[@]}" --seed 7 --report "$TMP/a.json"
run b "${COMMON[@]}" --seed 7 --report "$TMP/b.json"
run c "${COMMON[@]}" --seed 8 --report "$TMP/c.json"
grep -q "test accuracy" "$TMP/a.out" || bad "no test accuracy line in the output"
grep -q "defaults used:.*optimizer=sgd.*lr=0.05" "$TMP/a.out" || bad "the defaults line is missing"
[ -s "$TMP/a.err" ] && bad "--quiet still wrote to stderr: $(head -c 300 "$TMP/a.err")"

python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, math, re, sys
from clicheck import finish, need
d = sys.argv[1]
a, b, c = (json.load(open(f"{d}/{n}.json")) for n in "abc")
for key in ("model", "seed", "steps", "train", "eval", "throughput", "memory", "params_fnv1a64",
            "threads", "batch", "lr", "elapsed_s", "blas_core", "nparams"):
    need(key in a, f"missing key {key}")
need(a.get("model") == "convnet", f"model {a.get('model')!r}")
need(a.get("seed") == 7 and c.get("seed") == 8, "seed")
need(a.get("steps") == 3, f"steps {a.get('steps')}")
need(a.get("threads") == 1 and a.get("batch") == 16 and a.get("lr") == 0.05, "threads/batch/lr")
need(a.get("nparams") == 870826, f"nparams {a.get('nparams')} (C1 has 870,826)")
fl = a.get("train", {}).get("final_loss")
need(isinstance(fl, float) and 0 < fl < 10, f"train.final_loss {fl}")
acc = a.get("eval", {}).get("accuracy")
need(isinstance(acc, (int, float)) and 0 <= acc <= 1, f"eval.accuracy {acc}")
need(a.get("eval", {}).get("examples") == 64, "eval.examples")
need(a.get("throughput", {}).get("examples_per_s", 0) > 0, "throughput.examples_per_s")
need(a.get("elapsed_s", 0) > 0 and isinstance(a.get("blas_core"), str), "elapsed_s/blas_core")
peak = a.get("memory", {}).get("peak_bytes", {})
for cat in ("parameters", "gradients", "optimizer_state", "activations", "workspace", "total"):
    need(isinstance(peak.get(cat), int), f"memory.peak_bytes.{cat}")
need(peak.get("parameters", 0) >= 870826 * 4, "parameter bytes below 4 x nparams")
need(peak.get("total", 0) >= max(v for k, v in peak.items() if k != "total"), "total below a category")
h = a.get("params_fnv1a64", "")
need(re.fullmatch(r"[0-9a-f]{16}", h) is not None, f"params_fnv1a64 {h!r}")
need(h == b.get("params_fnv1a64"), f"same seed, different hashes {h} {b.get('params_fnv1a64')}")
need(a["train"]["final_loss"] == b["train"]["final_loss"], "same seed, different final loss")
need(h != c.get("params_fnv1a64"), "different seeds, same hash")
finish("FAIL: report:")
PY

# Epochs on the synthetic set: 90 images, batch 16 -> 5 steps per epoch
# (the partial batch dropped), evaluated after each epoch on all 40 test images.
run e --model convnet --data "$TMP/syn" --epochs 2 --batch 16 --micro-batches 2 --threads 1 \
    --memory-limit 512M --log-every 5 --report "$TMP/e.json"
python3 - "$TMP/e.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
r = json.load(open(sys.argv[1]))
need(r.get("steps") == 10 and r.get("epochs") == 2, f"steps {r.get('steps')} epochs {r.get('epochs')}")
h = r.get("eval_history", [])
need([e.get("epoch") for e in h] == [1, 2] and [e.get("step") for e in h] == [5, 10],
     f"eval_history {h}")
need(r.get("eval", {}).get("examples") == 40, "eval.examples")
need(r.get("micro_batches") == 2, "micro_batches")
need(r.get("memory", {}).get("limit_bytes") == 512 << 20, "memory.limit_bytes")
finish("FAIL: epochs report:")
PY
grep -q "^step 5/10 " "$TMP/e.err" && grep -q "^step 10/10 " "$TMP/e.err" ||
    bad "no 'step N/10' log lines on stderr: $(head -c 300 "$TMP/e.err")"
[ "$(grep -c "test accuracy" "$TMP/e.out")" -eq 2 ] || bad "expected one test line per epoch"

# A report that cannot be written is a runtime failure naming --report; no
# temporary file is left behind.
"$GPIPE" train --model convnet --data "$TMP/syn" --steps 1 --batch 16 --quiet \
    --report "$TMP/no/such/dir/r.json" >/dev/null 2>"$TMP/w.err"
rc=$?
[ $rc -eq 1 ] || bad "unwritable --report: exit status $rc, expected 1"
grep -q -- "--report" "$TMP/w.err" || bad "unwritable --report: message lacks --report: $(cat "$TMP/w.err")"
# An existing report is replaced whole
echo "old" >"$TMP/r.json"
run r --model convnet --data "$TMP/syn" --steps 1 --batch 16 --quiet --report "$TMP/r.json"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$TMP/r.json" || bad "replaced report is not JSON"
ls "$TMP" | grep -q '\.tmp\.' && bad "temporary report files left: $(ls "$TMP")"

# --augment: same seed same parameters; crop, crop-flip, crop1, flip and crop1-flip each change
# them against none and one another (the images differ); a 2-stage pipeline trains on the same
# augmented images as one device (same hash at one thread per device); a checkpoint of an
# augmented run refuses a resume without it.
AUG=(--model convnet --data "$TMP/syn" --steps 4 --batch 16 --threads 1 --quiet)
run g0 "${AUG[@]}" --report "$TMP/g0.json"
run g1 "${AUG[@]}" --augment crop --report "$TMP/g1.json"
run g2 "${AUG[@]}" --augment crop-flip --report "$TMP/g2.json"
run g3 "${AUG[@]}" --augment crop-flip --report "$TMP/g3.json"
run g4 "${AUG[@]}" --augment crop-flip --stages 2 --micro-batches 2 --report "$TMP/g4.json"
run g5 "${AUG[@]}" --augment crop-flip --micro-batches 2 --report "$TMP/g5.json"
run g6 "${AUG[@]}" --augment crop1 --report "$TMP/g6.json"
run g7 "${AUG[@]}" --augment flip --report "$TMP/g7.json"
run g8 "${AUG[@]}" --augment flip --report "$TMP/g8.json"
run g9 "${AUG[@]}" --augment crop1-flip --report "$TMP/g9.json"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
h = {n: json.load(open(f"{d}/{n}.json")) for n in ("g0", "g1", "g2", "g3", "g4", "g6", "g7", "g8", "g9")}
hx = {n: r["params_fnv1a64"] for n, r in h.items()}
need(len({hx["g0"], hx["g1"], hx["g2"], hx["g6"], hx["g7"], hx["g9"]}) == 6,
     f"augmentation does not change training, or two modes train alike: {hx}")
need(hx["g2"] == hx["g3"], "crop-flip: same seed, different parameters")
need(hx["g7"] == hx["g8"], "flip: same seed, different parameters")
need(h["g2"]["augment"] == "crop-flip" and h["g0"]["augment"] == "none", "report's augment")
need(h["g6"]["augment"] == "crop1" and h["g7"]["augment"] == "flip", "report's augment (crop1, flip)")
finish()
PY
python3 -c 'import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); sys.exit(a["train"]["step_losses"]!=b["train"]["step_losses"])' \
    "$TMP/g5.json" "$TMP/g4.json" || bad "--augment: 2 stages trained on other images than one device (losses differ)"
run ga "${AUG[@]}" --augment crop --checkpoint-dir "$TMP/gck" --stop-after 2
"$GPIPE" train "${AUG[@]}" --checkpoint-dir "$TMP/gck" --resume >/dev/null 2>"$TMP/ga.err"
rc=$?
[ $rc -ne 0 ] && grep -q -- "--augment none differs" "$TMP/ga.err" || bad "resume without --augment: exit $rc, $(cat "$TMP/ga.err")"
"$GPIPE" train "${AUG[@]}" --augment mirror >/dev/null 2>"$TMP/gb.err"
[ $? -eq 2 ] && grep -q "expected none, crop, crop1, flip, crop-flip or crop1-flip" "$TMP/gb.err" || bad "--augment mirror: $(cat "$TMP/gb.err")"

# --erase: random erasing changes the parameters (alone and after flip), the same seed gives the
# same ones, --erase 0 is no erasing, 2 stages train on one device's images; a checkpoint refuses
# a resume without it, and a resume with it ends where the straight run does; out of [0, 1] and on a language model it is a usage error.
run e1 "${AUG[@]}" --erase 0.5 --report "$TMP/e1.json"
run e2 "${AUG[@]}" --erase 0.5 --report "$TMP/e2.json"
run e3 "${AUG[@]}" --erase 0 --report "$TMP/e3.json"
run e4 "${AUG[@]}" --augment flip --erase 0.5 --report "$TMP/e4.json"
run e5 "${AUG[@]}" --erase 1 --stages 2 --micro-batches 2 --report "$TMP/e5.json"
run e6 "${AUG[@]}" --erase 1 --micro-batches 2 --report "$TMP/e6.json"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
r = {n: json.load(open(f"{d}/{n}.json")) for n in ("g0", "g7", "e1", "e2", "e3", "e4", "e5", "e6")}
hx = {n: x["params_fnv1a64"] for n, x in r.items()}
need(hx["e1"] == hx["e2"], "--erase 0.5: same seed, different parameters")
need(hx["e3"] == hx["g0"], "--erase 0 trained otherwise than no --erase")
need(len({hx["g0"], hx["e1"], hx["g7"], hx["e4"], hx["e6"]}) == 5,
     f"--erase does not change training: {hx}")
need(r["e1"]["erase"] == 0.5 and r["g0"]["erase"] == 0, "report's erase")
need(r["e5"]["train"]["step_losses"] == r["e6"]["train"]["step_losses"],
     "--erase: 2 stages trained on other images than one device (losses differ)")
finish("FAIL: --erase:")
PY
run ea "${AUG[@]}" --erase 0.5 --checkpoint-dir "$TMP/eck" --stop-after 2
"$GPIPE" train "${AUG[@]}" --checkpoint-dir "$TMP/eck" --resume >/dev/null 2>"$TMP/ea.err"
rc=$?
[ $rc -ne 0 ] && grep -q -- "--erase 0 differs from the checkpoint's 0.5" "$TMP/ea.err" ||
    bad "resume without --erase: exit $rc, $(cat "$TMP/ea.err")"
run eb "${AUG[@]}" --erase 0.5 --checkpoint-dir "$TMP/eck" --resume --report "$TMP/eb.json"
python3 -c 'import json,sys; a,b=(json.load(open(p))["params_fnv1a64"] for p in sys.argv[1:]); sys.exit(a!=b)' \
    "$TMP/e1.json" "$TMP/eb.json" || bad "--erase: the resumed run trained otherwise than the straight one"
"$GPIPE" train "${AUG[@]}" --erase 1.5 >/dev/null 2>"$TMP/eb.err"
[ $? -eq 2 ] && grep -qF -- "--erase: expected a number >= 0 and <= 1, got '1.5'" "$TMP/eb.err" ||
    bad "--erase 1.5: $(cat "$TMP/eb.err")"
"$GPIPE" train --model transformer --steps 1 --erase 0.5 >/dev/null 2>"$TMP/ec.err"
[ $? -eq 2 ] && grep -q -- "--erase: only for image classifiers" "$TMP/ec.err" ||
    bad "--erase on a language model: $(cat "$TMP/ec.err")"

# --label-smoothing: recorded in the report; other targets, other losses from the first step;
# 2 stages give one device's losses; a checkpoint refuses a resume without it; out of range is a
# usage error.
run ls1 "${AUG[@]}" --label-smoothing 0.1 --report "$TMP/ls1.json"
run ls2 "${AUG[@]}" --label-smoothing 0.1 --stages 2 --micro-batches 2 --report "$TMP/ls2.json"
run ls3 "${AUG[@]}" --label-smoothing 0.1 --micro-batches 2 --report "$TMP/ls3.json"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
r = {n: json.load(open(f"{d}/{n}.json")) for n in ("g0", "ls1", "ls2", "ls3")}
need(r["ls1"]["label_smoothing"] == 0.1 and r["g0"]["label_smoothing"] == 0, "report's label_smoothing")
l0, l1 = r["g0"]["train"]["step_losses"], r["ls1"]["train"]["step_losses"]
need(l0[0] != l1[0], f"--label-smoothing 0.1: the first loss {l1[0]} equals the plain one")
need(r["ls2"]["train"]["step_losses"] == r["ls3"]["train"]["step_losses"],
     "--label-smoothing: 2 stages lost otherwise than one device")
need(r["ls2"]["params_fnv1a64"] == r["ls3"]["params_fnv1a64"], "--label-smoothing: 2 stages, other parameters")
finish("FAIL: label smoothing:")
PY
run lsa "${AUG[@]}" --label-smoothing 0.1 --checkpoint-dir "$TMP/lsck" --stop-after 2
"$GPIPE" train "${AUG[@]}" --checkpoint-dir "$TMP/lsck" --resume >/dev/null 2>"$TMP/lsa.err"
rc=$?
[ $rc -ne 0 ] && grep -q -- "--label-smoothing 0 differs from the checkpoint's 0.1" "$TMP/lsa.err" ||
    bad "resume without --label-smoothing: exit $rc, $(cat "$TMP/lsa.err")"
"$GPIPE" train "${AUG[@]}" --label-smoothing 1 >/dev/null 2>"$TMP/lsb.err"
[ $? -eq 2 ] && grep -qF -- "--label-smoothing: expected a number >= 0 and < 1, got '1'" "$TMP/lsb.err" ||
    bad "--label-smoothing 1: $(cat "$TMP/lsb.err")"

# --tta: the plain figures of every evaluation and the parameters are those of a run without it;
# with flip each evaluation also has augmented figures (in the report, its history, --metrics and
# the curve), and gpipe eval --tta flip on the final checkpoint gives them again; flip-shift's
# ten views give others; a bad mode, and --tta on a language model, are usage errors.
TTA=(--model convnet --data "$TMP/syn" --epochs 2 --batch 16 --threads 1 --quiet --stages 2
     --micro-batches 2 --eval-size 40)
run t0 "${TTA[@]}" --report "$TMP/t0.json"
run t1 "${TTA[@]}" --tta flip --report "$TMP/t1.json" --metrics "$TMP/t1.jsonl" \
    --curve "$TMP/t1.svg" --checkpoint-dir "$TMP/tck"
grep -q "test accuracy, --tta flip" "$TMP/t1.svg" || bad "--tta flip: the curve has no augmented accuracy"
# gpipe eval in training's batches of 16 runs the same GEMM shapes (the same bits); in its own
# default batches of 128 it runs others, which OpenBLAS may sum in another order.
for m in flip flip-shift flip:16; do
    b=${m#*:}; [ "$b" = "$m" ] && b=128; m=${m%:*}
    "$GPIPE" eval --checkpoint "$TMP/tck/ckpt-00000010.safetensors" --data "$TMP/syn" --tta $m \
        --batch "$b" --threads 1 --report "$TMP/te-$m-$b.json" >"$TMP/te-$m-$b.out" 2>&1 ||
        bad "gpipe eval --tta $m --batch $b: $(cat "$TMP/te-$m-$b.out")"
done
grep -q -- "--tta flip (2 views)" "$TMP/te-flip-128.out" || bad "gpipe eval --tta flip printed no augmented figures"
grep -q -- "--tta flip-shift (10 views)" "$TMP/te-flip-shift-128.out" || bad "gpipe eval --tta flip-shift printed no augmented figures"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
t0, t1, te16, te, ts = (json.load(open(f"{d}/{n}.json")) for n in ("t0", "t1", "te-flip-16",
                                                                      "te-flip-128", "te-flip-shift-128"))
need(t0["params_fnv1a64"] == t1["params_fnv1a64"], "--tta flip changed the training")
need(t0["tta"] == "none" and t1["tta"] == "flip", f"report's tta: {t0['tta']} {t1['tta']}")
h0, h1 = t0["eval_history"], t1["eval_history"]
need(len(h0) == len(h1) == 2, f"evaluations {len(h0)} {len(h1)}, expected one per epoch")
for a, b in zip(h0, h1):
    need(a["loss"] == b["loss"] and a["accuracy"] == b["accuracy"],
         f"--tta flip changed the plain figures: {a} vs {b}")
    need("tta_accuracy" not in a, "augmented figures without --tta")
    need(0 <= b["tta_accuracy"] <= 1 and b["tta_loss"] > 0, f"augmented figures {b}")
need(any(b["tta_loss"] != b["loss"] for b in h1), "the augmented loss is the plain one")
ev = t1["eval"]
need(ev["tta_accuracy"] == h1[-1]["tta_accuracy"], "report's final augmented accuracy")
# In training's batches of 16: training's figures, bit for bit.
for key in ("loss", "accuracy", "tta_loss", "tta_accuracy"):
    need(te16["eval"][key] == ev[key], f"gpipe eval --tta flip --batch 16: {key} {te16['eval']} vs training's {ev}")
# In batches of 128 the GEMMs have other shapes, which OpenBLAS may sum in another order (it
# picks kernels by CPU and shape): each logit may move by a few float32 roundings (u = 6e-8) per
# layer. 1e-5 relative on the mean loss (about 170 u) covers that and still tells the views
# apart (flip-shift's loss is 8% off flip's); an accuracy may differ by one image out of 40,
# one whose two top logits tie within that rounding.
close = lambda x, y: abs(x - y) <= 1e-5 * abs(y)
near = lambda x, y: abs(x - y) <= 1 / 40 + 1e-12
need(close(te["eval"]["tta_loss"], ev["tta_loss"]) and near(te["eval"]["tta_accuracy"], ev["tta_accuracy"]),
     f"gpipe eval --tta flip: {te['eval']} vs training's {ev}")
need(close(te["eval"]["loss"], ev["loss"]) and near(te["eval"]["accuracy"], ev["accuracy"]),
     f"gpipe eval --tta flip: plain figures {te['eval']} vs {ev}")
need(te["eval"]["tta"] == "flip" and ts["eval"]["tta"] == "flip-shift", "gpipe eval's report: tta")
need(ts["eval"]["loss"] == te["eval"]["loss"] and not close(ts["eval"]["tta_loss"], te["eval"]["tta_loss"]),
     f"--tta flip-shift: {ts['eval']} against flip's {te['eval']}")
lines = [json.loads(l) for l in open(f"{d}/t1.jsonl")]
evs = [l for l in lines if l["type"] == "eval"]
need(len(evs) == 2 and all("tta_accuracy" in l for l in evs), f"--metrics eval lines {evs}")
finish("FAIL: --tta:")
PY
"$GPIPE" train "${AUG[@]}" --tta mirror >/dev/null 2>"$TMP/tb.err"
[ $? -eq 2 ] && grep -q -- "--tta mirror: expected none, flip or flip-shift" "$TMP/tb.err" || bad "--tta mirror: $(cat "$TMP/tb.err")"
"$GPIPE" train --model transformer --steps 1 --tta flip >/dev/null 2>"$TMP/tc.err"
[ $? -eq 2 ] && grep -q -- "--tta: only for image classifiers" "$TMP/tc.err" || bad "--tta on a language model: $(cat "$TMP/tc.err")"

# --lr-cycles: --metrics's learning rate climbs back to --lr where the second cycle starts, and a
# resume without the option, a constant schedule, no cycles and cycles no longer than the
# warm-up are refused. gpipe eval --ensemble: a model with itself gives its own figures; the end
# of the first cycle beside the second's gives others, over models x views, and leaves the plain
# figures those of --checkpoint alone.
CYC=(--model convnet --data "$TMP/syn" --steps 8 --batch 16 --threads 1 --quiet --warmup 1
     --eval-size 40)
run y1 "${CYC[@]}" --lr-schedule cosine --lr-cycles 2 --log-every 1 --metrics "$TMP/y1.jsonl" \
    --checkpoint-dir "$TMP/yck" --checkpoint-every 4 --report "$TMP/y1.json"
Y4="$TMP/yck/ckpt-00000004.safetensors" Y8="$TMP/yck/ckpt-00000008.safetensors"
for e in "$Y8" "$Y4"; do
    for m in none flip; do
        "$GPIPE" eval --checkpoint "$Y8" --ensemble "$e" --data "$TMP/syn" --tta $m --threads 1 \
            --report "$TMP/ye-$(basename "$e")-$m.json" >"$TMP/ye-$m.out" 2>&1 ||
            bad "gpipe eval --ensemble $e --tta $m: $(cat "$TMP/ye-$m.out")"
    done
done
grep -q -- "ensemble of 2 models x 2 views (--tta flip)" "$TMP/ye-flip.out" ||
    bad "gpipe eval --ensemble --tta flip: $(cat "$TMP/ye-flip.out")"
"$GPIPE" eval --checkpoint "$Y8" --data "$TMP/syn" --threads 1 --report "$TMP/ye-alone.json" \
    >/dev/null 2>&1 || bad "gpipe eval of the last cycle's checkpoint failed"
"$GPIPE" eval --checkpoint "$Y8" --data "$TMP/syn" --threads 1 --tta flip \
    --report "$TMP/ye-alone-flip.json" >/dev/null 2>&1 || bad "gpipe eval --tta flip failed"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
lrs = [l["lr"] for l in map(json.loads, open(f"{d}/y1.jsonl")) if l["type"] == "train"]
need(len(lrs) == 8 and lrs[4] == max(lrs) and abs(lrs[4] - 0.05) < 1e-8 and lrs[1] > lrs[2] > lrs[3] < lrs[4] > lrs[5],
     f"--lr-cycles 2: learning rates {lrs}")
need(json.load(open(f"{d}/y1.json"))["lr_cycles"] == 2, "report's lr_cycles")
ev = lambda n: json.load(open(f"{d}/ye-{n}.json"))
alone, alone_flip, same, same_flip, pair = (ev(n) for n in ("alone", "alone-flip",
                                                "ckpt-00000008.safetensors-none",
                                                "ckpt-00000008.safetensors-flip",
                                                "ckpt-00000004.safetensors-flip"))
a, s, p = alone["eval"], same["eval"], pair["eval"]
close = lambda x, y: abs(x - y) <= 1e-6 * abs(y)
need(s["ensemble_accuracy"] == a["accuracy"] and close(s["ensemble_loss"], a["loss"]),
     f"a model with itself: {s} against {a}")
af, sf = alone_flip["eval"], same_flip["eval"]
need(sf["ensemble_accuracy"] == af["tta_accuracy"] and close(sf["ensemble_loss"], af["tta_loss"]),
     f"a model with itself, --tta flip: {sf} against {af}")
need(p["accuracy"] == a["accuracy"] and p["loss"] == a["loss"], f"plain figures {p} against {a}")
need(not close(p["ensemble_loss"], a["loss"]) and p["tta"] == "flip" and "tta_loss" not in p,
     f"the two cycles' ensemble: {p}")
need(pair["ensemble"] == [f"{d}/yck/ckpt-00000004.safetensors"], f"report's ensemble {pair.get('ensemble')}")
finish("FAIL: --lr-cycles, --ensemble:")
PY
for bad_cycles in "--lr-cycles 2 --lr-schedule constant:only with --lr-schedule cosine" \
    "--lr-cycles 0 --lr-schedule cosine:--lr-cycles: expected an integer >= 1, got '0'" \
    "--lr-cycles 8 --lr-schedule cosine:must be longer than the --warmup of 1 steps"; do
    "$GPIPE" train "${CYC[@]}" ${bad_cycles%%:*} >/dev/null 2>"$TMP/yb.err"
    [ $? -eq 2 ] && grep -q -- "${bad_cycles#*:}" "$TMP/yb.err" || bad "${bad_cycles%%:*}: $(cat "$TMP/yb.err")"
done
"$GPIPE" train "${CYC[@]}" --lr-schedule cosine --checkpoint-dir "$TMP/yck" --resume >/dev/null 2>"$TMP/yr.err"
[ $? -eq 1 ] && grep -q -- "--lr-cycles 1 differs from the checkpoint's 2" "$TMP/yr.err" ||
    bad "resume without --lr-cycles: $(cat "$TMP/yr.err")"
for e in "$Y4,:ends in a comma:2" ",$Y4:got an empty path:2" "$TMP/none.safetensors:cannot open:1"; do
    "$GPIPE" eval --checkpoint "$Y8" --data "$TMP/syn" --ensemble "${e%%:*}" >/dev/null 2>"$TMP/yx.err"
    rc=$?
    rest=${e#*:}
    [ $rc -eq "${rest##*:}" ] && grep -q -- "${rest%:*}" "$TMP/yx.err" || bad "--ensemble ${e%%:*}: exit $rc, $(cat "$TMP/yx.err")"
done

cli_finish train_convnet
