#!/usr/bin/env bash
# Checkpoints under MPI (Open MPI, oversubscribed on 2 cores): each stage's rank writes its own
# part and rank 0 commits the set with an index only when every part is durable.
# - exact resume: 2N steps straight vs --stop-after N then --resume under MPI (K = 2, D = 1 and
#   D = 2): the same step losses, params_fnv1a64 and evaluation;
# - resharding: a set saved under MPI K = 2 resumes on threads with K = 1 and 3 and on one
#   device, and under MPI with K = 3; a one-file checkpoint saved on threads with K = 4 resumes
#   under MPI K = 2; all continue bit-identically; gpipe eval/sample read the index;
# - two cells per stage: an interleaved MPI run (K = 2) writes a part per cell (4, two by each
#   rank) and a zbv MPI run resumes the set, bit-identically;
# - the reference Python `safetensors` package reads every part, and the index's sizes,
#   CRC-32s and weight_map agree with the parts;
# - --keep removes whole sets; parts without an index (a save cut short) are removed on resume;
# - a part that cannot be written (its name taken by a folder) means no commit: the run fails
#   naming the rank, the other part is removed, and the previous set stays the newest;
# - a damaged or missing part of the newest set makes --resume fail (exit 1) naming the part
#   and pointing at the previous set: the set was committed complete, so its damage is reported
#   rather than silently losing the steps since the previous one.
# - in the background (the default) and with --checkpoint-sync, a set after every step: the parts
#   and the index the same bytes; every rank killed in the middle of writing its part (SIGXFSZ:
#   `ulimit -f` below a part's size) leaves the previous set the newest, which resumes exactly.
# Exit 77 (skipped) without MPI. Run from the repository root:
#   bash tests/cli/checkpoint_mpi.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"
cli_need_mpi
cli_need_pydeps

printf '{"family": "transformer", "vocab": 256, "dim": 16, "heads": 2, "d_ff": 32, "layers": 2, "seq_len": 16, "dropout": 0.1}\n' \
    >"$TMP/lm.json"
cli_write_corpus "$TMP/corpus"
LM=(--model "$TMP/lm.json" --data "$TMP/corpus" --steps 8 --batch 8 --micro-batches 4
    --eval-size 4 --threads 1 --quiet --seed 5)

# mpi_fails NAME NP ARGS...: as cli_mpirun, but the run must fail.
mpi_fails() {
    local name=$1 np=$2
    shift 2
    if timeout 300 "${MPIRUN[@]}" -np "$np" "$GPIPE" train "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"; then
        bad "$name: mpirun -np $np gpipe train $* succeeded, expected a failure"
    fi
}
files() { (cd "$1" && ls | tr '\n' ' '); }

# --- exact resume under MPI, K = 2, D = 1 -----------------------------------------------------
# Under MPI with D = 1 the bits are the threads launcher's (tests/cli/mpi.sh), and do not depend
# on K: one straight run on threads is the reference of every D = 1 run below.
run straight "${LM[@]}" --stages 2 --report "$TMP/straight.json"
cli_mpirun a 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/ck" --stop-after 4
grep -q "checkpoint: committed $TMP/ck/ckpt-00000004.safetensors.index.json (step 4, 2 parts" \
    "$TMP/a.out" || bad "no commit line: $(cat "$TMP/a.out")"
[ "$(files "$TMP/ck")" = "ckpt-00000004-00001-of-00002.safetensors ckpt-00000004-00002-of-00002.safetensors ckpt-00000004.safetensors.index.json " ] ||
    bad "the set's files: $(files "$TMP/ck")"
for k in mpi2 thr1 thr3 one mpi3; do cp -r "$TMP/ck" "$TMP/ck_$k"; done
cli_mpirun b 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/ck" --resume --report "$TMP/b.json" &&
    cli_same_run straight b
grep -q "resume: loaded $TMP/ck/ckpt-00000004.safetensors.index.json: continuing at step 4 of 8" \
    "$TMP/b.out" || bad "no resume line: $(cat "$TMP/b.out")"

# --- resharding: MPI K = 2 -> threads K = 1, 3, one device, MPI K = 3 -------------------------
run thr1 "${LM[@]}" --stages 1 --checkpoint-dir "$TMP/ck_thr1" --resume --report "$TMP/thr1.json" &&
    cli_same_run straight thr1
run thr3 "${LM[@]}" --stages 3 --checkpoint-dir "$TMP/ck_thr3" --resume --report "$TMP/thr3.json" &&
    cli_same_run straight thr3
run one "${LM[@]}" --checkpoint-dir "$TMP/ck_one" --resume --report "$TMP/one.json" &&
    cli_same_run straight one
cli_mpirun mpi3 3 "${LM[@]}" --stages 3 --checkpoint-dir "$TMP/ck_mpi3" --resume --report "$TMP/mpi3.json" &&
    cli_same_run straight mpi3
# The threads run that resumed a set writes one-file checkpoints after it.
[ -f "$TMP/ck_thr1/ckpt-00000008.safetensors" ] || bad "threads after a set: $(files "$TMP/ck_thr1")"

# --- threads K = 4 (one file) -> MPI K = 2 ----------------------------------------------------
run k4 "${LM[@]}" --stages 4 --checkpoint-dir "$TMP/k4" --stop-after 3
cli_mpirun k4to2 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/k4" --resume --report "$TMP/k4to2.json" &&
    cli_same_run straight k4to2
[ -f "$TMP/k4/ckpt-00000008.safetensors.index.json" ] || bad "MPI after a one-file checkpoint: $(files "$TMP/k4")"

# --- two cells per stage: interleaved under MPI (a part per cell) -> zbv under MPI -------------
cli_mpirun il 2 "${LM[@]}" --stages 2 --schedule interleaved --checkpoint-dir "$TMP/il" --stop-after 4
[ "$(files "$TMP/il")" = "ckpt-00000004-00001-of-00004.safetensors ckpt-00000004-00002-of-00004.safetensors ckpt-00000004-00003-of-00004.safetensors ckpt-00000004-00004-of-00004.safetensors ckpt-00000004.safetensors.index.json " ] ||
    bad "the interleaved set's files: $(files "$TMP/il")"
cli_mpirun il2zbv 2 "${LM[@]}" --stages 2 --schedule zbv --checkpoint-dir "$TMP/il" --resume \
    --report "$TMP/il2zbv.json" && cli_same_run straight il2zbv

# --- D = 2 (4 ranks): the replicas' sums differ from D = 1 by rounding, so a D = 2 reference ---
D2=("${LM[@]:0:8}" --micro-batches 2 "${LM[@]:10}" --stages 2 --data-parallel 2)
cli_mpirun d2 4 "${D2[@]}" --report "$TMP/d2.json"
cli_mpirun d2a 4 "${D2[@]}" --checkpoint-dir "$TMP/d2" --stop-after 4
[ "$(ls "$TMP/d2" | wc -l)" = 3 ] || bad "D = 2: one part per stage expected: $(files "$TMP/d2")"
cli_mpirun d2b 4 "${D2[@]}" --checkpoint-dir "$TMP/d2" --resume --report "$TMP/d2b.json" &&
    cli_same_run d2 d2b

# --- gpipe eval and sample read the index -----------------------------------------------------
IDX=$TMP/ck/ckpt-00000008.safetensors.index.json
"$GPIPE" eval --checkpoint "$IDX" --data "$TMP/corpus" --eval-size 4 --batch 8 --threads 1 \
    --report "$TMP/ev.json" >"$TMP/ev.out" 2>&1 || bad "gpipe eval of an index: $(cat "$TMP/ev.out")"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
e, t = (json.load(open(f"{d}/{n}.json")) for n in ("ev", "straight"))
need(e["eval"]["loss"] == t["eval"]["loss"], f"eval of the index: {e['eval']} vs {t['eval']}")
need(e["params_fnv1a64"] == t["params_fnv1a64"], "eval of the index: other parameters")
finish()
PY
"$GPIPE" sample --checkpoint "$IDX" --prompt "the pipe" --bytes 20 --seed 7 >"$TMP/s.txt" \
    2>"$TMP/s.err" || bad "gpipe sample of an index: $(cat "$TMP/s.err")"
head -c 8 "$TMP/s.txt" | grep -q "^the pipe$" || bad "sample of an index: $(cat "$TMP/s.txt")"

# --- the reference Python package reads the parts; the index matches them ---------------------
"$PY" - "$IDX" "$TMP/straight.json" <<'PY' || fail=$((fail + 1))
import json, os, sys, zlib
from safetensors.numpy import load_file
idx_path, report = sys.argv[1:3]
d = os.path.dirname(idx_path)
idx = json.load(open(idx_path))
errors = []
need = lambda c, w: c or errors.append(w)
meta = idx["metadata"]
need(meta["format"] == "gpipe.checkpoint" and meta["step"] == "8", f"metadata {meta}")
need([p["layers"] for p in idx["parts"]][0][0] == 0, "parts start at layer 0")
names = {}
for p in idx["parts"]:
    raw = open(os.path.join(d, p["file"]), "rb").read()
    need(len(raw) == p["bytes"], f"{p['file']}: {len(raw)} bytes, index {p['bytes']}")
    need("%08x" % zlib.crc32(raw) == p["crc32"], f"{p['file']}: CRC-32")
    for name, arr in load_file(os.path.join(d, p["file"])).items():
        names[name] = p["file"]
        need(arr.dtype.str == "<f4", f"{name}: dtype")
need(names == idx["weight_map"], "weight_map differs from the parts' tensors")
need(any(n.endswith(".adam_v") for n in names), "no optimizer state")
for e in errors:
    print("FAIL: python safetensors:", e)
sys.exit(1 if errors else 0)
PY

# --- --keep removes whole sets; orphan parts and temporary files are cleaned on resume --------
cli_mpirun keep 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/keep" --checkpoint-every 1 --keep 2
[ "$(files "$TMP/keep")" = "ckpt-00000007-00001-of-00002.safetensors ckpt-00000007-00002-of-00002.safetensors ckpt-00000007.safetensors.index.json ckpt-00000008-00001-of-00002.safetensors ckpt-00000008-00002-of-00002.safetensors ckpt-00000008.safetensors.index.json " ] ||
    bad "--keep 2 under MPI kept: $(files "$TMP/keep")"
cp -r "$TMP/ck_mpi2" "$TMP/orphan"
cp "$TMP/orphan/ckpt-00000004-00001-of-00002.safetensors" "$TMP/orphan/ckpt-00000006-00001-of-00002.safetensors"
echo partial >"$TMP/orphan/ckpt-00000006-00002-of-00002.safetensors.tmp.12345"
cli_mpirun orphan 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/orphan" --resume --stop-after 5 \
    --report "$TMP/orphan.json"
grep -q "removed 2 incomplete file(s) left in $TMP/orphan by an interrupted save" "$TMP/orphan.out" ||
    bad "orphans not removed: $(cat "$TMP/orphan.out")"
grep -q "continuing at step 4 of 8" "$TMP/orphan.out" || bad "orphan: not resumed at step 4"
[ ! -e "$TMP/orphan/ckpt-00000006-00001-of-00002.safetensors" ] || bad "orphan part left"

# --- a part that cannot be written: no commit -------------------------------------------------
# Step 4's second part (rank 1) cannot take its name: the rename onto a folder (not empty, so
# that the start-up clean-up of orphan parts leaves it) fails.
mkdir -p "$TMP/fail/ckpt-00000004-00002-of-00002.safetensors/x"
mpi_fails fail 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/fail" --checkpoint-every 2
grep -q "checkpoint $TMP/fail/ckpt-00000004.safetensors.index.json: a part was not written, so the set is not committed: rank 1 (stage 1 of replica 0) failed" \
    "$TMP/fail.err" || bad "failed part: no message naming the rank: $(grep -v '^ ' "$TMP/fail.err" | head -c 1500)"
[ -f "$TMP/fail/ckpt-00000002.safetensors.index.json" ] || bad "failed part: step 2's set is gone"
[ ! -e "$TMP/fail/ckpt-00000004.safetensors.index.json" ] || bad "failed part: step 4 was committed"
[ ! -e "$TMP/fail/ckpt-00000004-00001-of-00002.safetensors" ] ||
    bad "failed part: rank 0's part of the uncommitted set was left behind"
rm -r "$TMP/fail/ckpt-00000004-00002-of-00002.safetensors"
cli_mpirun fail_resume 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/fail" --resume \
    --report "$TMP/fail_resume.json" && cli_same_run straight fail_resume
grep -q "continuing at step 2 of 8" "$TMP/fail_resume.out" || bad "not resumed from step 2"

# --- a damaged or missing part of the newest set: a named error, nothing changed --------------
# expect_damaged NAME WHAT NEEDLE: --resume in $TMP/dmg (MPI and threads) exits 1 naming the
# part and NEEDLE and the previous set, and leaves the folder as it was.
expect_damaged() {
    local name=$1 part=$2 needle=$3 before after
    before=$(cd "$TMP/dmg" && md5sum -- * 2>/dev/null | sort)
    mpi_fails "dmg_$name" 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/dmg" --resume
    grep -qF "$part" "$TMP/dmg_$name.err" && grep -qF -- "$needle" "$TMP/dmg_$name.err" ||
        bad "$name: expected $part and '$needle' in: $(grep -v '^ ' "$TMP/dmg_$name.err" | head -c 1500)"
    grep -qF "to resume from the previous checkpoint $TMP/dmg/ckpt-00000002.safetensors.index.json" \
        "$TMP/dmg_$name.err" || bad "$name: the previous set is not named: $(head -c 1500 "$TMP/dmg_$name.err")"
    "$GPIPE" train "${LM[@]}" --stages 3 --checkpoint-dir "$TMP/dmg" --resume >/dev/null 2>"$TMP/dmgt_$name.err"
    local rc=$?
    [ $rc = 1 ] && grep -qF -- "$needle" "$TMP/dmgt_$name.err" ||
        bad "$name on threads: exit $rc: $(cat "$TMP/dmgt_$name.err")"
    after=$(cd "$TMP/dmg" && md5sum -- * 2>/dev/null | sort)
    [ "$before" = "$after" ] || bad "$name: the checkpoint folder changed"
}
cli_mpirun dmg0 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/dmg0" --checkpoint-every 2 --stop-after 4
P2=ckpt-00000004-00002-of-00002.safetensors
rm -rf "$TMP/dmg" && cp -r "$TMP/dmg0" "$TMP/dmg"
python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-100]^=1; open(p,'wb').write(b)" "$TMP/dmg/$P2"
expect_damaged flipped "$TMP/dmg/$P2" "the part was damaged or replaced after the set was saved"
rm -rf "$TMP/dmg" && cp -r "$TMP/dmg0" "$TMP/dmg" && rm "$TMP/dmg/$P2"
expect_damaged missing "$TMP/dmg/$P2" "cannot open: No such file or directory"
rm -rf "$TMP/dmg" && cp -r "$TMP/dmg0" "$TMP/dmg"
python3 -c "import sys; p=sys.argv[1]; t=open(p).read(); open(p,'w').write(t[:len(t)//2])" \
    "$TMP/dmg/ckpt-00000004.safetensors.index.json"
expect_damaged bad_index "$TMP/dmg/ckpt-00000004.safetensors.index.json" "not a JSON object"

# --- in the background: the same bytes as --checkpoint-sync; killed in the middle of a save ------
cli_mpirun mbg 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/mbg" --checkpoint-every 1 --keep 20
cli_mpirun msy 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/msy" --checkpoint-every 1 --keep 20 \
    --checkpoint-sync
[ "$(ls "$TMP/mbg" | grep -c 'index.json$')" = 8 ] || bad "background sets: $(files "$TMP/mbg")"
[ "$(files "$TMP/mbg")" = "$(files "$TMP/msy")" ] ||
    bad "background $(files "$TMP/mbg") vs sync $(files "$TMP/msy")"
for f in "$TMP/mbg"/*; do
    cmp -s "$f" "$TMP/msy/$(basename "$f")" || bad "$(basename "$f"): background and sync differ"
done
grep -q "checkpoint: committed $TMP/mbg/ckpt-00000002.safetensors.index.json (step 2, 2 parts, copied in" \
    "$TMP/mbg.out" || bad "no background commit line: $(cat "$TMP/mbg.out")"
cli_mpirun mk1 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/mkill" --checkpoint-every 1 --keep 2 \
    --stop-after 3
# In KiB: half a part; every other file of the run is smaller.
limit=$(($(stat -c %s "$TMP/mbg/ckpt-00000004-00001-of-00002.safetensors") / 2048))
# Open MPI's shared-memory files would hit the limit first: PMIx's store and the messages go
# through memory and TCP instead.
(ulimit -f "$limit"; PMIX_MCA_gds=hash OMPI_MCA_btl=tcp,self timeout -k 10 300 "${MPIRUN[@]}" -np 2 \
    "$GPIPE" train "${LM[@]}" --stages 2 \
    --checkpoint-dir "$TMP/mkill" --checkpoint-every 1 --keep 2 --resume >"$TMP/mk2.out" 2>"$TMP/mk2.err")
[ $? != 0 ] || bad "the run with a file size limit below a part's size succeeded"
[ -f "$TMP/mkill/ckpt-00000003.safetensors.index.json" ] &&
    [ ! -e "$TMP/mkill/ckpt-00000004.safetensors.index.json" ] &&
    compgen -G "$TMP/mkill/ckpt-00000004-0000?-of-00002.safetensors.tmp.*" >/dev/null ||
    bad "after the kill: $(files "$TMP/mkill"), expected set 3 and a temporary part of step 4"
cli_mpirun mk3 2 "${LM[@]}" --stages 2 --checkpoint-dir "$TMP/mkill" --checkpoint-every 1 --keep 2 \
    --resume --report "$TMP/mk3.json" && cli_same_run straight mk3
grep -q "resume: loaded $TMP/mkill/ckpt-00000003.safetensors.index.json: continuing at step 3 of 8" \
    "$TMP/mk3.out" || bad "did not resume from set 3: $(cat "$TMP/mk3.out")"
grep -q "signal 25" "$TMP/mk2.err" || bad "no rank was killed by SIGXFSZ: $(tail -c 600 "$TMP/mk2.err")"

cli_finish checkpoint_mpi
