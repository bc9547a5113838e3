#!/usr/bin/env bash
# The portable build (what `make install` builds: no -march=native, its CPU kernels compiled for
# several instruction sets and one chosen at start) against the native build (-march=native),
# on C1 (2 threads), T1 (1 thread) and the Fashion demo's model and options (the demo-fashion
# target of the Makefile) for a fixed number of steps: each workload run with one build, then
# the other, for a number of rounds (a shared machine drifts: alternating puts both under the
# same drift; the order flips every round). Prints a markdown table of the medians over rounds,
# the ratio of the medians and the median of each round's ratio (portable / native).
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
        --remat none --schedule zbh1 --steps $FASHION_STEPS --lr 0.1 --lr-schedule cosine
        --warmup 800 --weight-decay 5e-4 --augment flip --erase 0.5 --eval-size 32 --quiet")
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
def rate(rep):
    t = rep["throughput"]
    return t.get("tokens_per_s", t["examples_per_s"])
first = json.load(open(f"{out}/c1_native_1.json"))
kernels = {s: json.load(open(f"{out}/c1_{s}_1.json"))["cpu_isa"] for s in ("native", "portable")}
print(f"native = {native} (CPU kernels {kernels['native']}), portable = {portable} "
      f"(CPU kernels {kernels['portable']}); BLAS core {first['blas_core']}; "
      f"medians of {rounds} alternating rounds\n")
print("| workload | native per s | portable per s | portable / native (medians) "
      "| median of the rounds' ratios | rounds' ratios min-max |")
print("|---|---:|---:|---:|---:|---|")
for name, label in (("c1", "C1, 2 threads, images"), ("t1", "T1, 1 thread, tokens"),
                    ("fashion", "Fashion demo model, 2 stages, images")):
    n = [rate(json.load(open(f"{out}/{name}_native_{r}.json"))) for r in range(1, rounds + 1)]
    p = [rate(json.load(open(f"{out}/{name}_portable_{r}.json"))) for r in range(1, rounds + 1)]
    ratios = [b / a for a, b in zip(n, p)]
    print(f"| {label} | {statistics.median(n):.1f} | {statistics.median(p):.1f} "
          f"| {statistics.median(p) / statistics.median(n):.3f} | {statistics.median(ratios):.3f} "
          f"| {min(ratios):.3f}-{max(ratios):.3f} |")
PY
