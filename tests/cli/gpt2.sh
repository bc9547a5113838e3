#!/usr/bin/env bash
# GPT-2 through the CLI, on the committed transformers fixture (tests/reference/fixtures/gpt2):
# `gpipe import` writes the parameters and the gpt2 config (vocabulary 100 padded to 128); eval
# and sample read the imported file, and greedy sampling draws ids below 100 only (the padding
# rows are never drawn); `gpipe train --init` starts from it on 2 stages, and its first step's
# loss is the imported model's, not the seed's; `gpipe export` writes a GPT2Config for 100 tokens
# whose re-import has the same parameters bit for bit; bad input exits with the file and what
# is wrong; under mpirun (skipped without MPI) --init on 2 ranks gives the threads' bits. The
# round trip through transformers itself is `make check-hf`.
# Run from the repository root: bash tests/cli/gpt2.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"
FIX=tests/reference/fixtures/gpt2

# expect STATUS NEEDLE ARGS...: gpipe ARGS exits STATUS and its stderr contains NEEDLE.
expect() {
    local want=$1 needle=$2 rc=0
    shift 2
    "$GPIPE" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ "$rc" -ne "$want" ] || ! grep -qF -- "$needle" "$TMP/err"; then
        bad "gpipe $*: exit status $rc, expected $want with \"$needle\"; stderr: $(head -c 400 "$TMP/err")"
    fi
}

if ! "$GPIPE" import --hf "$FIX" --out "$TMP/imp.safetensors" --config-out "$TMP/gpt2.json" \
    >"$TMP/import.out" 2>&1; then
    bad "gpipe import failed: $(tail -c 400 "$TMP/import.out")"
    cli_finish gpt2
fi
grep -qF '"vocab": 100, "vocab_padded": 128' "$TMP/gpt2.json" ||
    bad "the imported config: $(cat "$TMP/gpt2.json")"

# greedy sampling: ids of the 100 real tokens only
if "$GPIPE" sample --checkpoint "$TMP/imp.safetensors" --tokens --prompt "5 17 42" --bytes 40 \
    --temperature 0 >"$TMP/sample.out" 2>"$TMP/sample.err"; then
    python3 - "$TMP/sample.out" <<'PY' || fail=$((fail + 1))
import re, sys
ids = [int(t) for t in re.findall(r"\d+", open(sys.argv[1]).read())]
if len(ids) < 43 or max(ids) >= 100:
    sys.exit(f"FAIL: sampled ids {ids}: expected 3 + 40 ids below 100")
PY
else
    bad "gpipe sample: $(tail -c 400 "$TMP/sample.err")"
fi

# --init: the first step's loss is the imported model's (4.5 to 5.2 on random ids, as
# transformers' 4.797 on the fixture's) and the run is the same on 1 and 2 stages
python3 -c "import random, struct; random.seed(1); \
open('$TMP/ids.u16', 'wb').write(struct.pack('<4096H', *[random.randrange(100) for _ in range(4096)]))"
TR=(--model "$TMP/gpt2.json" --data "$TMP/ids.u16" --data-format u16 --steps 3 --batch 4
    --micro-batches 2 --threads 1 --quiet --eval-size 8)
run init1 "${TR[@]}" --init "$TMP/imp.safetensors" --report "$TMP/init1.json"
run init2 "${TR[@]}" --init "$TMP/imp.safetensors" --stages 2 --report "$TMP/init2.json"
run seed "${TR[@]}" --report "$TMP/seed.json"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
r = {n: json.load(open(f"{d}/{n}.json")) for n in ("init1", "init2", "seed")}
l1, l2, ls = (r[n]["train"]["step_losses"] for n in ("init1", "init2", "seed"))
need(l1 == l2, f"--init on 1 and 2 stages: {l1} vs {l2}")
need(r["init1"]["params_fnv1a64"] == r["init2"]["params_fnv1a64"], "parameters differ by K")
need(4.5 < l1[0] < 5.2, f"--init: first loss {l1[0]}, expected the imported model's")
need(abs(ls[0] - 4.605) < 0.05, f"the seed's first loss {ls[0]}: expected about ln(100)")
finish("FAIL: --init:")
PY

# export, and again import: the same parameters
if "$GPIPE" export --checkpoint "$TMP/imp.safetensors" --out "$TMP/hf" >"$TMP/export.out" \
    2>&1; then
    grep -q '"vocab_size": 100,' "$TMP/hf/config.json" || bad "config.json: $(cat "$TMP/hf/config.json")"
    "$GPIPE" import --hf "$TMP/hf" --out "$TMP/again.safetensors" >/dev/null 2>&1 ||
        bad "re-import of the export failed"
    for f in imp again; do
        "$GPIPE" eval --checkpoint "$TMP/$f.safetensors" --data "$TMP/ids.u16" --data-format u16 \
            --eval-size 16 --batch 4 >"$TMP/eval_$f.out" 2>&1 || bad "gpipe eval $f: $(tail -c 300 "$TMP/eval_$f.out")"
    done
    a=$(grep -o "loss [0-9.]*" "$TMP/eval_imp.out"); b=$(grep -o "loss [0-9.]*" "$TMP/eval_again.out")
    [ -n "$a" ] && [ "$a" = "$b" ] || bad "eval after export and import: '$a' vs '$b'"
else
    bad "gpipe export: $(tail -c 400 "$TMP/export.out")"
fi

# bad input
expect 2 "--out: required" import --hf "$FIX"
expect 1 "$TMP/none/config.json" import --hf "$TMP/none" --out "$TMP/x.safetensors"
mkdir -p "$TMP/bad" && cp "$FIX/model.safetensors" "$TMP/bad/"
sed 's/"gelu_new"/"gelu"/' "$FIX/config.json" >"$TMP/bad/config.json"
expect 1 '"activation_function" is "gelu": gpipe'"'"'s GPT-2 supports only "gelu_new"' \
    import --hf "$TMP/bad" --out "$TMP/x.safetensors"
sed 's/"n_layer": 2/"n_layer": 3/' "$FIX/config.json" >"$TMP/bad/config.json"
expect 1 'missing tensor "transformer.h.2.ln_1.weight"' import --hf "$TMP/bad" --out "$TMP/x.safetensors"
printf '{"family": "transformer", "vocab": 100, "dim": 32, "heads": 4, "d_ff": 128, "layers": 2, "seq_len": 16}\n' >"$TMP/t.json"
expect 1 "layers.0.weight" train --model "$TMP/t.json" --init "$TMP/imp.safetensors" \
    --data "$TMP/ids.u16" --data-format u16 --steps 1 --batch 4 --quiet
expect 2 "--checkpoint: required" export --out "$TMP/y"

# --- MPI: --init on 2 ranks gives the threads' run bit for bit (skipped without MPI) ----------
[ "$fail" = 0 ] || cli_finish gpt2
# Under ASan, no leak check from here on: Open MPI's plugins leave their own allocations behind
# at exit (the runs above were checked).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
cli_need_mpi
cli_mpirun m2 2 "${TR[@]}" --init "$TMP/imp.safetensors" --stages 2 --launcher mpi \
    --report "$TMP/m2.json"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
a, b = (json.load(open(f"{d}/{n}.json")) for n in ("init2", "m2"))
need(a["train"]["step_losses"] == b["train"]["step_losses"], "--init under MPI: other losses")
need(a["params_fnv1a64"] == b["params_fnv1a64"], "--init under MPI: other parameters")
finish("FAIL: --init under MPI:")
PY
cli_finish gpt2
