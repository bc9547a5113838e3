#!/usr/bin/env bash
# T2 of WORKLOADS.md (pipeline scaling): tokens/s of `gpipe bench --workload T2`
# for K = 1 and 2 stages at M = 1, 4, 8, 32 with both schedules, plus K = 1
# without the pipeline on 2 BLAS threads, as a markdown table with the
# speed-up over K = 1 at the same M and the measured / theoretical / simulated
# bubble (--remat's default: selective, which T2 fits without recomputing); at M = 32
# also both K re-materializing every cell (--remat cell) and K = 2 with --pin off.
# Usage: bash bench/run_t2.sh [path/to/gpipe] (reports go to
# ${GP_BENCH_OUT:-out/t2}); GP_BENCH_STEPS (5) and GP_BENCH_WARMUP (2).
set -eu
GPIPE=${1:-build/gpipe}
STEPS=${GP_BENCH_STEPS:-5}
WARMUP=${GP_BENCH_WARMUP:-2}
OUT=${GP_BENCH_OUT:-out/t2}
mkdir -p "$OUT"

# one NAME ARGS...: one configuration, its report at $OUT/NAME.json.
one() {
    local name=$1
    shift
    echo "== gpipe bench --workload T2 $* --steps $STEPS --warmup $WARMUP" >&2
    "$GPIPE" bench --workload T2 "$@" --steps "$STEPS" --warmup "$WARMUP" --quiet \
        --report "$OUT/$name.json" >&2
}

for M in 1 4 8 32; do
    one "k1_m${M}" --stages 1 --micro-batches "$M"
    for S in gpipe 1f1b; do
        one "k2_m${M}_${S}" --stages 2 --micro-batches "$M" --schedule "$S"
    done
done
# At M = 32: every cell re-materialized (K = 1 and 2), and K = 2 with its threads not pinned.
one "k1_m32_cell" --stages 1 --micro-batches 32 --remat cell
for S in gpipe 1f1b; do
    one "k2_m32_${S}_cell" --stages 2 --micro-batches 32 --schedule "$S" --remat cell
    one "k2_m32_${S}_nopin" --stages 2 --micro-batches 32 --schedule "$S" --pin off
done
one "k1_threads2" --threads 2

python3 - "$OUT" <<'PY'
import json, os, sys
d = sys.argv[1]
def load(name):
    return json.load(open(os.path.join(d, name + ".json")))
def row(k, m, sched, r, base):
    tps = r["throughput"]["tokens_per_s"]
    p = r.get("pipeline")
    speed = f"{tps / base:.2f}x" if base else "-"
    bub = (f"{p['bubble_measured']:.3f} / {p['bubble_theory']:.3f} / {p['bubble_simulated']:.3f}"
           f" / {p.get('bubble_replayed', float('nan')):.3f}" if p else "-")
    print(f"| {k} | {m} | {sched} | {tps:.0f} | {speed} | {bub} |")
print("| K | M | schedule | tokens/s | speed-up over K=1 | bubble measured / theory / simulated / replayed |")
print("|---|---|---|---|---|---|")
for m in (1, 4, 8, 32):
    base = load(f"k1_m{m}")
    b = base["throughput"]["tokens_per_s"]
    row(1, m, base["pipeline"]["schedule"], base, b)
    for s in ("gpipe", "1f1b"):
        row(2, m, s, load(f"k2_m{m}_{s}"), b)
base = load("k1_m32_cell")
b = base["throughput"]["tokens_per_s"]
row("1, remat cell", 32, "gpipe", base, b)
for s in ("gpipe", "1f1b"):
    row("2, remat cell", 32, s, load(f"k2_m32_{s}_cell"), b)
b = load("k1_m32")["throughput"]["tokens_per_s"]
for s in ("gpipe", "1f1b"):
    row("2, not pinned", 32, s, load(f"k2_m32_{s}_nopin"), b)
t = load("k1_threads2")
print(f"| 1 (2 BLAS threads, no pipeline) | 1 | - | {t['throughput']['tokens_per_s']:.0f} | - | - |")
PY
