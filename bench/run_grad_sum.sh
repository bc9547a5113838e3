#!/usr/bin/env bash
# T2's step with the tree sum of the gradients (--grad-sum tree) against the sequential one, on
# two cores: D = 1 x K = 2 on threads (M = 8) and, when MPI is built and mpirun is on PATH,
# D = 2 x K = 1 over MPI (M = 4 per replica: the same 8 micro-batches of 4 sequences). The two
# sums alternate round by round (the machine is shared and drifts), and the table gives each
# sum's median over the rounds of the per-run median step (wall and CPU seconds), the spread of
# those, the ratio tree / sequential, the bytes each stage device counted at peak (gradients, and
# all), then the ratios round by round.
# Usage: bash bench/run_grad_sum.sh [path/to/gpipe]; GP_BENCH_ROUNDS (3), GP_BENCH_STEPS (3),
# GP_BENCH_WARMUP (1), GP_BENCH_OUT (out/grad_sum).
set -eu
GPIPE=${1:-build/gpipe}
ROUNDS=${GP_BENCH_ROUNDS:-3}
STEPS=${GP_BENCH_STEPS:-3}
WARMUP=${GP_BENCH_WARMUP:-1}
OUT=${GP_BENCH_OUT:-out/grad_sum}
mkdir -p "$OUT"
T2=(bench --workload T2 --steps "$STEPS" --warmup "$WARMUP" --quiet)
layouts="k2"
if ! "$GPIPE" bench --workload T2 --launcher mpi 2>&1 >/dev/null | grep -q "MPI support was not built" &&
    command -v mpirun >/dev/null; then
    layouts="k2 d2"
fi
for r in $(seq 1 "$ROUNDS"); do
    for L in $layouts; do
        for g in sequential tree; do
            if [ "$L" = k2 ]; then
                "$GPIPE" "${T2[@]}" --stages 2 --micro-batches 8 --grad-sum "$g" \
                    --report "$OUT/${L}_${g}_$r.json" >/dev/null 2>&1
            else
                mpirun --bind-to core -np 2 "$GPIPE" "${T2[@]}" --launcher mpi --data-parallel 2 \
                    --stages 1 --micro-batches 4 --grad-sum "$g" \
                    --report "$OUT/${L}_${g}_$r.json" >/dev/null 2>&1
            fi
            echo "round $r: $L $g done" >&2
        done
    done
done
python3 - "$OUT" "$ROUNDS" $layouts <<'PY'
import json, os, statistics as st, sys
d, rounds, layouts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
name = {"k2": "D=1 x K=2, M=8 (threads)", "d2": "D=2 x K=1, M=4 per replica (MPI)"}
print("| layout | sum | step s | spread | CPU s | spread | tree / sequential (wall, CPU) | gradient bytes per stage device at peak | device bytes at peak (stage) |")
print("|---|---|---|---|---|---|---|---|---|")
for L in layouts:
    med, runs = {}, {}
    for g in ("sequential", "tree"):
        rs = [json.load(open(os.path.join(d, f"{L}_{g}_{r}.json"))) for r in range(1, rounds + 1)]
        w = [r["step_seconds"]["median"] for r in rs]
        c = [r["step_cpu_seconds"]["median"] for r in rs]
        stages = rs[0]["pipeline"]["stage_peak_bytes"]
        gb = max(s["gradients"] for s in stages)
        tb = max(s["total"] for s in stages)
        med[g] = (st.median(w), st.median(c))
        runs[g] = (w, c)
        ratio = "" if g == "sequential" else \
            f"{med['tree'][0] / med['sequential'][0]:.3f}, {med['tree'][1] / med['sequential'][1]:.3f}"
        print(f"| {name[L]} | {g} | {st.median(w):.2f} | {min(w):.2f}-{max(w):.2f} | "
              f"{st.median(c):.2f} | {min(c):.2f}-{max(c):.2f} | {ratio} | {gb / 2**20:.1f} MiB | "
              f"{tb / 2**20:.1f} MiB |")
    for i, what in ((0, "wall"), (1, "CPU")):
        pair = [t / q for t, q in zip(runs["tree"][i], runs["sequential"][i])]
        print(f"{name[L]}: tree / sequential round by round ({what}): "
              f"{', '.join(f'{x:.2f}' for x in pair)}; median {st.median(pair):.3f}")
PY
