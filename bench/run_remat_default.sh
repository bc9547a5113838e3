#!/usr/bin/env bash
# T2 on one stage device at M = 8 (`gpipe bench --workload T2 --stages 1 --micro-batches 8`) with
# --remat's default (selective against the host's available memory) against --remat none and
# --remat cell, the three run one after another in each round so that the machine's drift
# touches them alike; per round the tokens/s of each and the default's ratio to the others, and
# the same ratios of the steps' CPU seconds (every thread's: what other processes' load on a
# shared machine hardly moves).
# Usage: bash bench/run_remat_default.sh [path/to/gpipe] [rounds]; reports go to
# ${GP_BENCH_OUT:-out/remat_default}; GP_BENCH_STEPS (3) timed steps after 1 warm-up each.
set -eu
GPIPE=${1:-build/gpipe}
ROUNDS=${2:-3}
OUT=${GP_BENCH_OUT:-out/remat_default}
STEPS=${GP_BENCH_STEPS:-3}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
    for mode in default none cell; do
        extra=()
        [ "$mode" = default ] || extra=(--remat "$mode")
        echo "== round $r $mode: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
        "$GPIPE" bench --workload T2 --stages 1 --micro-batches 8 --steps "$STEPS" --warmup 1 \
            --quiet "${extra[@]}" --report "$OUT/${mode}_$r.json" >"$OUT/${mode}_$r.out"
        grep "^remat:" "$OUT/${mode}_$r.out" >&2
    done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("| round | default (cells) | default tokens/s | none tokens/s | cell tokens/s | default / none | default / cell "
      "| CPU s/step default, none, cell | CPU none / default | CPU cell / default |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    rep = {m: json.load(open(f"{out}/{m}_{r}.json")) for m in ("default", "none", "cell")}
    tok = {m: rep[m]["throughput"]["tokens_per_s"] for m in rep}
    cpu = {m: rep[m]["step_cpu_seconds"]["median"] for m in rep}
    cells = ",".join(rep["default"]["pipeline"]["cell_remat"])
    print(f"| {r} | {rep['default']['pipeline']['remat']} ({cells}) | {tok['default']:.0f} | {tok['none']:.0f} | "
          f"{tok['cell']:.0f} | {tok['default'] / tok['none']:.3f} | {tok['default'] / tok['cell']:.3f} | "
          f"{cpu['default']:.2f}, {cpu['none']:.2f}, {cpu['cell']:.2f} | {cpu['none'] / cpu['default']:.3f} | "
          f"{cpu['cell'] / cpu['default']:.3f} |")
PY
