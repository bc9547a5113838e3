#!/usr/bin/env bash
# What a checkpoint after every step costs T2 (WORKLOADS.md) on K = 2 stages of one thread each,
# M = 8 (2 cores): `gpipe train` on T2's model without checkpoints, with --checkpoint-every 1
# written in the background (the default), and with --checkpoint-sync, the three alternating in
# each round (a shared machine drifts: alternating puts them under the same drift, and each
# round's order rotates). A step's time is the wall time between consecutive --metrics lines
# (--log-every 1), which holds the step, its batch and the checkpoint's share at the boundary
# (copy, wait, or the synchronous write); each run's median after the warm-up steps, each
# round's ratio to the run without checkpoints, and the median over rounds. Prints a markdown
# table. The checkpoints go to ${GP_BENCH_OUT:-out/ckpt_async}/ck-*, on the disk that folder is on.
# Beside it, the share of the training thread's own time: what each save took from it (the copy
# and any wait, or the synchronous write) over the median step without checkpoints, less noisy
# on a shared machine than the step times themselves.
# Usage: bash bench/run_ckpt_async.sh [path/to/gpipe]
#   GP_CKPT_ROUNDS (3), GP_BENCH_STEPS (8), GP_BENCH_WARMUP (2); GP_CKPT_TABLE_ONLY=1: the table
#   of the runs already in the folder.
set -eu
GPIPE=${1:-build/gpipe}
ROUNDS=${GP_CKPT_ROUNDS:-3}
STEPS=${GP_BENCH_STEPS:-8}
WARMUP=${GP_BENCH_WARMUP:-2}
OUT=${GP_BENCH_OUT:-out/ckpt_async}
mkdir -p "$OUT"
T2=(--model "$(dirname "$0")/../examples/t2.json" --stages 2 --threads 1 --batch 32
    --micro-batches 8 --steps "$STEPS" --eval-size 1 --log-every 1 --quiet --seed 1)
MODES=(none background sync)
[ "${GP_CKPT_TABLE_ONLY:-0}" = 1 ] && ROUNDS_RUN=0 || ROUNDS_RUN=$ROUNDS
for r in $(seq 1 "$ROUNDS_RUN"); do
    for i in 0 1 2; do
        mode=${MODES[$(((i + r - 1) % 3))]}
        name=r${r}_$mode
        rm -rf "$OUT/ck-$name"
        extra=()
        [ "$mode" != none ] && extra=(--checkpoint-dir "$OUT/ck-$name" --checkpoint-every 1 --keep 2)
        [ "$mode" = sync ] && extra+=(--checkpoint-sync)
        echo "== round $r: $mode" >&2
        "$GPIPE" train "${T2[@]}" "${extra[@]}" --metrics "$OUT/$name.jsonl" \
            --report "$OUT/$name.json" >"$OUT/$name.out"
        rm -rf "$OUT/ck-$name"
    done
done

python3 - "$OUT" "$ROUNDS" "$WARMUP" <<'PY'
import json, os, statistics, sys
d, rounds, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def step_times(name):
    lines = [json.loads(l) for l in open(os.path.join(d, name + ".jsonl"))]
    t = [l["elapsed_s"] for l in lines if l["type"] == "train"]
    dt = [b - a for a, b in zip(t, t[1:])]  # step i's time (i >= 2), with boundary i-1's save
    return dt[max(warmup - 1, 0):]
med = {m: [] for m in ("none", "background", "sync")}
ratio = {m: [] for m in ("background", "sync")}
ck = {m: [] for m in ("background", "sync")}
for r in range(1, rounds + 1):
    s = {m: statistics.median(step_times(f"r{r}_{m}")) for m in med}
    for m in med:
        med[m].append(s[m])
    for m in ratio:
        ratio[m].append(s[m] / s["none"])
        ck[m].append(json.load(open(os.path.join(d, f"r{r}_{m}.json")))["checkpoints"])
print("| checkpoints | step s, median over rounds (range) | ratio to none, median (range) | per save: copy s / wait s / write s (medians) | training thread's s per save / step s without |")
print("| --- | --- | --- | --- | --- |")
for m in med:
    v = med[m]
    row = f"| {m} | {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f}) |"
    if m == "none":
        print(row + " 1 | - | - |")
        continue
    q = ratio[m]
    c = ck[m]
    per = lambda k: statistics.median(x[k] / x["saves"] for x in c)
    share = statistics.median((x["copy_s"] + x["wait_s"]) / x["saves"] / n
                              for x, n in zip(c, med["none"]))
    print(row + f" {statistics.median(q):.3f} ({min(q):.3f}-{max(q):.3f}) |"
          f" {per('copy_s'):.3f} / {per('wait_s'):.3f} / {per('write_s'):.3f} | {share:.3f} |")
PY
