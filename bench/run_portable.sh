#!/usr/bin/env bash
# The portable build (what `make install` builds: no -march=native, its CPU kernels compiled for
# several instruction sets and one chosen at start) against the native build (-march=native),
# on C1 (2 threads), T1 (1 thread) and the Fashion demo's model and options (the demo-fashion
# target of the Makefile) for a fixed number of steps: each workload run with one build, then
# the other, for a number of rounds (a shared machine drifts: alternating puts both under the
# same drift; the order flips every round). Prints a markdown table of the medians over rounds,
# the ratio of the medians and the median of each round's ratio (portable / native), of the
# throughput and of the CPU seconds the steps took (every thread's: on a machine other
# processes load, the work done, which their load hardly moves; native / portable, so that
# above 1 is the portable build faster either way).
# Usage: bash bench/run_portable.sh [NATIVE_GPIPE [PORTABLE_GPIPE]]
#   NATIVE_GPIPE defaults to build/gpipe (make build); without PORTABLE_GPIPE the portable
#   build is configured and built in ${INSTALL_BUILD:-build-install} as `make install` does.
#   GP_PORTABLE_ROUNDS (5), GP_BENCH_STEPS (10) and GP_BENCH_WARMUP (3) of C1 and T1,
#   GP_FASHION_STEPS (60); reports in ${GP_BENCH_OUT:-out/portable}.
set -eu
NATIVE=${1:-build/gpipe}
PORTABLE=${2:-}
ROUNDS=${GP_PORTABLE_ROUNDS:-5}
STEPS=${GP_BENCH_STEPS:-10}
WARMUP=${GP_BENCH_WARMUP:-3}
FASHION_STEPS=${GP_FASHION_STEPS:-60}
OUT=${GP_BENCH_OUT:-out/portable}

if [ ! -x "$NATIVE" ]; then
    echo "bench/run_portable.sh: no gpipe at '$NATIVE' (make build first, or pass its path)" >&2
    exit 2
fi
if [ -z "$PORTABLE" ]; then
    dir=${INSTALL_BUILD:-build-install}
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DGP_NATIVE=OFF -DGP_BUILD_TESTS=OFF >&2
    cmake --build "$dir" -j "$(nproc 2>/dev/null || echo 2)" --target gpipe >&2
    PORTABLE=$dir/gpipe
fi
mkdir -p "$OUT"
echo "native:   $("$NATIVE" --version | head -n 1)" >&2
echo "portable: $("$PORTABLE" --version | head -n 1)" >&2

# name|command: the same arguments for both builds.
CASES=("c1|bench --workload C1 --threads 2 --steps $STEPS --warmup $WARMUP --quiet"
       "t1|bench --workload T1 --threads 1 --steps $STEPS --warmup $WARMUP --quiet"
       "fashion|train --model examples/resnet_fashion.json --stages 2 --batch 32 --micro-batches 4
        --remat none --schedule zbv --steps $FASHION_STEPS --lr 0.1 --lr-schedule cosine
        --warmup 800 --weight-decay 5e-4 --augment flip --erase 0.5 --label-smoothing 0.1
        --eval-size 32 --quiet")
for r in $(seq 1 "$ROUNDS"); do
    order="native portable"
    [ $((r % 2)) = 0 ] && order="portable native"
    for c in "${CASES[@]}"; do
        name=${c%%|*}
        read -r -a args <<<"$(echo ${c#*|})"
        for side in $order; do
            bin=$NATIVE
            [ "$side" = portable ] && bin=$PORTABLE
            echo "== round $r/$ROUNDS: $side $name" >&2
            "$bin" "${args[@]}" --report "$OUT/${name}_${side}_$r.json" >/dev/null
        done
    done
done

python3 - "$OUT" "$ROUNDS" "$NATIVE" "$PORTABLE" <<'PY'
import json, statistics, sys
out, rounds, native, portable = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def figures(rep):
    """(throughput per wall second, CPU seconds per step or over the run's steps)"""
    t = rep["throughput"]
    if "step_cpu_seconds" in rep:
        return t.get("tokens_per_s", t["examples_per_s"]), rep["step_cpu_seconds"]["median"]
    return t["examples_per_s"], rep["train"]["cpu_seconds"]
first = json.load(open(f"{out}/c1_native_1.json"))
kernels = {s: json.load(open(f"{out}/c1_{s}_1.json")).get("cpu_isa", "not reported")
           for s in ("native", "portable")}
print(f"native = {native} (CPU kernels {kernels['native']}), portable = {portable} "
      f"(CPU kernels {kernels['portable']}); BLAS core {first['blas_core']}; "
      f"medians of {rounds} alternating rounds\n")
print("| workload | native per s | portable per s | portable / native: wall, medians "
      "| median of the rounds' ratios (min-max) | CPU time: native / portable, medians "
      "| median of the rounds' ratios (min-max) |")
print("|---|---:|---:|---:|---:|---:|---:|")
med = statistics.median
for name, label in (("c1", "C1, 2 threads, images"), ("t1", "T1, 1 thread, tokens"),
                    ("fashion", "Fashion demo model, 2 stages, images")):
    n = [figures(json.load(open(f"{out}/{name}_native_{r}.json"))) for r in range(1, rounds + 1)]
    p = [figures(json.load(open(f"{out}/{name}_portable_{r}.json"))) for r in range(1, rounds + 1)]
    wall = [b[0] / a[0] for a, b in zip(n, p)]
    cpu = [a[1] / b[1] for a, b in zip(n, p)]
    print(f"| {label} | {med(x[0] for x in n):.1f} | {med(x[0] for x in p):.1f} "
          f"| {med(x[0] for x in p) / med(x[0] for x in n):.3f} "
          f"| {med(wall):.3f} ({min(wall):.3f}-{max(wall):.3f}) "
          f"| {med(x[1] for x in n) / med(x[1] for x in p):.3f} "
          f"| {med(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f}) |")
PY
