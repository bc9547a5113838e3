#!/usr/bin/env bash
# Every schedule on this machine's two cores: `gpipe bench` of T2 and C1 (WORKLOADS.md) with
# K = 2 stages at M = 4 and 8 micro-batches for gpipe, 1f1b, zbh1, interleaved (V = 2) and zbv
# (remat none, one thread per stage), beside K = 1 at the same M: throughput, speed-up over
# K = 1, and the last step's bubble measured / in theory ((K-1)/(M+K-1), interleaved
# (K-1)/(VM+K-1)) / simulated from the cells' mean times / replayed from its measured actions. Usage: bash bench/run_schedules.sh [path/to/gpipe] (reports go to
# ${GP_BENCH_OUT:-out/schedules}); GP_BENCH_STEPS (5) and GP_BENCH_WARMUP (2).
set -eu
GPIPE=${1:-build/gpipe}
STEPS=${GP_BENCH_STEPS:-5}
WARMUP=${GP_BENCH_WARMUP:-2}
OUT=${GP_BENCH_OUT:-out/schedules}
mkdir -p "$OUT"
one() { # one NAME WORKLOAD ARGS...
    local name=$1 w=$2
    shift 2
    echo "== gpipe bench --workload $w $* --steps $STEPS --warmup $WARMUP" >&2
    "$GPIPE" bench --workload "$w" "$@" --steps "$STEPS" --warmup "$WARMUP" --quiet \
        --report "$OUT/$name.json" >&2
}
for W in C1 T2; do
    for M in 4 8; do
        one "${W}_k1_m$M" "$W" --stages 1 --micro-batches "$M" --remat none --threads 1
        for S in gpipe 1f1b zbh1 interleaved zbv; do
            one "${W}_k2_m${M}_$S" "$W" --stages 2 --micro-batches "$M" --schedule "$S" \
                --remat none --threads 1
        done
    done
done
python3 - "$OUT" <<'PY'
import json, os, sys
d = sys.argv[1]
def load(name):
    return json.load(open(os.path.join(d, name + ".json")))
def rate(r):
    t = r["throughput"]
    return t.get("tokens_per_s") or t.get("images_per_s") or t.get("examples_per_s")
print("| workload | M | K | schedule | throughput | speed-up over K = 1 | bubble measured / theory / simulated / replayed |")
print("|---|---|---|---|---|---|---|")
for w, unit in (("C1", "images/s"), ("T2", "tokens/s")):
    for m in (4, 8):
        base = load(f"{w}_k1_m{m}")
        b = rate(base)
        print(f"| {w} | {m} | 1 | - | {b:.1f} {unit} | 1.00x | - |")
        for s in ("gpipe", "1f1b", "zbh1", "interleaved", "zbv"):
            r = load(f"{w}_k2_m{m}_{s}")
            p = r["pipeline"]
            print(f"| {w} | {m} | 2 | {s} | {rate(r):.1f} {unit} | {rate(r) / b:.2f}x | "
                  f"{p['bubble_measured']:.3f} / {p['bubble_theory']:.3f} / "
                  f"{p['bubble_simulated']:.3f} / {p.get('bubble_replayed', float('nan')):.3f} |")
PY
