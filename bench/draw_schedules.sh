#!/usr/bin/env bash
# The pictures of "Schedules" in docs/guide.md: one training step of examples/demo_lm.json grown to 6
# blocks (so that K = 3 stages of one or two cells each balance) on K = 3 stages with M = 6
# micro-batches (remat none, one thread per stage) under each schedule, drawn by --timeline into
# docs/schedule_<name>.svg. Usage: bash bench/draw_schedules.sh [path/to/gpipe]
set -eu
GPIPE=${1:-build/gpipe}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
sed 's/"layers": *4/"layers": 6/' examples/demo_lm.json >"$TMP/lm6.json"
grep -q '"layers": *6' "$TMP/lm6.json" || { echo "examples/demo_lm.json: no \"layers\": 4 to grow" >&2; exit 1; }
for s in gpipe 1f1b zbh1 interleaved zbv; do
    "$GPIPE" train --model "$TMP/lm6.json" --stages 3 --micro-batches 6 --batch 24 \
        --schedule "$s" --remat none --threads 1 --steps 3 --eval-size 4 --quiet \
        --timeline "docs/schedule_$s.svg" | grep -E "^bubble|^timeline"
done
