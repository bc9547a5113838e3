#!/usr/bin/env bash
# Hostile input, tried as a new user would (each command under a time limit, so a hang fails
# instead of stalling the suite):
# - a FIFO as --model, --checkpoint, an index, a set's part, --data or the newest checkpoint of a
#   --resume folder is refused at once, naming it;
# - --resume removes only the temporary files and orphan parts gpipe itself writes, and only
#   after the checkpoint loaded: a damaged newest checkpoint leaves the folder untouched, and a
#   user's ckpt-notes.tmp.txt survives a successful resume;
# - an output that is an input (the same file under any spelling, a set's part, a file in a
#   --data folder, a checkpoint's name in --checkpoint-dir, or another output) is a usage error
#   naming both options, and the input is unchanged;
# - a sparse 3 GiB file whose header length is 0 (as a checkpoint, the newest of a --resume
#   folder, or a set's part of the committed size) is refused in well under a second with little
#   memory: the header is checked before any data is read;
# - a checkpoint whose model_config claims a ~2 GiB Transformer is refused, naming the tensor and
#   both shapes, before the model is allocated (fast, little memory);
# - --threads beyond the cores the process may use is a usage error in train, bench, eval and
#   sample, and --help says so;
# - gpipe eval's errors say "gpipe eval", name the --data path, and no internal function; an
#   --ensemble member's name --ensemble.
# Run from the repository root: bash tests/cli/hostile.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

printf '{"family": "transformer", "vocab": 256, "dim": 16, "heads": 2, "d_ff": 32, "layers": 2, "seq_len": 16}\n' \
    >"$TMP/lm.json"
cli_write_corpus "$TMP/corpus"
mkdir "$TMP/corpusdir" && cp "$TMP/corpus" "$TMP/corpusdir/fortunes"
cli_write_idx "$TMP/syn"
BASE=(--model "$TMP/lm.json" --steps 8 --batch 8 --eval-size 4 --quiet --seed 5)
LM=("${BASE[@]}" --data "$TMP/corpus" --threads 1)
run base "${LM[@]}" --checkpoint-dir "$TMP/base" --stop-after 4
GOOD=$TMP/base/ckpt-00000004.safetensors
run cn --model convnet --data "$TMP/syn" --steps 2 --batch 16 --eval-size 16 --threads 1 --quiet \
    --checkpoint-dir "$TMP/cn"
CN=$TMP/cn/ckpt-00000002.safetensors

# expect WANT NEEDLE CMD...: CMD (gpipe's arguments) exits WANT within 20 s and its stderr
# contains NEEDLE (if not empty); stdout and stderr are left in $TMP/last.{out,err}.
expect() {
    local want=$1 needle=$2 rc
    shift 2
    timeout 20 "$GPIPE" "$@" >"$TMP/last.out" 2>"$TMP/last.err"
    rc=$?
    if [ "$rc" -eq 124 ]; then
        bad "gpipe $*: still running after 20 s (hangs?)"
    elif [ "$rc" -ne "$want" ]; then
        bad "gpipe $*: exit $rc, expected $want: $(head -c 600 "$TMP/last.err")"
    elif [ -n "$needle" ] && ! grep -qF -- "$needle" "$TMP/last.err"; then
        bad "gpipe $*: stderr lacks '$needle': $(head -c 600 "$TMP/last.err")"
    fi
}

# listing DIR: every file of DIR with its checksum, for before/after comparisons.
listing() { (cd "$1" && md5sum -- * | sort); }

# make_set DIR PART_FILE: a one-part set DIR/set.safetensors.index.json committing DIR/PART_FILE
# (a copy of $GOOD), as gp_checkpoint_commit writes them.
make_set() {
    mkdir -p "$1" && cp "$GOOD" "$1/$2"
    python3 - "$1" "$2" <<'PY' || bad "cannot write the index in $1"
import json, struct, sys, zlib
d, part = sys.argv[1:3]
b = open(f"{d}/{part}", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = {k: v for k, v in h.pop("__metadata__").items() if not k.startswith("crc32:")}
first, last = (int(x) for x in meta["layers"].split("-"))
index = {"metadata": meta,
         "parts": [{"file": part, "layers": [first, last + 1], "bytes": len(b),
                    "crc32": "%08x" % zlib.crc32(b)}],
         "weight_map": {k: part for k in h}}
json.dump(index, open(f"{d}/set.safetensors.index.json", "w"), indent=1)
PY
}

# --- 1. FIFOs are refused, never waited on ----------------------------------------------------
mkfifo "$TMP/fifo" "$TMP/fifo.safetensors.index.json"
expect 2 "$TMP/fifo: is a FIFO" train --model "$TMP/fifo"
expect 2 "$TMP/fifo: is a FIFO" eval --checkpoint "$GOOD" --model "$TMP/fifo" --data "$TMP/corpus"
expect 1 "$TMP/fifo: is a FIFO" eval --checkpoint "$TMP/fifo"
expect 1 "$TMP/fifo: is a FIFO" sample --checkpoint "$TMP/fifo"
expect 1 "$TMP/fifo.safetensors.index.json: is a FIFO" eval --checkpoint "$TMP/fifo.safetensors.index.json"
expect 1 "$TMP/fifo: not a regular file" train "${BASE[@]}" --threads 1 --data "$TMP/fifo"
make_set "$TMP/set" "set-00001-of-00001.safetensors"
expect 0 "" eval --checkpoint "$TMP/set/set.safetensors.index.json" --data "$TMP/corpus" \
    --eval-size 4
grep -q "validation loss" "$TMP/last.out" || bad "the hand-made set does not evaluate"
rm "$TMP/set/set-00001-of-00001.safetensors" && mkfifo "$TMP/set/set-00001-of-00001.safetensors"
expect 1 "$TMP/set/set-00001-of-00001.safetensors: is a FIFO" \
    eval --checkpoint "$TMP/set/set.safetensors.index.json" --data "$TMP/corpus"
grep -qF "part 1 of 1" "$TMP/last.err" || bad "a FIFO part: the message does not name the part"
mkdir "$TMP/ff" && cp "$GOOD" "$TMP/ff/" && mkfifo "$TMP/ff/ckpt-00000006.safetensors"
expect 1 "$TMP/ff/ckpt-00000006.safetensors: is a FIFO" train "${LM[@]}" --checkpoint-dir "$TMP/ff" --resume
grep -qF "resume from the previous checkpoint $TMP/ff/ckpt-00000004.safetensors" "$TMP/last.err" ||
    bad "a FIFO as the newest checkpoint: the previous one is not named: $(cat "$TMP/last.err")"

# --- 2. --resume removes only gpipe's own leftovers, and only after a load --------------------
mkdir "$TMP/tf" && cp "$GOOD" "$TMP/tf/"
USER_FILES=(ckpt-notes.tmp.txt ckpt-00000004.safetensors.tmp.notes ckpt-00000009.safetensors.tmp.12x
            ckpt-00000005.safetensors.tmp. ckpt-1.safetensors.tmp.5 ckpt-00000005-1-of-2.safetensors)
GPIPE_LEFTOVERS=(ckpt-00000005.safetensors.tmp.12345 ckpt-00000005.safetensors.index.json.tmp.777
                 ckpt-00000005-00001-of-00002.safetensors.tmp.99
                 ckpt-00000005-00002-of-00002.safetensors)
for f in "${USER_FILES[@]}" "${GPIPE_LEFTOVERS[@]}"; do echo "$f" >"$TMP/tf/$f"; done
# The newest checkpoint damaged (one data byte flipped): the resume fails and changes nothing.
python3 - "$GOOD" "$TMP/tf/ckpt-00000006.safetensors" <<'PY' || bad "cannot damage a copy"
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[-100] ^= 1
open(sys.argv[2], "wb").write(b)
PY
before=$(listing "$TMP/tf")
expect 1 "CRC-32" train "${LM[@]}" --checkpoint-dir "$TMP/tf" --resume
[ "$before" = "$(listing "$TMP/tf")" ] || bad "a failed --resume changed the folder: $(ls "$TMP/tf")"
# Moved away: the resume loads step 4, then removes gpipe's four leftovers and nothing else. A
# report in the checkpoint folder is fine (not a checkpoint's name).
mv "$TMP/tf/ckpt-00000006.safetensors" "$TMP/damaged.safetensors"
run tf_resume "${LM[@]}" --checkpoint-dir "$TMP/tf" --resume --report "$TMP/tf/report.json" &&
    grep -q "checkpoint: removed 4 incomplete file(s) left in $TMP/tf by an interrupted save" \
        "$TMP/tf_resume.out" || bad "resume after moving the damaged one: $(cat "$TMP/tf_resume.out")"
for f in "${USER_FILES[@]}"; do
    [ "$(cat "$TMP/tf/$f" 2>/dev/null)" = "$f" ] || bad "--resume removed or changed the user's $f"
done
for f in "${GPIPE_LEFTOVERS[@]}"; do [ ! -e "$TMP/tf/$f" ] || bad "--resume left $f"; done
[ -s "$TMP/tf/report.json" ] && [ -f "$TMP/tf/ckpt-00000008.safetensors" ] ||
    bad "the resumed run wrote no report or final checkpoint: $(ls "$TMP/tf")"

# --- 3. an output is never an input -------------------------------------------------------------
# On copies, so that a regression destroys nothing the later checks use.
mkdir "$TMP/in" && cp "$GOOD" "$TMP/in/ck.safetensors" && cp "$TMP/lm.json" "$TMP/in/lm.json"
CK=$TMP/in/ck.safetensors
VLM=(--model "$TMP/in/lm.json" --data "$TMP/corpus" --steps 8 --batch 8 --quiet --threads 1)
sum_before=$(cd "$TMP/in" && md5sum -- *)
expect 2 "--report $CK is the file that --checkpoint $CK reads" \
    eval --checkpoint "$CK" --report "$CK" --data "$TMP/corpus"
ln -s "$CK" "$TMP/link.json"
expect 2 "--report $TMP/link.json is the file that --checkpoint $CK reads" \
    eval --checkpoint "$CK" --report "$TMP/link.json" --data "$TMP/corpus"
expect 2 "--checkpoint" eval --checkpoint "$CK" --report "$TMP/in/../in/ck.safetensors"
make_set "$TMP/set2" "set-00001-of-00001.safetensors"
P2=$TMP/set2/set-00001-of-00001.safetensors
p2_before=$(md5sum <"$P2")
expect 2 "--report $P2 is the file that --checkpoint's part $P2 reads" \
    eval --checkpoint "$TMP/set2/set.safetensors.index.json" --report "$P2" --data "$TMP/corpus"
[ "$p2_before" = "$(md5sum <"$P2")" ] || bad "gpipe eval --report changed a set's part"
cp "$TMP/corpus" "$TMP/in/corpus"
expect 2 "--report $TMP/in/corpus is the file that --data $TMP/in/corpus reads" \
    eval --checkpoint "$GOOD" --data "$TMP/in/corpus" --report "$TMP/in/corpus"
expect 2 "--report $TMP/in/lm.json is the file that --model $TMP/in/lm.json reads" \
    train "${VLM[@]}" --report "$TMP/in/lm.json"
expect 2 "--report $TMP/in/lm.json is the file that --model $TMP/in/lm.json reads" \
    plan --model "$TMP/in/lm.json" --stages 2 --report "$TMP/in/lm.json"
[ "$sum_before" = "$(cd "$TMP/in" && md5sum -- ck.safetensors lm.json)" ] ||
    bad "a refused --report changed its input: $(cd "$TMP/in" && md5sum -- *)"
SAME=$TMP/../$(basename "$TMP")/out.svg
expect 2 "--trace $SAME and --timeline $TMP/out.svg are the same file" \
    train "${LM[@]}" --stages 2 --timeline "$TMP/out.svg" --trace "$SAME"
cp -r "$TMP/tf" "$TMP/tf2"
final_before=$(md5sum <"$TMP/tf2/ckpt-00000008.safetensors")
expect 2 "--report $TMP/tf2/ckpt-00000008.safetensors is a checkpoint's name in --checkpoint-dir $TMP/tf2" \
    train "${LM[@]}" --checkpoint-dir "$TMP/tf2" --resume --report "$TMP/tf2/ckpt-00000008.safetensors"
[ "$final_before" = "$(md5sum <"$TMP/tf2/ckpt-00000008.safetensors")" ] ||
    bad "train --report changed a checkpoint"
expect 2 "--trace $TMP/newck/ckpt-00000008.safetensors.tmp.1 is a checkpoint's name in --checkpoint-dir" \
    train "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/newck" --trace "$TMP/newck/ckpt-00000008.safetensors.tmp.1"
expect 2 "--report $TMP/corpusdir/r.json is inside --data $TMP/corpusdir" \
    train "${BASE[@]}" --threads 1 --data "$TMP/corpusdir" --report "$TMP/corpusdir/r.json"
[ ! -e "$TMP/newck" ] && [ ! -e "$TMP/out.svg" ] && [ ! -e "$TMP/corpusdir/r.json" ] ||
    bad "a refused run left files behind"

# --- 4. a sparse 3 GiB file with header length 0 ------------------------------------------------
# measure NAME CMD...: gpipe's arguments, run with stderr in $TMP/NAME.err; sets m_rc, m_s (wall
# seconds) and m_kb (peak resident KiB of gpipe).
measure() {
    local name=$1
    shift
    read -r m_rc m_s m_kb < <(python3 - "$TMP/$name.err" "$GPIPE" "$@" <<'PY'
import resource, subprocess, sys, time
t0 = time.monotonic()
with open(sys.argv[1], "wb") as err:
    try:
        rc = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=err,
                            timeout=60).returncode
    except subprocess.TimeoutExpired:
        rc = 124
print(rc, "%.2f" % (time.monotonic() - t0), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
)
}
# fast_refusal NAME NEEDLE CMD...: CMD exits 1 within 5 s, with a peak RSS under 300 MB, its
# stderr containing NEEDLE.
fast_refusal() {
    local name=$1 needle=$2
    shift 2
    measure "$name" "$@"
    [ "${m_rc:-x}" = 1 ] || bad "$name: exit ${m_rc:-?}, expected 1: $(head -c 600 "$TMP/$name.err")"
    grep -qF -- "$needle" "$TMP/$name.err" ||
        bad "$name: stderr lacks '$needle': $(head -c 600 "$TMP/$name.err")"
    python3 -c "import sys; sys.exit(not (float(sys.argv[1]) < 5 and int(sys.argv[2]) < 300000))" \
        "${m_s:-99}" "${m_kb:-999999999}" ||
        bad "$name: took ${m_s:-?} s and ${m_kb:-?} KiB at peak (expected < 5 s, < 300 MB)"
    echo "$name: refused in ${m_s:-?} s, peak RSS ${m_kb:-?} KiB"
}
truncate -s 3G "$TMP/sparse.safetensors"
ZERO="header length 0 (bytes 0..7) is too short for the JSON header"
fast_refusal sparse_eval "$TMP/sparse.safetensors: $ZERO" eval --checkpoint "$TMP/sparse.safetensors"
mkdir "$TMP/sp" && cp "$GOOD" "$TMP/sp/" && ln "$TMP/sparse.safetensors" "$TMP/sp/ckpt-00000006.safetensors"
fast_refusal sparse_resume "$TMP/sp/ckpt-00000006.safetensors: $ZERO" \
    train "${LM[@]}" --checkpoint-dir "$TMP/sp" --resume
# As a set's part of exactly the size its index committed: only the header check can catch it.
make_set "$TMP/spset" "sp-00001-of-00001.safetensors"
ln -f "$TMP/sparse.safetensors" "$TMP/spset/sp-00001-of-00001.safetensors"
python3 - "$TMP/spset/set.safetensors.index.json" <<'PY' || bad "cannot edit the index"
import json, sys
i = json.load(open(sys.argv[1]))
i["parts"][0]["bytes"] = 3 << 30
json.dump(i, open(sys.argv[1], "w"))
PY
fast_refusal sparse_part "$TMP/spset/sp-00001-of-00001.safetensors: $ZERO" \
    eval --checkpoint "$TMP/spset/set.safetensors.index.json" --data "$TMP/corpus"

# --- 5. a model_config of ~2 GiB is refused before the model is allocated -----------------------
python3 - "$GOOD" "$TMP/huge.safetensors" <<'PY' || bad "cannot write huge.safetensors"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
# The same layer kinds; 2 blocks of dim 4096, d_ff 24576: 537 M parameters, 2.1 GB.
h["__metadata__"]["model_config"] = json.dumps(
    {"family": "transformer", "vocab": 256, "dim": 4096, "heads": 16, "d_ff": 24576, "layers": 2,
     "seq_len": 16})
text = json.dumps(h).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + b[8 + n:])
PY
SHAPES="huge.safetensors: tensor \"layers.0.weight\" has shape (256, 16), the model's is (256, 4096)"
fast_refusal huge_eval "$SHAPES" eval --checkpoint "$TMP/huge.safetensors" --data "$TMP/corpus"
fast_refusal huge_sample "$SHAPES" sample --checkpoint "$TMP/huge.safetensors"

# --- 6. --threads within the cores this process may use ------------------------------------------
CORES=$(nproc)
WANT="--threads: expected an integer from 1 to $CORES (the cores this process may use)"
for t in 10000 $((CORES + 1)); do
    expect 2 "$WANT, got '$t'" train "${BASE[@]}" --data "$TMP/corpus" --threads "$t"
    expect 2 "$WANT, got '$t'" bench --workload G1 --threads "$t"
    expect 2 "$WANT, got '$t'" eval --checkpoint "$GOOD" --threads "$t"
    expect 2 "$WANT, got '$t'" sample --checkpoint "$GOOD" --threads "$t"
done
expect 0 "" eval --checkpoint "$GOOD" --data "$TMP/corpus" --eval-size 4 --threads "$CORES"
for cmd in train bench eval sample; do
    "$GPIPE" "$cmd" --help | grep -q -- "--threads N .*at most the cores" ||
        bad "gpipe $cmd --help does not give --threads' bound"
done

# --- 7. gpipe eval speaks for itself and names --data ---------------------------------------------
python3 - "$TMP" <<'PY' || bad "cannot write the mismatched IDX sets"
import os, struct, sys
for name, side, top in (("small", 16, 10), ("manylabels", 28, 13)):
    d = os.path.join(sys.argv[1], name)
    os.makedirs(d)
    n = 16
    with open(f"{d}/t10k-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, side, side) + bytes(n * side * side))
    with open(f"{d}/t10k-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes((i * 7) % top for i in range(n)))
PY
expect 2 "gpipe eval: --data $TMP/small: the t10k images are 16x16, but the model of --checkpoint $CN takes input (128, 1, 28, 28)" \
    eval --checkpoint "$CN" --data "$TMP/small"
cp "$TMP/last.err" "$TMP/eval_msgs.err"
expect 2 "gpipe eval: --data $TMP/manylabels: the t10k labels go up to 12, but the model of --checkpoint $CN outputs (128, 10)" \
    eval --checkpoint "$CN" --data "$TMP/manylabels"
cat "$TMP/last.err" >>"$TMP/eval_msgs.err"
expect 1 "gpipe eval: --data $TMP/nodata: cannot load the text corpus: $TMP/nodata" \
    eval --checkpoint "$GOOD" --data "$TMP/nodata"
cat "$TMP/last.err" >>"$TMP/eval_msgs.err"
expect 1 "gpipe eval: --data $TMP/nodata: cannot load the t10k IDX split" \
    eval --checkpoint "$CN" --data "$TMP/nodata"
cat "$TMP/last.err" >>"$TMP/eval_msgs.err"
! grep -E "gpipe train|gp_[a-z_]+:" "$TMP/eval_msgs.err" ||
    bad "gpipe eval's messages name another subcommand or an internal function"
# An --ensemble member's errors name --ensemble, not --checkpoint (which loaded fine).
expect 1 "gpipe eval: --ensemble: $TMP/nomember.safetensors: cannot open" \
    eval --checkpoint "$CN" --data "$TMP/syn" --ensemble "$TMP/nomember.safetensors"
expect 1 "gpipe eval: --ensemble: $TMP/corpus: " eval --checkpoint "$CN" --data "$TMP/syn" \
    --ensemble "$CN,$TMP/corpus"
cp "$TMP/corpus" "$TMP/member.safetensors"
expect 2 "--report $TMP/member.safetensors is the file that --ensemble $TMP/member.safetensors reads" \
    eval --checkpoint "$CN" --data "$TMP/syn" --ensemble "$TMP/member.safetensors" \
    --report "$TMP/member.safetensors"

cli_finish hostile
