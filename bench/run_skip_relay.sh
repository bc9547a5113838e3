#!/usr/bin/env bash
# What relaying a skip through a stage costs: examples/dense_fashion.json on K = 3 with the
# partition 0,9,15, whose long skip (the pooled stem, layer 3, read by the concat at 15) rides
# through stage 1 (cut 9 and cut 15), against bench/skip_near.json, the same model and shapes
# with that concat reading layer 10 instead, so that its skip crosses cut 15 alone: what a direct
# send from the source's stage to the merge's would carry. Both runs alternate for a few rounds
# (a shared machine drifts). Prints the median training throughput of each and their ratio.
# Usage: bash bench/run_skip_relay.sh path/to/gpipe [FASHION_DIR]
#   GP_AB_ROUNDS (3), GP_BENCH_STEPS (40); reports in ${GP_BENCH_OUT:-out/skip_relay}.
set -eu
G=${1:?usage: bash bench/run_skip_relay.sh path/to/gpipe [FASHION_DIR]}
DATA=${2:-/usr/share/datasets/fashion-mnist}
ROUNDS=${GP_AB_ROUNDS:-3}
STEPS=${GP_BENCH_STEPS:-40}
OUT=${GP_BENCH_OUT:-out/skip_relay}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
    for side in relay near; do
        model=examples/dense_fashion.json
        [ "$side" = near ] && model=bench/skip_near.json
        echo "== round $r: $side ($model)" >&2
        "$G" train --model "$model" --data "$DATA" --stages 3 --partition 0,9,15 \
            --micro-batches 4 --batch 64 --steps "$STEPS" --eval-size 64 --threads 1 --quiet \
            --report "$OUT/${side}_$r.json" >/dev/null
    done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
med = {s: statistics.median(json.load(open(f"{out}/{s}_{r}.json"))["throughput"]["examples_per_s"]
                            for r in range(1, rounds + 1)) for s in ("relay", "near")}
print(f"medians of {rounds} alternating rounds, images/s of training")
print("| skip | images/s |\n|---|---|")
print(f"| relayed through stage 1 (dense_fashion.json) | {med['relay']:.1f} |")
print(f"| crossing one cut (skip_near.json) | {med['near']:.1f} |")
print(f"relayed / near: {med['relay'] / med['near']:.3f}")
PY
