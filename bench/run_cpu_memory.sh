#!/usr/bin/env bash
# A CPU run's memory, for builds side by side (with the CUDA device built in or not): `gpipe
# --help`, a tiny CPU training (examples/tiny_transformer.json, 5 steps on the fortunes) and,
# where GP_MEM_T2=1 and mpirun is there, the ranks of T2 at K = 4 over MPI (2 steps after 1
# warm-up). For each: the peak and final resident set (VmHWM, VmRSS), the final one as anonymous
# and file-backed pages, and the CUDA libraries' resident pages, from bench/rss_probe.c
# preloaded into every process, in MB (10^6 bytes). Usage (NAME without "="):
#   bash bench/run_cpu_memory.sh NAME=path/to/gpipe [NAME=path/to/gpipe ...]
set -eu
[ $# -ge 1 ] || { echo "usage: bash $0 NAME=path/to/gpipe ..." >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
${CC:-cc} -O2 -shared -fPIC -o "$TMP/rss_probe.so" "$HERE/rss_probe.c"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# probe LABEL BUILD CMD...: CMD run with the probe (unless it passes it on itself, as mpirun -x
# does to the ranks alone); one table row, each figure the range over the processes measured.
PROBE=(GP_RSS_PROBE_OUT="$TMP/out" LD_PRELOAD="$TMP/rss_probe.so")
probe() {
    local label=$1 build=$2
    shift 2
    rm -f "$TMP"/out.*
    local envs=("${PROBE[@]}")
    [ "$1" = mpirun ] && envs=()
    env "${envs[@]}" "$@" >"$TMP/log" 2>&1 ||
        { echo "$build: $* failed: $(tail -c 400 "$TMP/log")" >&2; exit 1; }
    cat "$TMP"/out.* | awk -v b="$build" -v l="$label" '
        { for (i = 2; i <= 10; i += 2) {
              v = $i * 1.024e-3
              if (NR == 1 || v < lo[i]) lo[i] = v
              if (NR == 1 || v > hi[i]) hi[i] = v } }
        END { row = "| " b " | " l (NR > 1 ? " (" NR " processes)" : "") " |"
              for (i = 2; i <= 10; i += 2) {
                  if (lo[i] == hi[i]) cell = sprintf(" %.1f |", lo[i])
                  else cell = sprintf(" %.1f-%.1f |", lo[i], hi[i])
                  row = row cell }
              print row }'
}

echo "| build | run | peak RSS | final RSS | anonymous | file-backed | CUDA libraries |"
echo "|---|---|---|---|---|---|---|"
for spec in "$@"; do
    name=${spec%%=*}
    gpipe=${spec#*=}
    probe "gpipe --help" "$name" "$gpipe" --help
    probe "tiny CPU training" "$name" "$gpipe" train \
        --model "$HERE/../examples/tiny_transformer.json" --steps 5 --batch 8 --threads 1 --quiet
    if [ "${GP_MEM_T2:-0}" = 1 ] && command -v mpirun >/dev/null; then
        probe "T2, K = 4 over MPI" "$name" \
            mpirun --oversubscribe -x "${PROBE[0]}" -x "${PROBE[1]}" -np 4 \
            "$gpipe" bench --workload T2 --launcher mpi --stages 4 --micro-batches 8 \
            --steps 2 --warmup 1 --quiet
    fi
done
