#!/usr/bin/env bash
# `gpipe train --plan auto` on T2 of WORKLOADS.md (examples/t2.json): the plan search's chosen
# plan, its predicted step beside the median measured one, with the layers' times from FLOP
# estimates at the sgemm rate and measured layer by layer at each micro-batch size (--balance
# time). Usage: bash bench/run_plan_auto.sh [path/to/gpipe] [devices] (reports go to
# ${GP_BENCH_OUT:-out/plan_auto}); GP_BENCH_STEPS (8) steps each, memory limit
# ${GP_BENCH_LIMIT:-none}.
set -eu
GPIPE=${1:-build/gpipe}
DEVICES=${2:-2}
STEPS=${GP_BENCH_STEPS:-8}
OUT=${GP_BENCH_OUT:-out/plan_auto}
LIMIT=${GP_BENCH_LIMIT:-}
mkdir -p "$OUT"
for balance in time cost; do
    echo "== gpipe train --model examples/t2.json --plan auto --devices $DEVICES --balance $balance ${LIMIT:+--memory-limit $LIMIT}" >&2
    "$GPIPE" train --model examples/t2.json --plan auto --devices "$DEVICES" --balance "$balance" \
        ${LIMIT:+--memory-limit "$LIMIT"} --steps "$STEPS" --batch 32 --eval-size 8 --quiet \
        --report "$OUT/$balance.json" >"$OUT/$balance.out"
done
python3 - "$OUT" <<'PY'
import json, sys
print("| layer times | chosen plan (K, M, schedule, remat) | predicted step | measured step (median) | measured / predicted |")
print("|---|---|---|---|---|")
for balance, what in (("time", "measured per micro-batch size"), ("cost", "FLOPs at the sgemm rate")):
    r = json.load(open(f"{sys.argv[1]}/{balance}.json"))
    pa = r["plan_auto"]
    b = pa["plans"][0]
    print(f"| {what} | K={b['stages']} M={b['micro_batches']} {b['schedule']} {b['remat']} | "
          f"{pa['predicted_step_s']:.3f} s | {pa['measured_step_s']:.3f} s | "
          f"{pa['measured_step_s'] / pa['predicted_step_s']:.3f} |")
PY
