#!/usr/bin/env bash
# Two builds of gpipe side by side in one run, for a change that must not cost speed: T1 and C1
# on one thread, and T2 on K = 2 pipeline stages with M = 8, each workload run alternately with
# build A and build B for a few rounds (a shared machine drifts: alternating puts both builds
# under the same drift). Prints a markdown table: the median over rounds of tokens (or images)
# per second and of the fraction of the sgemm ceiling each run measured in its own process,
# and B's throughput relative to A's.
# Usage: bash bench/run_ab.sh path/to/gpipe-A path/to/gpipe-B
#   GP_AB_ROUNDS (3), GP_BENCH_STEPS (5), GP_BENCH_WARMUP (2); reports in ${GP_BENCH_OUT:-out/ab}.
set -eu
if [ $# -ne 2 ]; then
    echo "usage: bash bench/run_ab.sh path/to/gpipe-A path/to/gpipe-B" >&2
    exit 2
fi
A=$1
B=$2
ROUNDS=${GP_AB_ROUNDS:-3}
STEPS=${GP_BENCH_STEPS:-5}
WARMUP=${GP_BENCH_WARMUP:-2}
OUT=${GP_BENCH_OUT:-out/ab}
mkdir -p "$OUT"
CASES=("t1|--workload T1 --threads 1" "t2k2m8|--workload T2 --stages 2 --micro-batches 8"
       "c1|--workload C1 --threads 1")
for r in $(seq 1 "$ROUNDS"); do
    for c in "${CASES[@]}"; do
        name=${c%%|*}
        read -r -a args <<<"${c#*|}"
        for side in A B; do
            bin=$A
            [ "$side" = B ] && bin=$B
            echo "== round $r: $side $name: $bin bench ${args[*]}" >&2
            "$bin" bench "${args[@]}" --steps "$STEPS" --warmup "$WARMUP" --quiet \
                --report "$OUT/${name}_${side}_$r.json" >/dev/null
        done
    done
done
python3 - "$OUT" "$ROUNDS" "$A" "$B" <<'PY'
import json, statistics, sys
out, rounds, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def figures(name, side):
    tp, frac = [], []
    for r in range(1, rounds + 1):
        rep = json.load(open(f"{out}/{name}_{side}_{r}.json"))
        t = rep["throughput"]
        tp.append(t.get("tokens_per_s", t["examples_per_s"]))
        frac.append(rep["fraction_of_ceiling"])
    return statistics.median(tp), statistics.median(frac)
print(f"A = {a}, B = {b}; medians of {rounds} alternating rounds\n")
print("| workload | A per s | A of ceiling | B per s | B of ceiling | B / A |")
print("|---|---|---|---|---|---|")
for name, label in (("t1", "T1, 1 thread, tokens"), ("t2k2m8", "T2, K = 2, M = 8, tokens"),
                    ("c1", "C1, 1 thread, images")):
    ta, fa = figures(name, "A")
    tb, fb = figures(name, "B")
    print(f"| {label} | {ta:.0f} | {fa:.3f} | {tb:.0f} | {fb:.3f} | {tb / ta:.3f} |")
PY
