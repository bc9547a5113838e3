#!/usr/bin/env bash
# Runs the G1, T1 and C1 workloads of WORKLOADS.md on 1 and 2 threads, keeps
# one JSON report per run, and prints a markdown table of the results.
#   bash bench/run.sh [path/to/gpipe] [report-dir]     (defaults: build/gpipe, build/bench)
# Environment (defaults in brackets):
#   GP_BENCH_THREADS   thread counts to run        ["1 2"]
#   GP_BENCH_WORKLOADS workloads to run            ["G1 T1 C1"]
#   GP_BENCH_STEPS     timed steps of T1 and C1    [10]
#   GP_BENCH_WARMUP    warm-up steps of T1 and C1  [3]
#   GP_BENCH_G1_STEPS  timed sgemm calls per shape [5]
#   GP_BENCH_G1_WARMUP untimed sgemm calls first   [1]
set -euo pipefail
GPIPE=${1:-build/gpipe}
DIR=${2:-build/bench}
THREADS=${GP_BENCH_THREADS:-1 2}
WORKLOADS=${GP_BENCH_WORKLOADS:-G1 T1 C1}
STEPS=${GP_BENCH_STEPS:-10}
WARMUP=${GP_BENCH_WARMUP:-3}
G1_STEPS=${GP_BENCH_G1_STEPS:-5}
G1_WARMUP=${GP_BENCH_G1_WARMUP:-1}

if [ ! -x "$GPIPE" ]; then
    echo "bench/run.sh: no gpipe executable at '$GPIPE' (build first, or pass its path)" >&2
    exit 2
fi
mkdir -p "$DIR"
reports=()
for t in $THREADS; do
    for w in $WORKLOADS; do
        out="$DIR/$w-t$t.json"
        if [ "$w" = G1 ]; then
            args=(--steps "$G1_STEPS" --warmup "$G1_WARMUP")
        else
            args=(--steps "$STEPS" --warmup "$WARMUP")
        fi
        echo "== gpipe bench --workload $w --threads $t ${args[*]}" >&2
        "$GPIPE" bench --workload "$w" --threads "$t" "${args[@]}" --quiet --report "$out" >&2
        reports+=("$out")
    done
done

python3 - "${reports[@]}" <<'PY'
import json, sys

def mib(n):
    return f"{n / 2**20:.1f} MiB"

runs = [json.load(open(p)) for p in sys.argv[1:]]
host = {r.get("blas_core") for r in runs}
print(f"OpenBLAS core: {', '.join(sorted(host))}\n")
g1 = [r for r in runs if r["workload"] == "G1"]
if g1:
    print("| sgemm (G1) | threads | GFLOP/s median | min | max |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in g1:
        for s in r["sgemm"]:
            g = s["gflops"]
            print(f"| {s['name']} | {r['threads']} | {g['median']:.1f} | {g['min']:.1f} | {g['max']:.1f} |")
    print()
train = [r for r in runs if r["workload"] != "G1"]
if train:
    print("| workload | threads | throughput | step s median (min-max) | achieved GFLOP/s "
          "| sgemm ceiling GFLOP/s | fraction of ceiling | peak memory |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in train:
        th = r["throughput"]
        tput = (f"{th['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in th
                else f"{th['examples_per_s']:.1f} images/s")
        st = r["step_seconds"]
        print(f"| {r['workload']} (batch {r['batch']}) | {r['threads']} | {tput} "
              f"| {st['median']:.3f} ({st['min']:.3f}-{st['max']:.3f}) | {r['achieved_gflops']:.1f} "
              f"| {r['ceiling_gflops']:.1f} | {r['fraction_of_ceiling']:.3f} "
              f"| {mib(r['memory']['peak_bytes']['total'])} |")
PY
echo >&2
echo "reports in $DIR" >&2
