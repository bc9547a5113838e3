#!/usr/bin/env bash
# Pipeline scaling to K = 8 stages, measured: `gpipe bench --workload T2` with K = 1,
# 2, 4, 8 stages of one thread each (pinned one per physical core, --pin auto), no
# re-materialization, at M = 32 and 8, on the schedules that matter at each K, then the 64-block T2 at M = 32. For a
# machine with 8 cores or more (run_t2.sh and run_schedules.sh cover K = 2 on two cores;
# run_scaling_sim.sh simulates these rows where they cannot be run). Each run appends one line to
# $OUT/rows.tsv as soon as it ends (a run cut short keeps the rows before it), and the table at
# the end gives tokens/s, the speed-up over K = 1 of the same model and M, the bubble
# measured / theory / simulated / replayed, and the sgemm ceiling of the K busy cores (one
# 2048^3 sgemm over all K stage threads at once after each step) with the step's fraction of it:
# the last column, that ceiling over K times one core's alone (timed right after), is what the
# cores lose by working together (the all-core clock, shared caches and memory).
# Usage: bash bench/run_scaling_k8.sh [path/to/gpipe] (reports go to ${GP_BENCH_OUT:-out/k8});
# GP_BENCH_STEPS (2) timed steps after GP_BENCH_WARMUP (1).
set -eu
GPIPE=${1:-build/gpipe}
STEPS=${GP_BENCH_STEPS:-2}
WARMUP=${GP_BENCH_WARMUP:-1}
OUT=${GP_BENCH_OUT:-out/k8}
mkdir -p "$OUT"
cores=$(nproc)
if [ "$cores" -lt 8 ]; then
    echo "run_scaling_k8.sh: $cores cores here; K = 8 stages of one thread need 8" >&2
    exit 1
fi
: >"$OUT/rows.tsv"

# one LAYERS M K SCHEDULE: one configuration, its report at $OUT/t2_<layers>_m<M>_k<K>_<S>.json
# and its line in rows.tsv.
one() {
    local layers=$1 M=$2 K=$3 S=$4
    local name="t2_${layers}_m${M}_k${K}_${S}"
    echo "== gpipe bench --workload T2 --layers $layers --stages $K --micro-batches $M --schedule $S" >&2
    if "$GPIPE" bench --workload T2 --layers "$layers" --stages "$K" --threads 1 \
        --micro-batches "$M" --schedule "$S" --remat none --steps "$STEPS" --warmup "$WARMUP" \
        --quiet --report "$OUT/$name.json" >&2; then
        python3 - "$OUT/$name.json" "$layers" "$M" "$K" "$S" >>"$OUT/rows.tsv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p = r.get("pipeline") or {}
print("\t".join(sys.argv[2:6] + [
    "%.1f" % r["throughput"]["tokens_per_s"],
    "%.3f" % r["step_seconds"]["median"],
    " / ".join("%.3f" % p.get("bubble_" + k, 0.0)
               for k in ("measured", "theory", "simulated", "replayed")),
    "%.1f" % r["ceiling_gflops"], "%.3f" % r["fraction_of_ceiling"],
    "%.3f" % r["ceiling_together_over_alone"] if "ceiling_together_over_alone" in r else "-"]))
PY
    else
        printf '%s\t%s\t%s\t%s\tfailed\t-\t-\t-\t-\t-\n' "$layers" "$M" "$K" "$S" >>"$OUT/rows.tsv"
    fi
}

# Which hardware threads share a physical core: stages are pinned one per physical core first
# (src/plan/cores.h), so this says which cores K stages ran on.
for c in /sys/devices/system/cpu/cpu[0-9]*; do
    printf '%s\t%s\n' "${c##*/}" "$(cat "$c/topology/thread_siblings_list" 2>/dev/null || echo '?')"
done | sort -V >"$OUT/siblings.tsv"

# In the order of what matters most, so that a run cut short keeps it: T2 (32 blocks) at M = 32,
# K = 1 and 8 on every schedule, then K = 2 and 4; the 64-block T2 at M = 32; then M = 8, where
# the bubble's share grows.
one 32 32 1 gpipe
one 32 32 8 zbh1
one 32 32 8 interleaved
one 32 32 8 zbv
one 32 32 8 1f1b
one 32 32 8 gpipe
one 32 32 2 zbh1
one 32 32 2 interleaved
one 32 32 4 zbh1
one 32 32 4 interleaved
one 64 32 1 gpipe
one 64 32 8 zbh1
one 64 32 8 interleaved
one 64 32 8 zbv
one 64 32 2 interleaved
one 64 32 4 interleaved
one 32 8 1 gpipe
one 32 8 8 zbv
one 32 8 8 zbh1
one 32 8 8 interleaved
one 32 32 4 zbv
one 32 32 4 gpipe

python3 - "$OUT/rows.tsv" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
base = {(r[0], r[1]): float(r[4]) for r in rows if r[2] == "1" and r[4] != "failed"}
print("| model | M | K | schedule | tokens/s | step s | speed-up over K = 1 | bubble measured / theory / simulated / replayed | ceiling GFLOP/s (K cores at once) | fraction of it | ceiling at once / K x one core alone |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for layers, M, K, S, tps, step, bub, ceiling, frac, together in rows:
    key = (layers, M)
    up = "%.2fx" % (float(tps) / base[key]) if tps != "failed" and key in base else "-"
    print("| T2 (%s blocks) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
          % (layers, M, K, S, tps, step, up, bub, ceiling, frac, together))
PY
