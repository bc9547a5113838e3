#!/usr/bin/env bash
# Tied embeddings against untied, alternating in one run: T1 on one device and T2 on K = 2
# stages (the tie then spans the stages: the head's gradient crosses the transport at every
# step). Prints a markdown table: per case the median over rounds of tokens/s and of the step's
# seconds, and tied's throughput relative to untied's.
# Usage: bash bench/run_tied.sh path/to/gpipe
#   GP_TIED_ROUNDS (3), GP_BENCH_STEPS (3), GP_BENCH_WARMUP (1); reports in ${GP_BENCH_OUT:-out/tied}.
set -eu
G=${1:?usage: bash bench/run_tied.sh path/to/gpipe}
ROUNDS=${GP_TIED_ROUNDS:-3}
STEPS=${GP_BENCH_STEPS:-3}
WARMUP=${GP_BENCH_WARMUP:-1}
OUT=${GP_BENCH_OUT:-out/tied}
mkdir -p "$OUT"
CASES=("t1|--workload T1 --threads 1" "t2k2m8|--workload T2 --stages 2 --micro-batches 8")
for r in $(seq 1 "$ROUNDS"); do
    for c in "${CASES[@]}"; do
        name=${c%%|*}
        read -r -a args <<<"${c#*|}"
        for side in untied tied; do
            extra=()
            [ "$side" = tied ] && extra=(--tie-embeddings)
            echo "== round $r: $side $name: $G bench ${args[*]} ${extra[*]}" >&2
            "$G" bench "${args[@]}" "${extra[@]}" --steps "$STEPS" --warmup "$WARMUP" --quiet \
                --report "$OUT/${name}_${side}_$r.json" >/dev/null
        done
    done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("| case | untied tokens/s | tied tokens/s | tied / untied (median of rounds) | step s untied / tied |")
print("| --- | ---: | ---: | ---: | --- |")
for name in ("t1", "t2k2m8"):
    tok, step, ratio = {}, {}, []
    for side in ("untied", "tied"):
        rs = [json.load(open(f"{out}/{name}_{side}_{r}.json")) for r in range(1, rounds + 1)]
        tok[side] = [x["throughput"]["tokens_per_s"] for x in rs]
        step[side] = [x["step_seconds"]["median"] for x in rs]
    ratio = [t / u for t, u in zip(tok["tied"], tok["untied"])]
    print(f"| {name} | {statistics.median(tok['untied']):.0f} | {statistics.median(tok['tied']):.0f} | "
          f"**{statistics.median(ratio):.3f}** ({min(ratio):.3f}-{max(ratio):.3f}) | "
          f"{statistics.median(step['untied']):.3f} / {statistics.median(step['tied']):.3f} |")
PY
