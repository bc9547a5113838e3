#!/usr/bin/env bash
# Checkpoints through `gpipe train`, `gpipe eval` and `gpipe sample`:
# - exact resume: 2N steps straight vs --steps 2N --stop-after N then --resume: the same step
#   losses and params_fnv1a64, for the LM on one device and on pipelines, saved with K = 4 and
#   resumed with K = 1, 2, 3 and the reverse, and for the ConvNet stopped mid-epoch;
# - --resume on an empty folder starts fresh and says so; --keep keeps the newest K;
# - gpipe eval --checkpoint gives the training run's evaluation for both models; gpipe sample
#   continues a prompt, the same seed giving the same text;
# - the reference Python `safetensors` package reads a checkpoint: every tensor's CRC-32 holds
#   and the parameters hash to the report's params_fnv1a64;
# - hostile files (flipped byte, truncation, header length past the end, oversized or malformed
#   header JSON, overlapping offsets, wrong dtype/shape/name, another model's checkpoint,
#   other options) exit 1 with a message naming the file and what was expected, and nothing in
#   the checkpoint folder is changed.
# Run from the repository root: bash tests/cli/checkpoint.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"
cli_need_pydeps

printf '{"family": "transformer", "vocab": 256, "dim": 16, "heads": 2, "d_ff": 32, "layers": 2, "seq_len": 16, "dropout": 0.1}\n' \
    >"$TMP/lm.json"
printf '{"family": "transformer", "vocab": 256, "dim": 24, "heads": 2, "d_ff": 32, "layers": 2, "seq_len": 16}\n' \
    >"$TMP/other.json"
cli_write_corpus "$TMP/corpus"
cli_write_idx "$TMP/syn"

LM=(--model "$TMP/lm.json" --data "$TMP/corpus" --steps 8 --batch 8 --micro-batches 4
    --eval-size 4 --threads 1 --quiet --seed 5)
# 48 images in batches of 16: 3 steps per epoch, so step 4 stops in the middle of epoch 1.
CN=(--model convnet --data "$TMP/syn" --steps 7 --batch 16 --micro-batches 2 --eval-size 16
    --threads 1 --quiet --seed 5)


# --- exact resume, one device and pipelines ------------------------------------------------
run lm_straight "${LM[@]}" --report "$TMP/lm_straight.json"
run lm_a "${LM[@]}" --checkpoint-dir "$TMP/ck1" --stop-after 4 --report "$TMP/lm_a.json"
grep -q "stopped after step 4 of 8" "$TMP/lm_a.out" || bad "no stop line: $(cat "$TMP/lm_a.out")"
grep -q "checkpoint: wrote $TMP/ck1/ckpt-00000004.safetensors" "$TMP/lm_a.out" ||
    bad "no checkpoint line in $(cat "$TMP/lm_a.out")"
run lm_b "${LM[@]}" --checkpoint-dir "$TMP/ck1" --resume --report "$TMP/lm_b.json"
grep -q "resume: loaded $TMP/ck1/ckpt-00000004.safetensors: continuing at step 4 of 8" \
    "$TMP/lm_b.out" || bad "no resume line in $(cat "$TMP/lm_b.out")"
cli_same_run lm_straight lm_b

# Saved on 4 stages, resumed on 1, 2 and 3 (and on one device); saved on 1, 2, 3, resumed on 4.
run lm_k4 "${LM[@]}" --stages 4 --checkpoint-dir "$TMP/k4" --stop-after 4
for k in 0 1 2 3; do
    rm -rf "$TMP/k4_$k" && cp -r "$TMP/k4" "$TMP/k4_$k"
    stages=(); [ "$k" -gt 0 ] && stages=(--stages "$k")
    run "lm_4to$k" "${LM[@]}" "${stages[@]}" --checkpoint-dir "$TMP/k4_$k" --resume \
        --report "$TMP/lm_4to$k.json" && cli_same_run lm_straight "lm_4to$k"
    if [ "$k" -gt 0 ]; then
        run "lm_k$k" "${LM[@]}" --stages "$k" --checkpoint-dir "$TMP/k${k}to4" --stop-after 3
        run "lm_${k}to4" "${LM[@]}" --stages 4 --checkpoint-dir "$TMP/k${k}to4" --resume \
            --report "$TMP/lm_${k}to4.json" && cli_same_run lm_straight "lm_${k}to4"
    fi
done

# The classifier, stopped in the middle of an epoch (the shuffled order must be rebuilt).
run cn_straight "${CN[@]}" --report "$TMP/cn_straight.json"
run cn_a "${CN[@]}" --checkpoint-dir "$TMP/cn" --checkpoint-every 2 --stop-after 4
run cn_b "${CN[@]}" --stages 3 --checkpoint-dir "$TMP/cn" --resume --report "$TMP/cn_b.json" &&
    cli_same_run cn_straight cn_b

# --- --resume on a folder without a complete checkpoint, --keep ------------------------------
# (what a run killed during its first save leaves: a temporary file, removed on the resume)
mkdir -p "$TMP/fresh"
printf 'torn' >"$TMP/fresh/ckpt-00000001.safetensors.tmp.4242"
run lm_fresh "${LM[@]}" --checkpoint-dir "$TMP/fresh" --resume --checkpoint-every 1 --keep 2 \
    --report "$TMP/lm_fresh.json"
grep -q "resume: no checkpoint in $TMP/fresh; starting fresh at step 0" "$TMP/lm_fresh.out" ||
    bad "--resume on an empty folder does not say it starts fresh"
grep -q "removed 1 incomplete file(s) left in $TMP/fresh" "$TMP/lm_fresh.out" ||
    bad "--resume without a complete checkpoint kept the interrupted save's temporary file"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, os, sys
from clicheck import finish, need
d = sys.argv[1]
a, b = (json.load(open(f"{d}/{n}.json")) for n in ("lm_straight", "lm_fresh"))
need(a["params_fnv1a64"] == b["params_fnv1a64"], "fresh start differs from the straight run")
kept = sorted(os.listdir(f"{d}/fresh"))
need(kept == ["ckpt-00000007.safetensors", "ckpt-00000008.safetensors"], f"--keep 2 kept {kept}")
finish()
PY

# A fresh run into a folder that holds checkpoints is refused (it would mix with them).
"$GPIPE" train "${LM[@]}" --checkpoint-dir "$TMP/ck1" >/dev/null 2>"$TMP/mix.err"
[ $? -eq 1 ] && grep -q "already holds checkpoints (the newest at step 8): add --resume" \
    "$TMP/mix.err" || bad "a fresh run into a used folder: $(cat "$TMP/mix.err")"

"$GPIPE" train "${LM[@]}" --checkpoint-dir "$TMP/ck1" --resume --stop-after 3 >/dev/null \
    2>"$TMP/sa.err"
[ $? -eq 1 ] && grep -q -- "--stop-after 3: the run resumed at step 8, past it" "$TMP/sa.err" ||
    bad "--stop-after before the checkpoint's step: $(cat "$TMP/sa.err")"

# --- eval and sample --------------------------------------------------------------------------
# In training's batches (--batch 8 and 16) and threads: the same GEMM shapes, so its figures bit
# for bit (other batches may round otherwise: OpenBLAS picks kernels by shape).
CK=$TMP/fresh/ckpt-00000008.safetensors
"$GPIPE" eval --checkpoint "$CK" --data "$TMP/corpus" --eval-size 4 --batch 8 --threads 1 --report "$TMP/ev_lm.json" \
    >"$TMP/ev_lm.out" 2>&1 || bad "gpipe eval (LM) failed: $(cat "$TMP/ev_lm.out")"
"$GPIPE" eval --checkpoint "$TMP/cn/ckpt-00000007.safetensors" --data "$TMP/syn" \
    --eval-size 16 --batch 16 --threads 1 --report "$TMP/ev_cn.json" >"$TMP/ev_cn.out" 2>&1 ||
    bad "gpipe eval (convnet) failed: $(cat "$TMP/ev_cn.out")"
grep -q "test accuracy" "$TMP/ev_cn.out" || bad "gpipe eval (convnet) printed no accuracy"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
for ev, tr in (("ev_lm", "lm_straight"), ("ev_cn", "cn_straight")):
    e, t = (json.load(open(f"{d}/{n}.json")) for n in (ev, tr))
    need(e["eval"]["loss"] == t["eval"]["loss"], f"{ev}: loss {e['eval']} vs training's {t['eval']}")
    need(e["params_fnv1a64"] == t["params_fnv1a64"], f"{ev}: other parameters")
    if "accuracy" in t["eval"]:
        need(e["eval"]["accuracy"] == t["eval"]["accuracy"], f"{ev}: accuracy")
finish()
PY
for i in 1 2 3; do
    seed=$([ "$i" = 3 ] && echo 8 || echo 7)
    "$GPIPE" sample --checkpoint "$CK" --prompt "the pipe" --bytes 40 --seed "$seed" \
        >"$TMP/s$i.txt" 2>"$TMP/s$i.err" || bad "gpipe sample failed: $(cat "$TMP/s$i.err")"
done
head -c 8 "$TMP/s1.txt" | grep -q "^the pipe$" || bad "sample does not start with the prompt"
[ "$(wc -c <"$TMP/s1.txt")" -eq 49 ] || bad "sample: $(wc -c <"$TMP/s1.txt") bytes, expected 8 + 40 + newline"
cmp -s "$TMP/s1.txt" "$TMP/s2.txt" || bad "sample: the same seed gave different text"
cmp -s "$TMP/s1.txt" "$TMP/s3.txt" && bad "sample: another seed gave the same text"
"$GPIPE" sample --checkpoint "$TMP/cn/ckpt-00000007.safetensors" >/dev/null 2>"$TMP/s4.err"
[ $? -eq 1 ] && grep -q "not a byte language model" "$TMP/s4.err" ||
    bad "sample of a classifier: $(cat "$TMP/s4.err")"

# --- the reference Python safetensors package reads gpipe's files ----------------------------
"$PY" - "$CK" "$TMP/lm_fresh.json" <<'PY' || fail=$((fail + 1))
import json, sys, zlib
from safetensors import safe_open
from safetensors.numpy import load_file
path, report = sys.argv[1:3]
errors = []
tensors = load_file(path)
with safe_open(path, "np") as f:
    meta = f.metadata()
need = lambda c, w: c or errors.append(w)
need(meta["format"] == "gpipe.checkpoint" and meta["step"] == "8", f"metadata {meta}")
need(json.loads(meta["model_config"])["dim"] == 16, "model_config")
for name, arr in tensors.items():
    need(arr.dtype.str == "<f4", f"{name}: dtype {arr.dtype}")
    need("%08x" % zlib.crc32(arr.tobytes()) == meta["crc32:" + name], f"{name}: CRC-32")
need(any(n.endswith(".attn.qkv.weight.adam_m") for n in tensors), "no AdamW state by name")
# params_fnv1a64: FNV-1a over the parameters (not the optimizer state) in file order, which is
# layer order; the header's offsets give that order.
with open(path, "rb") as fp:
    n = int.from_bytes(fp.read(8), "little")
    header = json.loads(fp.read(n))
names = sorted((k for k in header if k != "__metadata__" and not k.endswith(("adam_m", "adam_v"))),
               key=lambda k: header[k]["data_offsets"][0])
h = 0xcbf29ce484222325
for k in names:
    for b in tensors[k].tobytes():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
want = json.load(open(report))["params_fnv1a64"]
need("%016x" % h == want, f"params hash {h:016x} vs the report's {want}")
for e in errors:
    print("FAIL: python safetensors:", e)
sys.exit(1 if errors else 0)
PY

# --- hostile files --------------------------------------------------------------------------
# expect_bad NAME NEEDLE: gpipe train --resume and gpipe eval on $TMP/bad/ckpt-00000008 exit 1,
# the message names the file and contains NEEDLE, and the folder's files are unchanged.
expect_bad() {
    local name=$1 needle=$2 before after
    before=$(cd "$TMP/bad" && md5sum * | sort)
    "$GPIPE" train "${LM[@]}" --checkpoint-dir "$TMP/bad" --resume >"$TMP/bad_$name.out" \
        2>"$TMP/bad_$name.err"
    local rc=$?
    [ $rc -eq 1 ] || bad "$name: train --resume exit $rc, expected 1: $(cat "$TMP/bad_$name.err")"
    grep -qF "$TMP/bad/ckpt-00000008.safetensors" "$TMP/bad_$name.err" ||
        bad "$name: the message does not name the file: $(cat "$TMP/bad_$name.err")"
    grep -qF -- "$needle" "$TMP/bad_$name.err" ||
        bad "$name: expected '$needle' in: $(cat "$TMP/bad_$name.err")"
    "$GPIPE" eval --checkpoint "$TMP/bad/ckpt-00000008.safetensors" --data "$TMP/corpus" \
        --eval-size 4 >/dev/null 2>"$TMP/bad_${name}_eval.err"
    rc=$?
    [ $rc -eq 1 ] || [ "$name" = options ] || [ "$name" = other_model ] ||
        bad "$name: eval exit $rc, expected 1: $(cat "$TMP/bad_${name}_eval.err")"
    after=$(cd "$TMP/bad" && md5sum * | sort)
    [ "$before" = "$after" ] || bad "$name: the checkpoint folder changed"
}
GOOD=$TMP/fresh/ckpt-00000008.safetensors
# mutate NAME PYTHON: $TMP/bad holds the good checkpoint changed by PYTHON (b: bytearray).
mutate() {
    rm -rf "$TMP/bad" && mkdir "$TMP/bad"
    python3 - "$GOOD" "$TMP/bad/ckpt-00000008.safetensors" "$2" <<'PY' || bad "mutate $1"
import json, struct, sys
src, dst, code = sys.argv[1:4]
b = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
def put_header(h):
    global b
    text = json.dumps(h).encode()
    text += b" " * (-len(text) % 8)
    b = bytearray(struct.pack("<Q", len(text))) + text + b[8 + n:]
exec(code)
open(dst, "wb").write(b)
PY
}
mutate flip 'b[len(b) - 100] ^= 0x01'
expect_bad flip "CRC-32"
mutate truncated 'b = b[:len(b) - 10]'
expect_bad truncated "data bytes of the file (truncated?)"
mutate past_eof 'b[0:8] = struct.pack("<Q", len(b))'
expect_bad past_eof "runs past the end of the file"
mutate oversized 'b[0:8] = struct.pack("<Q", 1 << 40)'
expect_bad oversized "over the 104857600-byte limit"
mutate malformed 'b[9] = ord("x")'
expect_bad malformed "not a well-formed JSON object"
mutate overlap 'k = "layers.1.weight"; h[k]["data_offsets"] = [x - 4 for x in h[k]["data_offsets"]]; put_header(h)'
expect_bad overlap "overlap tensor"
mutate dtype 'h["layers.1.weight"]["dtype"] = "I32"; put_header(h)'
expect_bad dtype 'tensor "layers.1.weight" is I32, expected F32'
mutate shape 's = h["layers.0.weight"]["shape"]; h["layers.0.weight"]["shape"] = [s[1], s[0]]; put_header(h)'
expect_bad shape 'tensor "layers.0.weight" has shape (16, 256), the model'"'"'s is (256, 16)'
mutate name 'h["layers.1.wieght"] = h.pop("layers.1.weight"); m = h["__metadata__"]; m["crc32:layers.1.wieght"] = m.pop("crc32:layers.1.weight"); put_header(h)'
expect_bad name '"layers.1.wieght" is not a parameter'
mutate nocrc 'del h["__metadata__"]["crc32:layers.2.attn.qkv.bias"]; put_header(h)'
expect_bad nocrc 'tensor "layers.2.attn.qkv.bias" has no checksum'
run other "--model" "$TMP/other.json" --data "$TMP/corpus" --steps 8 --batch 8 --eval-size 4 \
    --threads 1 --quiet --checkpoint-dir "$TMP/otherck"
rm -rf "$TMP/bad" && mkdir "$TMP/bad" && cp "$TMP/otherck/ckpt-00000008.safetensors" "$TMP/bad/"
expect_bad other_model "was saved from model config"
rm -rf "$TMP/bad" && mkdir "$TMP/bad" && cp "$GOOD" "$TMP/bad/"
"$GPIPE" train "${LM[@]}" --lr 0.01 --checkpoint-dir "$TMP/bad" --resume >/dev/null 2>"$TMP/opt.err"
[ $? -eq 1 ] && grep -q -- "--lr 0.01 differs from the checkpoint's 0.0003" "$TMP/opt.err" ||
    bad "other --lr on resume: $(cat "$TMP/opt.err")"
"$GPIPE" eval --checkpoint "$TMP/otherck/ckpt-00000008.safetensors" --model "$TMP/lm.json" \
    --data "$TMP/corpus" >/dev/null 2>"$TMP/om.err"
[ $? -eq 1 ] && grep -q "has shape (256, 24), the model's is (256, 16)" "$TMP/om.err" ||
    bad "eval of another model's checkpoint: $(cat "$TMP/om.err")"

# --- usage ------------------------------------------------------------------------------------
for args in "--resume" "--keep 2" "--checkpoint-every 3"; do
    # shellcheck disable=SC2086
    "$GPIPE" train "${LM[@]}" $args >/dev/null 2>"$TMP/u.err"
    [ $? -eq 2 ] && grep -q -- "${args%% *}: only with --checkpoint-dir" "$TMP/u.err" ||
        bad "train $args without --checkpoint-dir: $(cat "$TMP/u.err")"
done
"$GPIPE" eval >/dev/null 2>"$TMP/u.err"
[ $? -eq 2 ] && grep -q -- "--checkpoint: required" "$TMP/u.err" || bad "eval without --checkpoint"
"$GPIPE" eval --checkpoint /nonexistent.safetensors >/dev/null 2>"$TMP/u.err"
[ $? -eq 1 ] && grep -q "/nonexistent.safetensors: cannot open" "$TMP/u.err" ||
    bad "eval of a missing file: $(cat "$TMP/u.err")"

cli_finish checkpoint
