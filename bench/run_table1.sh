#!/usr/bin/env bash
# Our version of the GPipe paper's Table 1: the largest T2-style Transformer (d_model 256, 4
# heads, d_ff 1024, sequences of 128, batch 32, AdamW) that trains under a per-device memory
# limit with K = 1 without re-materialization, K = 1 with it, and K = 2, 4, 8 stages (threads may
# outnumber cores: only memory is measured here). For each configuration the planner's memory
# model proposes the most layers (`gpipe plan`), then real training steps decide: one step of
# `gpipe bench --workload T2 --layers L --memory-limit LIMIT` at that L, then L + 1, L + 2, ...
# while it trains, or L - 1, L - 2, ... while it does not. Then the per-stage peak activation
# bytes for remat none vs cell as M grows (K = 2, 32 layers), measured beside the planner's
# memory model, which is the O(N + (L/K)(N/M)) formula with this model's constants.
# Then the rows of K = 2 and 4 again with one MPI process per stage (when gpipe was built with
# MPI), at the largest L found on threads: each rank's peak resident set (getrusage) beside the
# bytes its stage device counted, since under MPI a rank holds its own stage and nothing more.
# Usage: bash bench/run_table1.sh [path/to/gpipe] (reports in ${GP_BENCH_OUT:-out/table1});
# GP_TABLE1_LIMIT (256MiB), GP_TABLE1_M (8 micro-batches), GP_MPIRUN (mpirun --oversubscribe:
# the ranks may outnumber the cores, only memory is measured).
set -eu
GPIPE=${1:-build/gpipe}
OUT=${GP_BENCH_OUT:-out/table1}
LIMIT=${GP_TABLE1_LIMIT:-256MiB}
M=${GP_TABLE1_M:-8}
mkdir -p "$OUT"

model() { # model L: a T2-style model file with L blocks
    local f="$OUT/t2_L$1.json"
    [ -e "$f" ] || printf '{"family": "transformer", "vocab": 256, "dim": 256, "heads": 4, "d_ff": 1024, "layers": %d, "seq_len": 128, "dropout": 0.0}\n' "$1" >"$f"
    echo "$f"
}

# Threads per stage device: the training steps' default (the cores shared among the K stages),
# given to the planner too, since each thread has its own attention workspace.
CORES=$(nproc)
per_stage() { local t=$((CORES / $1)); echo $((t > 0 ? t : 1)); }

# planned K REMAT: the most blocks the planner fits under the limit (0: none).
planned() {
    local k=$1 r=$2 L=$1 best=0
    while "$GPIPE" plan --model "$(model "$L")" --stages "$k" --micro-batches "$M" --batch 32 \
        --remat "$r" --memory-limit "$LIMIT" --threads "$(per_stage "$k")" --gflops 50 \
        >/dev/null 2>&1; do
        best=$L
        L=$((L + 1))
    done
    echo "$best"
}

# trains K REMAT L: one training step fits under the limit (report kept as NAME_L.json).
trains() {
    local k=$1 r=$2 L=$3 name="k$1_$2_L$3"
    [ "$L" -ge "$k" ] || return 1
    echo "== gpipe bench --workload T2 --layers $L --stages $k --micro-batches $M --remat $r --memory-limit $LIMIT --threads $(per_stage "$k")" >&2
    if "$GPIPE" bench --workload T2 --layers "$L" --stages "$k" --micro-batches "$M" --remat "$r" \
        --memory-limit "$LIMIT" --threads "$(per_stage "$k")" --steps 1 --warmup 0 --quiet \
        --report "$OUT/$name.json" \
        >"$OUT/$name.out" 2>"$OUT/$name.err"; then
        echo "   trains" >&2
        return 0
    fi
    grep -q -i "limit" "$OUT/$name.err" || {
        echo "unexpected failure (not the memory limit): $(cat "$OUT/$name.err")" >&2
        exit 1
    }
    echo "   over the limit: $(tail -c 240 "$OUT/$name.err" | tr '\n' ' ')" >&2
    rm -f "$OUT/$name.json"
    return 1
}

: >"$OUT/largest.txt"
for cfg in "1 none" "1 cell" "2 cell" "4 cell" "8 cell"; do
    set -- $cfg
    k=$1 r=$2
    L=$(planned "$k" "$r")
    [ "$L" -ge "$k" ] || L=$k
    if trains "$k" "$r" "$L"; then
        while trains "$k" "$r" $((L + 1)); do L=$((L + 1)); done
    else
        L=$((L - 1))
        while [ "$L" -ge "$k" ] && ! trains "$k" "$r" "$L"; do L=$((L - 1)); done
    fi
    echo "$k $r $L $(planned "$k" "$r")" >>"$OUT/largest.txt"
done

# The K = 2 and 4 rows as MPI processes, at the L the threads found.
read -r -a MPIRUN <<<"${GP_MPIRUN:-mpirun --oversubscribe}"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
: >"$OUT/mpi_rows.txt"
if "$GPIPE" bench --workload T2 --launcher mpi --stages 2 2>&1 >/dev/null |
    grep -q "MPI support was not built"; then
    echo "bench/run_table1.sh: the MPI rows skipped: $GPIPE was built without MPI" >&2
else
    for k in 2 4; do
        L=$(awk -v k="$k" '$1 == k && $2 == "cell" {print $3}' "$OUT/largest.txt")
        echo "== ${MPIRUN[*]} -np $k gpipe bench --workload T2 --layers $L --stages $k --micro-batches $M --remat cell --memory-limit $LIMIT" >&2
        "${MPIRUN[@]}" -np "$k" "$GPIPE" bench --workload T2 --layers "$L" --stages "$k" \
            --micro-batches "$M" --remat cell --memory-limit "$LIMIT" --steps 1 --warmup 0 --quiet \
            --report "$OUT/mpi_k${k}_L$L.json" >/dev/null
        echo "$k $L" >>"$OUT/mpi_rows.txt"
    done
fi

# Peak activation bytes per stage, K = 2, 32 blocks, remat none vs cell, M = 1..32.
for r in none cell; do
    for m in 1 2 4 8 16 32; do
        echo "== gpipe bench --workload T2 --stages 2 --micro-batches $m --remat $r (activations)" >&2
        "$GPIPE" bench --workload T2 --stages 2 --micro-batches "$m" --remat "$r" --steps 1 \
            --warmup 0 --quiet --report "$OUT/act_${r}_m$m.json" >/dev/null
        "$GPIPE" plan --model "$(model 32)" --stages 2 --micro-batches "$m" --batch 32 \
            --remat "$r" --gflops 50 --report "$OUT/plan_${r}_m$m.json" >/dev/null
    done
done

python3 - "$OUT" "$LIMIT" "$M" <<'PY'
import json, os, sys
d, limit, M = sys.argv[1], sys.argv[2], sys.argv[3]
MiB = 1 << 20
rows = [l.split() for l in open(os.path.join(d, "largest.txt")) if l.strip()]
print(f"Largest T2-style model under {limit} per device (batch 32, M = {M}, AdamW):\n")
print("| configuration | Transformer blocks (layers) | parameters | ratio to the first row that fits | planner's estimate (blocks) | peak bytes of the fullest stage |")
print("|---|---|---|---|---|---|")
base = None
for k, r, L, plan in rows:
    k, L = int(k), int(L)
    name = f"K = {k}, " + ("no re-materialization" if r == "none" else "re-materialization")
    rep = os.path.join(d, f"k{k}_{r}_L{L}.json")
    if L < k or not os.path.exists(rep):
        print(f"| {name} | none fits | - | - | {plan} | - |")
        continue
    j = json.load(open(rep))
    peak = max(s["total"] for s in j["pipeline"]["stage_peak_bytes"])
    base = base or L
    print(f"| {name} | {L} ({L + 4}) | {j['nparams']:,} | {L / base:.2f}x | {plan} | {peak / MiB:.1f} MiB |")
mpi_rows = [l.split() for l in open(os.path.join(d, "mpi_rows.txt")) if l.strip()]
if mpi_rows:
    print(f"\nThe same rows as MPI processes (one per stage), under {limit} per device: per rank, the "
          "peak bytes its stage device counted / the process's peak resident set (getrusage):\n")
    print("| configuration | blocks | parameters | " + " | ".join(f"rank {r}" for r in range(4)) + " |")
    print("|---|---|---|" + "---|" * 4)
    for k, L in mpi_rows:
        j = json.load(open(os.path.join(d, f"mpi_k{k}_L{L}.json")))
        stages = j["pipeline"]["stage_peak_bytes"]
        cells = [f"{stages[r]['total'] / MiB:.1f} / {j['rss_peak_bytes'][r] / MiB:.1f} MiB"
                 for r in range(int(k))]
        cells += ["-"] * (4 - len(cells))
        print(f"| K = {k}, MPI | {L} | {j['nparams']:,} | " + " | ".join(cells) + " |")
print("\nPeak activation bytes per stage (K = 2, 32 blocks, batch N = 32), measured / planner's model:\n")
print("| M | remat none: stage 0 | stage 1 | remat cell: stage 0 | stage 1 |")
print("|---|---|---|---|---|")
for m in (1, 2, 4, 8, 16, 32):
    cells = []
    for r in ("none", "cell"):
        a = json.load(open(os.path.join(d, f"act_{r}_m{m}.json")))["pipeline"]["stage_peak_bytes"]
        p = json.load(open(os.path.join(d, f"plan_{r}_m{m}.json")))["pipeline"]["cells"]
        for k in (0, 1):
            cells.append(f"{a[k]['activations'] / MiB:.1f} / {p[k]['peak_bytes']['activations'] / MiB:.1f} MiB")
    print(f"| {m} | " + " | ".join(cells) + " |")
PY
