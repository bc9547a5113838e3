#!/usr/bin/env bash
# `gpipe train --plan auto --devices N` with its default prediction (the plan search by FLOPs and
# the runtime's measured cost per action, the chosen plan then timed again on its layers measured
# at its micro-batch size, then by running a few steps of it and of its neighbouring cuts) on T2
# (examples/t2.json) and C1 (the convnet): the chosen plan, its predicted step beside the median
# measured one (the steps after the first), their ratio, what the calibration cost, and how busy
# other processes kept the machine's cores meanwhile.
# Usage: bash bench/run_plan_accuracy.sh [path/to/gpipe] [devices] [rounds]; reports go to
# ${GP_BENCH_OUT:-out/plan_accuracy}; GP_BENCH_STEPS (T2: 6, C1: 20) steps each;
# GP_BENCH_WORKLOADS (default "T2 C1") the workloads. The prediction
# is of the plan's step with its cores to itself: on a shared machine the column "others" (the
# share of all cores' time other processes used during the run, from /proc/stat) says which
# rounds measured something else.
set -eu
GPIPE=${1:-build/gpipe}
DEVICES=${2:-2}
ROUNDS=${3:-1}
OUT=${GP_BENCH_OUT:-out/plan_accuracy}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
    for w in ${GP_BENCH_WORKLOADS:-T2 C1}; do
        if [ "$w" = T2 ]; then
            args=(--model examples/t2.json --batch 32 --eval-size 8 --steps "${GP_BENCH_STEPS:-6}")
        else
            args=(--model convnet --batch 128 --eval-size 128 --steps "${GP_BENCH_STEPS:-20}")
        fi
        echo "== round $r $w: load $(cut -d' ' -f1-3 /proc/loadavg): $GPIPE train ${args[*]} --plan auto --devices $DEVICES" >&2
        # the run with the machine's busy time and its own CPU time around it
        python3 - "$OUT/${w}_$r" "$GPIPE" train "${args[@]}" --plan auto --devices "$DEVICES" \
            --quiet --report "$OUT/${w}_$r.json" <<'PY'
import json, os, resource, subprocess, sys, time
def cores_busy():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)  # all but idle and iowait; everything (in ticks)
base, cmd = sys.argv[1], sys.argv[2:]
b0, t0 = cores_busy()
with open(base + ".out", "w") as out:
    subprocess.run(cmd, stdout=out, check=True)
b1, t1 = cores_busy()
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
own = (ru.ru_utime + ru.ru_stime) * os.sysconf("SC_CLK_TCK")
json.dump({"others": max(0.0, (b1 - b0 - own) / max(1, t1 - t0))}, open(base + ".busy.json", "w"))
PY
        grep "^plan auto: " "$OUT/${w}_$r.out" >&2
    done
done
python3 - "$OUT" "$ROUNDS" "${GP_BENCH_WORKLOADS:-T2 C1}" <<'PY'
import json, sys
out, rounds, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
print("| workload | round | chosen plan (K, M, V, schedule, remat) | by FLOPs | by measured layers | predicted step (trial) | measured step (median) | measured / predicted | measured / by layers | calibration + trial | others |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for w in workloads:
    for r in range(1, rounds + 1):
        pa = json.load(open(f"{out}/{w}_{r}.json"))["plan_auto"]
        others = json.load(open(f"{out}/{w}_{r}.busy.json"))["others"]
        b, tr = pa["plans"][0], pa.get("trial") or {}
        layers = b["step_s"]  # the model's; predicted_step_s is the trial's
        cells = tr.get("partition", b["partition"])
        print(f"| {w} | {r} | K={b['stages']} M={b['micro_batches']} V={b.get('chunks', 1)} {b['schedule']} {b['remat']} "
              f"({','.join(map(str, cells))}) | "
              f"{pa.get('flop_step_s', 0):.3f} s | {layers:.3f} s | {pa['predicted_step_s']:.3f} s | {pa['measured_step_s']:.3f} s | "
              f"{pa['measured_step_s'] / pa['predicted_step_s']:.3f} | {pa['measured_step_s'] / layers:.3f} | "
              f"{pa.get('calibration_s', 0):.2f} + {tr.get('seconds', 0):.2f} s | {others:.0%} |")
PY
