#!/usr/bin/env bash
# Crash safety: a training run that writes a checkpoint after every step is killed with SIGKILL
# again and again, at random moments and in the middle of a save (the moment a temporary file
# appears), and restarted with --resume each time. After every kill each complete checkpoint in
# the folder must be whole (the reference Python safetensors reader, every CRC-32), a kill in
# the middle of a save must leave only a temporary file (removed by the next resume), and the
# final parameters must equal those of an uninterrupted run bit for bit.
# Run from the repository root: bash tests/cli/crash.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"
cli_need_pydeps

# About 0.6 M parameters: a checkpoint with AdamW state is ~7 MB, so a save takes long enough
# to be caught in the middle.
printf '{"family": "transformer", "vocab": 256, "dim": 128, "heads": 4, "d_ff": 256, "layers": 4, "seq_len": 32, "dropout": 0.1}\n' \
    >"$TMP/lm.json"
cli_write_corpus "$TMP/corpus"
STEPS=60
ARGS=(--model "$TMP/lm.json" --data "$TMP/corpus" --steps "$STEPS" --batch 8 --micro-batches 2
      --eval-size 4 --threads 1 --quiet --seed 11)
run straight "${ARGS[@]}" --report "$TMP/straight.json"

D=$TMP/ck
# check_folder: every complete checkpoint reads with the reference package and its CRCs hold.
check_folder() {
    "$PY" - "$D" <<'PY' || fail=$((fail + 1))
import os, sys, zlib
from safetensors import safe_open
d = sys.argv[1]
bad = []
for name in sorted(os.listdir(d)):
    if not name.endswith(".safetensors"):
        continue
    try:
        with safe_open(os.path.join(d, name), "np") as f:
            meta = f.metadata()
            for k in f.keys():
                if "%08x" % zlib.crc32(f.get_tensor(k).tobytes()) != meta["crc32:" + k]:
                    bad.append(f"{name}: {k}: CRC-32 mismatch")
    except Exception as e:  # a torn file would land here
        bad.append(f"{name}: {e}")
for b in bad:
    print("FAIL: after a kill:", b)
sys.exit(1 if bad else 0)
PY
}

kills=0 midsave=0 mode_random=0
rounds=${GP_CRASH_ROUNDS:-8}
for round in $(seq 1 "$rounds"); do
    "$GPIPE" train "${ARGS[@]}" --checkpoint-dir "$D" --checkpoint-every 1 --keep 2 --resume \
        >"$TMP/r$round.out" 2>"$TMP/r$round.err" &
    pid=$!
    if [ $((round % 2)) -eq 1 ]; then
        # In the middle of a save: as soon as a temporary file shows up.
        while kill -0 "$pid" 2>/dev/null; do
            if compgen -G "$D/*.tmp.*" >/dev/null; then
                kill -9 "$pid" 2>/dev/null
                break
            fi
        done
    else
        # At a random moment within the first second or so.
        sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
        kill -9 "$pid" 2>/dev/null
        mode_random=$((mode_random + 1))
    fi
    wait "$pid" 2>/dev/null
    rc=$?
    if [ "$rc" -eq 137 ]; then
        kills=$((kills + 1))
        compgen -G "$D/*.tmp.*" >/dev/null && midsave=$((midsave + 1))
    elif [ "$rc" -ne 0 ]; then
        bad "round $round: exit $rc: $(tail -c 600 "$TMP/r$round.err")"
    fi
    check_folder
    last=$(ls "$D" | grep -c '^ckpt-[0-9]*\.safetensors$')
    echo "round $round: exit $rc, $last complete checkpoint(s), newest $(ls "$D" | grep '^ckpt-[0-9]*\.safetensors$' | tail -1)"
done
run final "${ARGS[@]}" --checkpoint-dir "$D" --checkpoint-every 1 --keep 2 --resume \
    --report "$TMP/final.json"
compgen -G "$D/*.tmp.*" >/dev/null && bad "a temporary file survived the last resume"
[ "$midsave" -ge 1 ] || bad "no kill landed in the middle of a save ($kills kills)"
[ "$kills" -ge 3 ] || bad "only $kills of $rounds runs were killed (expected at least 3)"
grep -q "removed 1 incomplete file(s)" "$TMP"/r*.out "$TMP/final.out" ||
    bad "no resume reported removing the temporary file of an interrupted save"
python3 - "$TMP/straight.json" "$TMP/final.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
a, b = (json.load(open(p)) for p in sys.argv[1:3])
need(b["steps"] == a["steps"], f"final run ended at step {b['steps']}, expected {a['steps']}")
need(a["params_fnv1a64"] == b["params_fnv1a64"],
     f"after the kills: params {b['params_fnv1a64']} vs uninterrupted {a['params_fnv1a64']}")
need(a["eval"] == b["eval"], f"eval {b['eval']} vs {a['eval']}")
finish()
PY
echo "crash: $kills SIGKILLs ($midsave in the middle of a save, $mode_random at random moments)"
cli_finish crash
