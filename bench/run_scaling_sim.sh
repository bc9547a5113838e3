#!/usr/bin/env bash
# Pipeline scaling to K = 8 stages, simulated: T2 and a 64-block T2 (WORKLOADS.md) with K = 1, 2,
# 4, 8 stage devices at M = 8 and 32, each schedule's fastest plan (over the remat modes;
# interleaved with V = 2) from
# `gpipe plan --devices K --data-parallel 1 --balance time`: every layer's forward and backward
# timed on this machine (one thread, at the micro-batch size), then the cells balanced and the
# schedule simulated with those times (the optimizer step and the links not modelled); the
# speed-up divides the work of the same plan search's gpipe plan (M x every cell's forward and
# backward, by the same layer times: what one device would take) by the step, so that every
# speed-up of a row comes from one profile. For a
# machine with too few cores to run K = 8 stages; run it where they can be measured, beside
# bench/run_t2.sh. Usage: bash bench/run_scaling_sim.sh [path/to/gpipe] (reports go to
# ${GP_BENCH_OUT:-out/scaling_sim}).
set -eu
GPIPE=${1:-build/gpipe}
OUT=${GP_BENCH_OUT:-out/scaling_sim}
mkdir -p "$OUT"
printf '{"family": "transformer", "vocab": 256, "dim": 256, "heads": 4, "d_ff": 1024, "layers": 64, "seq_len": 128}\n' \
    >"$OUT/t2_64.json"
for model in examples/t2.json "$OUT/t2_64.json"; do
    name=$(basename "$model" .json)
    for M in 8 32; do
        for K in 1 2 4 8; do
            echo "== gpipe plan --model $model --devices $K --data-parallel 1 --micro-batches $M --batch 32 --balance time" >&2
            "$GPIPE" plan --model "$model" --devices "$K" --data-parallel 1 --micro-batches "$M" \
                --batch 32 --balance time --threads 1 --top 60 \
                --report "$OUT/${name}_m${M}_k$K.json" >/dev/null
        done
    done
done
python3 - "$OUT" <<'PY'
import json, os, sys
d = sys.argv[1]
print("| model | M | K | schedule | simulated step | speed-up over K = 1 | bubble simulated / theory |")
print("|---|---|---|---|---|---|---|")
for name, label in (("t2", "T2 (32 blocks)"), ("t2_64", "T2, 64 blocks")):
    for m in (8, 32):
        base = None
        for k in (1, 2, 4, 8):
            plans = json.load(open(os.path.join(d, f"{name}_m{m}_k{k}.json")))["search"]["plans"]
            best = {}
            for p in plans:
                s = p["schedule"]
                if s not in best or p["step_s"] < best[s]["step_s"]:
                    best[s] = p
            # one device's time for the work, from this search's own layer times
            base = min(p["work_s"] for p in plans if p["schedule"] == "gpipe")
            for s in ("gpipe", "1f1b", "zbh1", "interleaved", "zbv"):
                if s not in best:
                    continue
                p = best[s]
                v = p.get("chunks", 1)
                theory = (k - 1) / (v * m + k - 1)  # (K-1)/(M+K-1); interleaved (K-1)/(VM+K-1)
                sched = s if v == 1 or s == "zbv" else f"{s} V={v}"
                print(f"| {label} | {m} | {k} | {sched} ({p['remat']}) | {p['step_s']:.2f} s | "
                      f"{base / p['step_s']:.2f}x | {p['bubble_simulated']:.3f} / {theory:.3f} |")
PY
