#!/usr/bin/env bash
# `gpipe train --plan auto --devices N` with its default prediction (the plan search by FLOPs and
# the runtime's measured cost per action, the chosen plan then timed again on its layers measured
# at its micro-batch size) on T2 (examples/t2.json) and C1 (the convnet): the chosen plan, its
# predicted step beside the median measured one, their ratio, and what the calibration cost.
# Usage: bash bench/run_plan_accuracy.sh [path/to/gpipe] [devices] [rounds]; reports go to
# ${GP_BENCH_OUT:-out/plan_accuracy}; GP_BENCH_STEPS (T2: 4, C1: 8) steps each; the machine's
# load average is printed before each run (a shared machine's load moves the measured step).
set -eu
GPIPE=${1:-build/gpipe}
DEVICES=${2:-2}
ROUNDS=${3:-1}
OUT=${GP_BENCH_OUT:-out/plan_accuracy}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
    for w in T2 C1; do
        if [ "$w" = T2 ]; then
            args=(--model examples/t2.json --batch 32 --eval-size 8 --steps "${GP_BENCH_STEPS:-4}")
        else
            args=(--model convnet --batch 128 --eval-size 128 --steps "${GP_BENCH_STEPS:-8}")
        fi
        echo "== round $r $w: load $(cut -d' ' -f1-3 /proc/loadavg): $GPIPE train ${args[*]} --plan auto --devices $DEVICES" >&2
        "$GPIPE" train "${args[@]}" --plan auto --devices "$DEVICES" --quiet \
            --report "$OUT/${w}_$r.json" >"$OUT/${w}_$r.out"
        grep "^plan auto: " "$OUT/${w}_$r.out" >&2
    done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("| workload | round | chosen plan (K, M, V, schedule, remat) | by FLOPs | predicted step | measured step (median) | measured / predicted | calibration |")
print("|---|---|---|---|---|---|---|---|")
for w in ("T2", "C1"):
    for r in range(1, rounds + 1):
        pa = json.load(open(f"{out}/{w}_{r}.json"))["plan_auto"]
        b = pa["plans"][0]
        print(f"| {w} | {r} | K={b['stages']} M={b['micro_batches']} V={b.get('chunks', 1)} {b['schedule']} {b['remat']} | "
              f"{pa.get('flop_step_s', 0):.3f} s | {pa['predicted_step_s']:.3f} s | {pa['measured_step_s']:.3f} s | "
              f"{pa['measured_step_s'] / pa['predicted_step_s']:.3f} | {pa.get('calibration_s', 0):.2f} s |")
PY
