#!/usr/bin/env bash
# Checkpoints written in the background (the default) against --checkpoint-sync:
# - the same bytes: a checkpoint after every step, with K = 1 and K = 2 stages on threads, gives
#   files identical to the synchronous path's, byte for byte, and the report counts the saves,
#   the copies and the waits;
# - a process killed in the middle of a background write (SIGXFSZ: `ulimit -f` below the size
#   of a checkpoint, so the writer thread's write kills the process halfway through the file)
#   leaves the previous checkpoint the newest complete one and a temporary file; --resume takes
#   the previous one, removes the leftover, and ends with the straight run's bits;
# - a background write that fails (the same limit with SIGXFSZ ignored: EFBIG, as on a full
#   disk) fails the run at a following step boundary with a message naming the file, leaving
#   no temporary file and the previous checkpoint the newest.
# (Under MPI the same, in tests/cli/checkpoint_mpi.sh.)
# Run from the repository root: bash tests/cli/checkpoint_async.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

printf '{"family": "transformer", "vocab": 256, "dim": 32, "heads": 2, "d_ff": 64, "layers": 2, "seq_len": 16, "dropout": 0.1}\n' \
    >"$TMP/lm.json"
cli_write_corpus "$TMP/corpus"
LM=(--model "$TMP/lm.json" --data "$TMP/corpus" --steps 8 --batch 8 --micro-batches 4
    --eval-size 4 --threads 1 --quiet --seed 5)
files() { (cd "$1" && ls | tr '\n' ' '); }

# same_bytes A B: every file of folder A is in B with the same bytes, and B holds no other.
same_bytes() {
    [ "$(files "$1")" = "$(files "$2")" ] || bad "$1 holds $(files "$1"), $2 holds $(files "$2")"
    for f in "$1"/*; do
        cmp -s "$f" "$2/$(basename "$f")" || bad "$(basename "$f"): background and sync differ"
    done
}

# --- the same bytes, K = 1 and 2 on threads ----------------------------------------------------
for K in 1 2; do
    run bg$K "${LM[@]}" --stages $K --checkpoint-dir "$TMP/bg$K" --checkpoint-every 1 --keep 20 \
        --report "$TMP/bg$K.json"
    run sy$K "${LM[@]}" --stages $K --checkpoint-dir "$TMP/sy$K" --checkpoint-every 1 --keep 20 \
        --checkpoint-sync --report "$TMP/sy$K.json"
    [ "$(ls "$TMP/bg$K" | grep -c '^ckpt-0000000[1-8]\.safetensors$')" = 8 ] ||
        bad "K = $K: expected 8 checkpoints, found $(files "$TMP/bg$K")"
    same_bytes "$TMP/bg$K" "$TMP/sy$K"
    grep -q "checkpoint: wrote $TMP/bg$K/ckpt-00000003.safetensors (step 3, .*written in the background" \
        "$TMP/bg$K.out" || bad "K = $K: no background line: $(cat "$TMP/bg$K.out")"
    grep -q "^checkpoints: 8 saved (in the background)" "$TMP/bg$K.out" ||
        bad "K = $K: no summary of the saves: $(cat "$TMP/bg$K.out")"
    python3 - "$TMP/bg$K.json" "$TMP/sy$K.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
bg, sy = (json.load(open(p)) for p in sys.argv[1:3])
b, s = bg["checkpoints"], sy["checkpoints"]
need(b["mode"] == "background" and s["mode"] == "sync", f"modes {b['mode']}, {s['mode']}")
need(b["saves"] == 8 and s["saves"] == 8, f"saves {b['saves']}, {s['saves']}, expected 8")
need(b["every"] == 1, f"every {b['every']}")
need(b["write_s"] > 0 and b["copy_s"] > 0, f"background: write_s {b['write_s']} copy_s {b['copy_s']}")
need(b["wait_s"] >= 0 and b["stop_wait_s"] >= 0, f"background waits {b}")
need(s["wait_s"] == 0 and s["write_s"] == 0, f"sync: nothing in the background: {s}")
need(bg["params_fnv1a64"] == sy["params_fnv1a64"], "background and sync runs end apart")
finish()
PY
done

# --- killed in the middle of a background write ------------------------------------------------
# A checkpoint is ~100 KB here; the limit (in KiB) lets every other file of the run be written.
size=$(stat -c %s "$TMP/bg1/ckpt-00000004.safetensors")
limit=$((size / 2048))
[ "$limit" -ge 8 ] || bad "a checkpoint of $size bytes is too small to cut in half"
run straight "${LM[@]}" --report "$TMP/straight.json"
run k1 "${LM[@]}" --checkpoint-dir "$TMP/kill" --checkpoint-every 1 --keep 2 --stop-after 3
# The child inherits the limit; SIGXFSZ's default action kills it at the first write past it.
(ulimit -f "$limit"; exec "$GPIPE" train "${LM[@]}" --checkpoint-dir "$TMP/kill" \
    --checkpoint-every 1 --keep 2 --resume >"$TMP/k2.out" 2>"$TMP/k2.err")
rc=$?
[ "$rc" = 153 ] || bad "expected a kill by SIGXFSZ (exit 153), got exit $rc: $(tail -c 400 "$TMP/k2.err")"
[ -f "$TMP/kill/ckpt-00000003.safetensors" ] && [ ! -e "$TMP/kill/ckpt-00000004.safetensors" ] &&
    compgen -G "$TMP/kill/ckpt-00000004.safetensors.tmp.*" >/dev/null ||
    bad "after the kill: $(files "$TMP/kill"), expected step 3 complete and step 4's temporary file"
run k3 "${LM[@]}" --checkpoint-dir "$TMP/kill" --checkpoint-every 1 --keep 2 --resume \
    --report "$TMP/k3.json" && cli_same_run straight k3
grep -q "resume: loaded $TMP/kill/ckpt-00000003.safetensors: continuing at step 3 of 8" \
    "$TMP/k3.out" || bad "did not resume from step 3: $(cat "$TMP/k3.out")"
grep -q "removed 1 incomplete file(s) left in $TMP/kill" "$TMP/k3.out" ||
    bad "the partial file was not removed: $(cat "$TMP/k3.out")"

# --- a background write that fails: the error at a following step boundary ---------------------
run e1 "${LM[@]}" --checkpoint-dir "$TMP/full" --checkpoint-every 2 --keep 3 --stop-after 2
(trap '' XFSZ; ulimit -f "$limit"; exec "$GPIPE" train "${LM[@]}" --checkpoint-dir "$TMP/full" \
    --checkpoint-every 2 --keep 3 --resume >"$TMP/e2.out" 2>"$TMP/e2.err")
rc=$?
[ "$rc" = 1 ] || bad "a failed background write: exit $rc, expected 1"
grep -q "cannot write '$TMP/full/ckpt-00000004.safetensors': cannot write the temporary file '$TMP/full/ckpt-00000004.safetensors.tmp.[0-9]*' (File too large)" \
    "$TMP/e2.err" || bad "the error does not name the file and the cause: $(cat "$TMP/e2.err")"
grep -q "trained\|stopped after" "$TMP/e2.out" && bad "the run went on after a failed save: $(cat "$TMP/e2.out")"
[ "$(files "$TMP/full")" = "ckpt-00000002.safetensors " ] ||
    bad "after a failed write: $(files "$TMP/full"), expected step 2's checkpoint alone"

cli_finish checkpoint_async
