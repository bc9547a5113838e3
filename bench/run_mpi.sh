#!/usr/bin/env bash
# The MPI launcher on this machine, as three markdown tables:
# 1. T2 with K = 2 over MPI (2 ranks) vs threads: tokens/s and the MPI overhead in percent,
#    at M = 8 and 32 with both schedules;
# 2. two ranks used as D = 2 replicas x K = 1 vs K = 2 stages x D = 1, same global batch 32;
# 3. bytes sent per step per rank (from the reports' bytes_sent_last_step) beside the formula:
#    point-to-point M x (b x T x d x 4 + 72) per boundary direction (activations forward,
#    their gradients back; b = batch / (D x M), 72 the header), and each stage's gradients
#    (4 bytes x its parameters) given to the all-reduce when D > 1, which a ring all-reduce
#    puts on the wire as 2 (D - 1) / D of that.
# 4. memory per process: T2 at M = 8 on one process (K = 1), and over MPI with K = 2 and K = 4
#    (oversubscribed: only memory is read from these): each rank's peak resident set (getrusage)
#    beside the bytes its stage device counted. A rank holds its own stage and nothing more.
# Usage: bash bench/run_mpi.sh [path/to/gpipe] (reports go to ${GP_BENCH_OUT:-out/mpi});
# GP_BENCH_STEPS (5), GP_BENCH_WARMUP (2), GP_MPIRUN (mpirun --bind-to core: each rank on its
# own core, as the threads launcher pins stage k's thread to core k),
# GP_BENCH_BATCH (T2's 32) and GP_BENCH_M ("8 32"), for a quick check of the script itself.
set -eu
GPIPE=${1:-build/gpipe}
STEPS=${GP_BENCH_STEPS:-5}
WARMUP=${GP_BENCH_WARMUP:-2}
OUT=${GP_BENCH_OUT:-out/mpi}
read -r -a MPIRUN <<<"${GP_MPIRUN:-mpirun --bind-to core}"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if "$GPIPE" bench --workload T2 --launcher mpi --stages 2 2>&1 >/dev/null |
    grep -q "MPI support was not built"; then
    echo "bench/run_mpi.sh: skipped: $GPIPE was built without MPI (install libopenmpi-dev, rebuild)" >&2
    exit 0
fi
mkdir -p "$OUT"

# one NAME NP ARGS...: one configuration (NP = 0: no mpirun, threads), report $OUT/NAME.json.
one() {
    local name=$1 np=$2
    shift 2
    local cmd=("$GPIPE" bench --workload T2 "$@" --steps "$STEPS" --warmup "$WARMUP" --quiet
        ${GP_BENCH_BATCH:+--batch "$GP_BENCH_BATCH"}
        --report "$OUT/$name.json")
    [ "$np" = 0 ] || cmd=("${MPIRUN[@]}" -np "$np" "${cmd[@]}")
    echo "== ${cmd[*]}" >&2
    "${cmd[@]}" >&2
}

MS=${GP_BENCH_M:-8 32}
for M in $MS; do
    for S in gpipe 1f1b; do
        one "threads_k2_m${M}_${S}" 0 --stages 2 --micro-batches "$M" --schedule "$S"
        one "mpi_k2_m${M}_${S}" 2 --stages 2 --micro-batches "$M" --schedule "$S"
    done
done
one "mpi_d2_m1" 2 --stages 1 --data-parallel 2 --micro-batches 1
one "mpi_d2_m4" 2 --stages 1 --data-parallel 2 --micro-batches 4
one "rss_k1_m8" 0 --micro-batches 8
one "rss_k2_m8" 2 --stages 2 --micro-batches 8
GP_MPIRUN_SAVED=("${MPIRUN[@]}")
MPIRUN=(mpirun --oversubscribe)
one "rss_k4_m8" 4 --stages 4 --micro-batches 8
MPIRUN=("${GP_MPIRUN_SAVED[@]}")

python3 - "$OUT" "$MS" <<'PY'
import json, os, re, sys
d, ms = sys.argv[1], [int(m) for m in sys.argv[2].split()]
def load(name):
    return json.load(open(os.path.join(d, name + ".json")))
tps = lambda r: r["throughput"]["tokens_per_s"]

print("T2, K = 2 stages: MPI (2 ranks) vs threads (2 threads)\n")
print("| M | schedule | threads tokens/s | MPI tokens/s | MPI overhead | bubble threads / MPI |")
print("|---|---|---|---|---|---|")
for m in ms:
    for s in ("gpipe", "1f1b"):
        t, p = load(f"threads_k2_m{m}_{s}"), load(f"mpi_k2_m{m}_{s}")
        over = 100 * (tps(t) - tps(p)) / tps(t)
        print(f"| {m} | {s} | {tps(t):.0f} | {tps(p):.0f} | {over:+.1f}% | "
              f"{t['pipeline']['bubble_measured']:.3f} / {p['pipeline']['bubble_measured']:.3f} |")

print(f"\nTwo ranks, global batch {load('mpi_d2_m1')['batch']}: data parallel (D = 2, K = 1) vs pipeline (K = 2, D = 1)\n")
print("| layout | M per replica | micro-batch | tokens/s | step s (median) | bubble measured |")
print("|---|---|---|---|---|---|")
rows = [("D=2 x K=1", "mpi_d2_m1", 1, 2), ("D=2 x K=1", "mpi_d2_m4", 4, 2)]
rows += [("K=2 x D=1", f"mpi_k2_m{m}_1f1b", m, 1) for m in ms]
for label, name, m, dp in rows:
    r = load(name)
    print(f"| {label} | {m} | {r['batch'] // (dp * m)} | {tps(r):.0f} | "
          f"{r['step_seconds']['median']:.3f} | {r['pipeline']['bubble_measured']:.3f} |")

print("\nBytes sent per step per rank (last timed step) beside the formula\n")
print("| run | rank | stage | replica | p2p bytes | formula | all-reduce bytes | formula "
      "| ring all-reduce on the wire |")
print("|---|---|---|---|---|---|---|---|---|")
HEADER = 72
for name in [f"mpi_k2_m{m}_gpipe" for m in ms] + ["mpi_d2_m1", "mpi_d2_m4"]:
    r = load(name)
    p = r["pipeline"]
    T = int(re.search(r" T(\d+) ", r["model"]).group(1))  # "transformer d256 h4 ... T128 V256"
    dm = int(re.search(r"transformer d(\d+)", r["model"]).group(1))
    K, D, M = p["stages"], p["data_parallel"], p["micro_batches"]
    b = r["batch"] // (D * M)
    for e in p["bytes_sent_last_step"]:
        k = e["stage"]
        directions = (k < K - 1) + (k > 0)  # activations forward, gradients back
        f_p2p = directions * M * (b * T * dm * 4 + HEADER)
        params = p["stage_peak_bytes"][k]["parameters"] if D > 1 else 0
        wire = 2 * (D - 1) / D * params
        print(f"| {name} | {e['rank']} | {k} | {e['replica']} | {e['p2p']} | {f_p2p} | "
              f"{e['allreduce']} | {params} | {wire:.0f} |")

MiB = 1 << 20
print("\nMemory per process, T2 at M = 8: each process's peak resident set (getrusage) and the peak "
      "bytes its device counted\n")
print("| run | process | stage | device peak | process peak RSS | RSS - device |")
print("|---|---|---|---|---|---|")
one = load("rss_k1_m8")
dev, rss = one["memory"]["peak_bytes"]["total"], one["rss_peak_bytes"][0]
print(f"| K = 1, one process | 0 | all | {dev / MiB:.1f} MiB | {rss / MiB:.1f} MiB | {(rss - dev) / MiB:.1f} MiB |")
for k in (2, 4):
    r = load(f"rss_k{k}_m8")
    for rank, (s, rss) in enumerate(zip(r["pipeline"]["stage_peak_bytes"], r["rss_peak_bytes"])):
        print(f"| K = {k}, MPI | rank {rank} | {s['stage']} | {s['total'] / MiB:.1f} MiB | "
              f"{rss / MiB:.1f} MiB | {(rss - s['total']) / MiB:.1f} MiB |")
PY
