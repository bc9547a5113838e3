#!/usr/bin/env bash
# --precision from the command line: train and bench list it; a bad value exits 2 naming the
# option, as does bench's G1 with it; bf16 trains bit for bit alike on one device and on 2
# stages (1f1b), to other parameters than fp32, and the reports record it; checkpoints keep it:
# resuming a bf16 run without it exits 1 naming --precision, with it continues to the straight
# run's bits; bench's T1 and T2 take it and record it; plan takes it, and a bf16 plan's
# activations are the blocks' bf16-kept operands less than fp32's; on 2 stages of 2 shards the
# blocks' activations kept in bf16 train to the bits of keeping them fp32
# (GP_BF16_ACTIVATIONS=fp32); the bf16 weight copy trains to the bits of rounding the weights
# at each product (GP_BF16_WEIGHT_COPY=off) on one device, 2 stages and 2 x 2 shards, and is its
# bytes exactly in train's measured and plan's parameters; another value of either variable is
# refused. Run from the repository root:
# bash tests/cli/precision.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"
cli_write_tiny_lm
LM=(--model "$TMP/lm.json" --data "$TMP/corpus" --steps 4 --batch 8 --eval-size 4 --threads 1
    --quiet --seed 5 --micro-batches 2)

for cmd in train bench; do
    "$GPIPE" $cmd --help | grep -q -- "--precision fp32|bf16" || bad "$cmd --help lacks --precision"
done
"$GPIPE" train "${LM[@]}" --precision fp16 >/dev/null 2>"$TMP/bad.err"
rc=$?
[ "$rc" = 2 ] && grep -q -- "--precision" "$TMP/bad.err" || bad "train --precision fp16: exit $rc, $(cat "$TMP/bad.err")"
"$GPIPE" bench --workload T1 --precision tf32 >/dev/null 2>"$TMP/bad.err"
rc=$?
[ "$rc" = 2 ] && grep -q -- "--precision" "$TMP/bad.err" || bad "bench --precision tf32: exit $rc, $(cat "$TMP/bad.err")"
"$GPIPE" bench --workload G1 --precision bf16 >/dev/null 2>"$TMP/bad.err"
rc=$?
[ "$rc" = 2 ] && grep -q -- "--precision: only for T1, T2, T3 and C1" "$TMP/bad.err" ||
    bad "bench G1 --precision bf16: exit $rc, $(cat "$TMP/bad.err")"

run fp32 "${LM[@]}" --report "$TMP/fp32.json"
run one "${LM[@]}" --precision bf16 --report "$TMP/one.json"
run k2 "${LM[@]}" --precision bf16 --stages 2 --schedule 1f1b --report "$TMP/k2.json"
run tp "${LM[@]}" --precision bf16 --stages 2 --tensor-parallel 2 --report "$TMP/tp.json"
GP_BF16_ACTIVATIONS=fp32 run tp32 "${LM[@]}" --precision bf16 --stages 2 --tensor-parallel 2 \
    --report "$TMP/tp32.json"
# any other value of it is refused, named, before a step
GP_BF16_ACTIVATIONS=fp16 "$GPIPE" train "${LM[@]}" --precision bf16 >/dev/null 2>"$TMP/env.err"
rc=$?
[ "$rc" = 1 ] && grep -q 'GP_BF16_ACTIVATIONS="fp16" in the environment: expected bf16 (the default) or fp32' "$TMP/env.err" ||
    bad "GP_BF16_ACTIVATIONS=fp16: exit $rc, $(tail -c 400 "$TMP/env.err")"
GP_BF16_WEIGHT_COPY=no "$GPIPE" train "${LM[@]}" --precision bf16 >/dev/null 2>"$TMP/env.err"
rc=$?
[ "$rc" = 1 ] && grep -q 'GP_BF16_WEIGHT_COPY="no" in the environment: expected on (the default) or off' "$TMP/env.err" ||
    bad "GP_BF16_WEIGHT_COPY=no: exit $rc, $(tail -c 400 "$TMP/env.err")"
GP_BF16_WEIGHT_COPY=off run off "${LM[@]}" --precision bf16 --report "$TMP/off.json"
GP_BF16_WEIGHT_COPY=off run k2off "${LM[@]}" --precision bf16 --stages 2 --schedule 1f1b \
    --report "$TMP/k2off.json"
GP_BF16_WEIGHT_COPY=off run tpoff "${LM[@]}" --precision bf16 --stages 2 --tensor-parallel 2 \
    --report "$TMP/tpoff.json"

# Checkpoints keep the option.
run half "${LM[@]}" --precision bf16 --checkpoint-dir "$TMP/ck" --stop-after 2
"$GPIPE" train "${LM[@]}" --checkpoint-dir "$TMP/ck" --resume >/dev/null 2>"$TMP/res.err"
rc=$?
[ "$rc" = 1 ] && grep -q -- "--precision fp32 differs from the checkpoint's bf16" "$TMP/res.err" ||
    bad "resume without --precision: exit $rc, $(cat "$TMP/res.err")"
run rest "${LM[@]}" --precision bf16 --checkpoint-dir "$TMP/ck" --resume \
    --report "$TMP/rest.json" && cli_same_run one rest

# bench takes it: T1 and T2, cut down
"$GPIPE" bench --workload T1 --batch 2 --steps 1 --warmup 0 --threads 1 --precision bf16 --quiet \
    --report "$TMP/b1.json" >/dev/null 2>"$TMP/b1.err" || bad "bench T1 --precision bf16: $(tail -c 400 "$TMP/b1.err")"
"$GPIPE" bench --workload T2 --layers 2 --batch 4 --stages 2 --micro-batches 2 --steps 1 \
    --warmup 0 --threads 1 --precision bf16 --quiet --report "$TMP/b2.json" >/dev/null \
    2>"$TMP/b2.err" || bad "bench T2 --precision bf16: $(tail -c 400 "$TMP/b2.err")"

# plan: one stage of the 2 blocks, 2 micro-batches of 4 windows of 16 (N = 64 rows) in flight
for p in fp32 bf16; do
    "$GPIPE" plan --model "$TMP/lm.json" --stages 1 --micro-batches 2 --batch 8 --remat none \
        --gflops 10 --precision $p --report "$TMP/plan_$p.json" >/dev/null 2>"$TMP/plan.err" ||
        bad "plan --precision $p: $(tail -c 400 "$TMP/plan.err")"
done

python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
act = {p: json.load(open(f"{d}/plan_{p}.json"))["pipeline"]["cells"][0]["peak_bytes"]["activations"]
       for p in ("fp32", "bf16")}
# ln1(x), att, ln2(h) (64 x 16 each) and gelu(u) (64 x 32) kept in bf16: 2 bytes less an
# element, in 2 blocks for 2 micro-batches: 2 x 64 x 80 x 4 = 40960
need(act["fp32"] - act["bf16"] == 40960,
     f"plan's activations fp32 {act['fp32']} - bf16 {act['bf16']} != 40960")
r = {n: json.load(open(f"{d}/{n}.json"))
     for n in ("fp32", "one", "k2", "b1", "b2", "tp", "tp32", "off", "k2off", "tpoff")}
for a, b in (("one", "off"), ("k2", "k2off"), ("tp", "tpoff")):
    need(r[a]["params_fnv1a64"] == r[b]["params_fnv1a64"] and
         r[a]["train"]["step_losses"] == r[b]["train"]["step_losses"],
         f"{a} with the bf16 weight copy vs without: params {r[a]['params_fnv1a64']} vs "
         f"{r[b]['params_fnv1a64']}, losses {r[a]['train']['step_losses']} vs "
         f"{r[b]['train']['step_losses']}")
# the copy: 2 blocks' qkv (48 x 16), proj (16 x 16), fc (32 x 16), mlp proj (16 x 32) and the
# head's 256 x 16 weight, 2 bytes an element: 2 x (2 x 2048 + 4096) = 16384
copy = 16384
par = {n: r[n]["memory"]["peak_bytes"]["parameters"] for n in ("fp32", "one", "off")}
need(par["one"] - par["off"] == copy and par["off"] == par["fp32"],
     f"train's parameter bytes: bf16 {par['one']}, without the copy {par['off']}, fp32 "
     f"{par['fp32']}; expected the copy's {copy} more in bf16 alone")
pp = {p: json.load(open(f"{d}/plan_{p}.json"))["pipeline"]["cells"][0]["peak_bytes"]["parameters"]
      for p in ("fp32", "bf16")}
need(pp["bf16"] - pp["fp32"] == copy and pp["bf16"] == par["one"],
     f"plan's parameter bytes: bf16 {pp['bf16']}, fp32 {pp['fp32']}; expected the copy's {copy} "
     f"more, as train measured ({par['one']})")
need(r["tp"]["params_fnv1a64"] == r["tp32"]["params_fnv1a64"] and
     r["tp"]["train"]["step_losses"] == r["tp32"]["train"]["step_losses"],
     f"2 x 2 shards, activations in bf16 vs kept fp32: params {r['tp']['params_fnv1a64']} vs "
     f"{r['tp32']['params_fnv1a64']}, losses {r['tp']['train']['step_losses']} vs "
     f"{r['tp32']['train']['step_losses']}")
need(r["fp32"]["precision"] == "fp32", f"fp32: report's precision {r['fp32']['precision']}")
for n in ("one", "k2", "b1", "b2"):
    need(r[n]["precision"] == "bf16", f"{n}: report's precision {r[n]['precision']}")
need(r["k2"]["params_fnv1a64"] == r["one"]["params_fnv1a64"],
     f"bf16 on 2 stages: params {r['k2']['params_fnv1a64']} != one device's "
     f"{r['one']['params_fnv1a64']}")
need(r["one"]["params_fnv1a64"] != r["fp32"]["params_fnv1a64"],
     "bf16 gave fp32's parameters: the option changed nothing")
need(r["k2"]["train"]["step_losses"] == r["one"]["train"]["step_losses"],
     f"bf16 losses on 2 stages {r['k2']['train']['step_losses']} vs one device's "
     f"{r['one']['train']['step_losses']}")
finish("FAIL: precision:")
PY
cli_finish precision
