#!/usr/bin/env bash
# Token datasets: a byte-level BPE trained here on the fortunes with the `tokenizers` package
# (PyPI, in .pyenv/), the fortunes written as an llm.c .bin shard and as raw uint16 and uint32
# files. The three formats train to the same bits; ids of bytes written as uint16 train to the
# bits of the same text read as a corpus; K = 2 gives K = 1's bits; --val-data is the validation
# set (gpipe eval agrees); every bad file exits 1 before training naming the file and the byte
# offset; gpipe sample --tokenizer encodes text to the package's ids and prints what it decodes.
# Skipped (exit 77) without the tokenizers package or the fortunes.
# Run from the repository root: bash tests/cli/tokens.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

PY=${GP_PYTHON:-$PWD/.pyenv/bin/python}
if ! "$PY" -c "import tokenizers, numpy" 2>/dev/null; then
    echo "SKIP: $PY cannot import tokenizers and numpy (make pydeps installs them from PyPI)"
    exit 77
fi
FORTUNES=/usr/share/games/fortunes
if [ ! -f "$FORTUNES/fortunes" ] || [ ! -d "$FORTUNES/de" ]; then
    echo "SKIP: no fortunes in $FORTUNES (Debian's fortunes and fortunes-de packages)"
    exit 77
fi

# The tokenizer (vocabulary 512: the 256 bytes and 256 merges, those of 's and 't among them), the
# shards and the bad files.
"$PY" - "$TMP" "$FORTUNES" <<'PY' || { echo "FAIL: cannot make the tokenizer and the shards"; exit 1; }
import json, os, sys
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
d, src = sys.argv[1], sys.argv[2]
text = ""
for name in ("fortunes", "de/anekdoten", "ru/2001.03"):
    with open(os.path.join(src, name), encoding="utf-8", errors="replace") as f:
        text += f.read()
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator([text], trainers.BpeTrainer(
    vocab_size=512, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(f"{d}/tok.json")
ids = np.array(tok.encode(text).ids, dtype=np.int64)
assert ids.max() < 512 and len(ids) > 4000, (ids.max(), len(ids))
val, train = ids[:len(ids) // 10], ids[len(ids) // 10:]

def llmc(path, a, count=None, magic=20240520, version=1):
    h = np.zeros(256, np.int32)
    h[:3] = magic, version, len(a) if count is None else count
    with open(path, "wb") as f:
        f.write(h.tobytes() + np.asarray(a, np.uint16).tobytes())

llmc(f"{d}/train.bin", train)
llmc(f"{d}/val.bin", val)
llmc(f"{d}/tiny.bin", val[:10])
train.astype(np.uint16).tofile(f"{d}/train.u16")
val.astype(np.uint16).tofile(f"{d}/val.u16")
train.astype(np.uint32).tofile(f"{d}/train.u32")
val.astype(np.uint32).tofile(f"{d}/val.u32")
# The encoder's check: the whole text (less the final newlines a shell's $(...) drops) and its ids.
enc = text.rstrip("\n")
open(f"{d}/enc.txt", "w", encoding="utf-8").write(enc)
json.dump(tok.encode(enc).ids, open(f"{d}/enc.json", "w"))
# A second tokenizer with the other options: a prefix space, whole words before merges, an added
# token; its check: a part of the text with the added token in it.
tokp = Tokenizer(models.BPE(ignore_merges=True))
tokp.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
tokp.decoder = decoders.ByteLevel()
tokp.train_from_iterator([text], trainers.BpeTrainer(
    vocab_size=512, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    special_tokens=["<|end|>"]))
tokp.save(f"{d}/tokp.json")
encp = enc[:3000] + "<|end|>Hello<|end|> world"
open(f"{d}/encp.txt", "w", encoding="utf-8").write(encp)
json.dump(tokp.encode(encp).ids, open(f"{d}/encp.json", "w"))

# Bad files, each with the message it must give (file and byte offset): "name|format|message".
bad = []
def case(name, fmt, msg):
    bad.append(f"{name}|{fmt}|{msg}")
open(f"{d}/short.bin", "wb").write(open(f"{d}/train.bin", "rb").read()[:600])
case("short.bin", "llmc", "short.bin: 600 bytes, shorter than llm.c's header of 1024 bytes (256 int32; truncated at byte offset 600)")
raw = open(f"{d}/train.bin", "rb").read()
open(f"{d}/cut.bin", "wb").write(raw[:1024 + 2 * 1000 + 1])
case("cut.bin", "llmc", f"cut.bin: byte offset 8: the header says {len(train)} tokens, {1024 + 2 * len(train)} bytes in all, but the file ends at byte offset 3025")
llmc(f"{d}/long.bin", train, count=len(train) - 5)
case("long.bin", "llmc", f"long.bin: byte offset 8: the header says {len(train) - 5} tokens, {1024 + 2 * (len(train) - 5)} bytes in all, but the file has 10 more bytes from byte offset {1024 + 2 * (len(train) - 5)}")
llmc(f"{d}/magic.bin", train, magic=20240521)
case("magic.bin", "llmc", "magic.bin: byte offset 0: magic 20240521, expected 20240520")
llmc(f"{d}/version.bin", train, version=2)
case("version.bin", "llmc", "version.bin: byte offset 4: version 2, expected 1")
t2 = train.copy(); t2[777] = 512
llmc(f"{d}/id.bin", t2)
case("id.bin", "llmc", f"id.bin: byte offset {1024 + 2 * 777}: token id 512 (token 777 of the file) is not below the vocabulary of 512")
t2.astype(np.uint16).tofile(f"{d}/id.u16")
case("id.u16", "u16", f"id.u16: byte offset {2 * 777}: token id 512 (token 777 of the file) is not below the vocabulary of 512")
t3 = train.astype(np.uint32); t3[1234] = 70000
t3.tofile(f"{d}/id.u32")
case("id.u32", "u32", f"id.u32: byte offset {4 * 1234}: token id 70000 (token 1234 of the file) is not below the vocabulary of 512")
open(f"{d}/odd.u16", "wb").write(open(f"{d}/train.u16", "rb").read()[:2001])
case("odd.u16", "u16", "odd.u16: 2001 bytes, not a whole number of uint16 token ids (a partial id at byte offset 2000")
open(f"{d}/odd.u32", "wb").write(open(f"{d}/train.u32", "rb").read()[:4002])
case("odd.u32", "u32", "odd.u32: 4002 bytes, not a whole number of uint32 token ids (a partial id at byte offset 4000")
llmc(f"{d}/empty.bin", [])
case("empty.bin", "llmc", "empty.bin: no token ids after the 1024-byte header")
open(f"{d}/bad_cases", "w").write("\n".join(bad) + "\n")
PY

printf '{"family": "transformer", "vocab": 512, "dim": 32, "heads": 4, "d_ff": 64, "layers": 2, "seq_len": 32}\n' >"$TMP/tok512.json"
M=(--model "$TMP/tok512.json" --steps 6 --batch 4 --micro-batches 2 --eval-size 6 --threads 1 --quiet --seed 5)

# The three formats of the same ids: the same windows, so the same bits.
run bin "${M[@]}" --data "$TMP/train.bin" --val-data "$TMP/val.bin" --report "$TMP/bin.json" \
    --checkpoint-dir "$TMP/ck" --sample 24 --tokenizer "$TMP/tok.json"
run u16 "${M[@]}" --data "$TMP/train.u16" --data-format u16 --val-data "$TMP/val.u16" --report "$TMP/u16.json"
run u32 "${M[@]}" --data "$TMP/train.u32" --data-format u32 --vocab 512 --val-data "$TMP/val.u32" \
    --report "$TMP/u32.json"
# K = 2 (1 thread per stage, as the one device had) and another schedule: the same bits.
run k2 "${M[@]}" --data "$TMP/train.bin" --val-data "$TMP/val.bin" --stages 2 --schedule 1f1b \
    --report "$TMP/k2.json"
# No --val-data: the last 1/20 of --data validates, the rest trains.
run split "${M[@]}" --data "$TMP/train.bin" --report "$TMP/split.json"
grep -q "training on $TMP/train.bin (llmc, ids below 512): .* tokens (its last 1/20)" "$TMP/split.out" ||
    bad "the split run does not say how it split: $(grep 'training on' "$TMP/split.out")"
"$PY" - "$TMP" <<'PY' || fail=$((fail + 1))
import json, re, sys
import numpy as np
from clicheck import errors, finish, load, need
d = sys.argv[1]
r = {n: load(d, n) for n in ("bin", "u16", "u32", "k2", "split")}
h = {n: v.get("params_fnv1a64") for n, v in r.items()}
need(h["bin"] is not None and h["bin"] == h["u16"] == h["u32"], f"formats: hashes {h}")
need(h["k2"] == h["bin"], f"K = 2: {h['k2']}, K = 1: {h['bin']}")
need(r["bin"].get("train", {}).get("step_losses") == r["k2"].get("train", {}).get("step_losses"),
     "K = 2: other step losses")
ev = r["bin"].get("eval", {})
need(ev.get("loss") == r["u16"].get("eval", {}).get("loss") == r["u32"].get("eval", {}).get("loss"),
     "formats: other validation losses")
need("bits_per_token" in ev and "bits_per_byte" not in ev, f"eval keys {sorted(ev)}")
need(h["split"] != h["bin"], "the split run trained on the same windows as the full file")
n = (len(open(f"{d}/train.u16", "rb").read()) // 2)
out = open(f"{d}/split.out").read()
m = re.search(r"(\d+) training / (\d+) validation tokens", out)
need(m and (int(m.group(1)), int(m.group(2))) == (n - n // 20, n // 20), f"split counts {m and m.groups()} for {n}")
finish()
PY

# gpipe eval on the checkpoint with the same validation shard and batches: the run's final figures.
CK=$(ls "$TMP"/ck/ckpt-*.safetensors | tail -1)
"$GPIPE" eval --checkpoint "$CK" --data "$TMP/train.bin" --val-data "$TMP/val.bin" --eval-size 6 --batch 4 \
    --threads 1 --report "$TMP/ev.json" >"$TMP/ev.out" 2>"$TMP/ev.err" || bad "gpipe eval: $(cat "$TMP/ev.err")"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import sys
from clicheck import finish, load, need
d = sys.argv[1]
a, e = load(d, "bin"), load(d, "ev")
need(e.get("eval", {}).get("loss") == a.get("eval", {}).get("loss"),
     f"gpipe eval's loss {e.get('eval')} vs train's {a.get('eval')}")
finish()
PY

# A resume with other token options is refused naming the option.
"$GPIPE" train "${M[@]}" --data "$TMP/train.bin" --checkpoint-dir "$TMP/ck" --resume \
    >/dev/null 2>"$TMP/res.err"
[ $? -eq 1 ] && grep -qF -- "--val-data none differs from the checkpoint's $TMP/val.bin" "$TMP/res.err" ||
    bad "resume without --val-data: $(cat "$TMP/res.err")"

# Byte ids as uint16 tokens: the text corpus's windows exactly. A corpus of 20 entries: the first
# 19 (each with the newline that ends it) train, the 20th validates.
"$PY" - "$TMP" <<'PY' || fail=$((fail + 1))
import sys
import numpy as np
d = sys.argv[1]
entries = [f"entry {i}: the pipeline splits every mini-batch, über café ложка {i * i}\n" * (1 + i % 3)
           for i in range(20)]
open(f"{d}/corpus.txt", "w", encoding="utf-8").write("%\n".join(entries))
b = lambda s: np.frombuffer(s.encode("utf-8"), np.uint8).astype(np.uint16)
np.concatenate([b(e + "\n") for e in entries[:19]]).tofile(f"{d}/bytes.u16")
b(entries[19] + "\n").tofile(f"{d}/bytes_val.u16")
PY
printf '{"family": "transformer", "vocab": 256, "dim": 32, "heads": 4, "d_ff": 64, "layers": 2, "seq_len": 32}\n' >"$TMP/byte.json"
B=(--model "$TMP/byte.json" --steps 4 --batch 4 --eval-size 4 --threads 1 --quiet --seed 2)
run text "${B[@]}" --data "$TMP/corpus.txt" --report "$TMP/text.json"
run bytes "${B[@]}" --data "$TMP/bytes.u16" --data-format u16 --val-data "$TMP/bytes_val.u16" \
    --report "$TMP/bytes.json"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import sys
from clicheck import finish, load, need
d = sys.argv[1]
a, b = load(d, "text"), load(d, "bytes")
need(a.get("params_fnv1a64") and a.get("params_fnv1a64") == b.get("params_fnv1a64"),
     f"bytes as u16 tokens: {b.get('params_fnv1a64')}, as text: {a.get('params_fnv1a64')}")
need(a.get("eval", {}).get("loss") == b.get("eval", {}).get("loss"), "bytes as tokens: other validation loss")
finish()
PY

# Encoding: the fortunes (English, German, Russian) as a prompt, encoded by gpipe sample
# --tokenizer --tokens to the ids the tokenizers package gives, by both tokenizers. Decoding: 300 tokens drawn at a
# high temperature (most of the vocabulary) printed by --tokenizer, against the package's decoding
# of the ids --tokens prints with the same seed; the training run's sample header.
"$GPIPE" sample --checkpoint "$CK" --tokenizer "$TMP/tok.json" --tokens --prompt "$(cat "$TMP/enc.txt")" \
    --bytes 1 --threads 1 >"$TMP/enc.out" 2>"$TMP/enc.err" || bad "sample --tokens with a text prompt: $(cat "$TMP/enc.err")"
"$GPIPE" sample --checkpoint "$CK" --tokenizer "$TMP/tokp.json" --tokens --prompt "$(cat "$TMP/encp.txt")" \
    --bytes 1 --threads 1 >"$TMP/encp.out" 2>"$TMP/encp.err" || bad "sample --tokens, prefix space: $(cat "$TMP/encp.err")"
S=(sample --checkpoint "$CK" --prompt "Der Hund" --bytes 300 --temperature 4 --seed 3 --threads 1)
"$GPIPE" "${S[@]}" --tokenizer "$TMP/tok.json" --tokens >"$TMP/ids.out" 2>"$TMP/ids.err" ||
    bad "sample --tokens: $(cat "$TMP/ids.err")"
"$GPIPE" "${S[@]}" --tokenizer "$TMP/tok.json" >"$TMP/text.out" 2>"$TMP/text.err" ||
    bad "sample --tokenizer: $(cat "$TMP/text.err")"
"$GPIPE" sample --checkpoint "$CK" --tokens --prompt "10 200,300" --bytes 5 --threads 1 >"$TMP/raw.out" 2>"$TMP/raw.err" ||
    bad "sample --tokens with ids: $(cat "$TMP/raw.err")"
"$PY" - "$TMP" <<'PY' || fail=$((fail + 1))
import json, re, sys
from tokenizers import Tokenizer
from clicheck import errors, finish, need
d = sys.argv[1]
tok = Tokenizer.from_file(f"{d}/tok.json")
want = json.load(open(f"{d}/enc.json"))
got = [int(x) for x in open(f"{d}/enc.out").read().split()]
need(len(got) == len(want) + 1, f"encoding: {len(got) - 1} ids, tokenizers {len(want)}")
diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
need(diff is None, f"encoding: id {diff} differs: {got[diff - 3:diff + 3] if diff else ''} vs {want[diff - 3:diff + 3] if diff else ''}")
want = json.load(open(f"{d}/encp.json"))
got = [int(x) for x in open(f"{d}/encp.out").read().split()][:-1]
need(got == want, f"encoding with a prefix space, ignore_merges and an added token: {len(got)} ids, "
     f"tokenizers {len(want)}, first difference at {next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)}")
prompt = tok.encode("Der Hund").ids
ids = [int(x) for x in open(f"{d}/ids.out").read().split()]
need(len(ids) == len(prompt) + 300 and ids[:len(prompt)] == prompt, f"sample --tokens: {ids[:10]}...")
drawn = ids[len(prompt):]
need(len(set(drawn)) > 100, f"only {len(set(drawn))} distinct ids drawn")
text = open(f"{d}/text.out", "rb").read()
need(text.startswith(b"Der Hund") and text.endswith(b"\n"), "sample --tokenizer: prompt or final newline")
dec = tok.decode(drawn, skip_special_tokens=False)
need(text[len(b"Der Hund"):-1].decode("utf-8", "replace") == dec,
     f"sample --tokenizer: {text[:80]!r}..., tokenizers: {dec[:80]!r}...")
raw = open(f"{d}/raw.out").read().split()
need(raw[:3] == ["10", "200", "300"] and len(raw) == 8, f"sample --tokens with ids: {raw}")
# train --sample 24 --tokenizer: a sample header counting tokens, then text
out = open(f"{d}/bin.out", "rb").read()
need(re.search(rb"^sample \(24 tokens, temperature 0.8, seed 5\):\n", out, re.M) is not None,
     "train --sample with token data: no sample header")
finish()
PY

# Every bad file: exit 1 before any training, naming the file and the byte offset.
while IFS='|' read -r name fmt msg; do
    "$GPIPE" train "${M[@]}" --data "$TMP/$name" --data-format "$fmt" >"$TMP/bad.out" 2>"$TMP/bad.err"
    rc=$?
    [ $rc -eq 1 ] && grep -qF -- "--data $TMP/$name: cannot load the $fmt token file: $TMP/$msg" "$TMP/bad.err" ||
        bad "$name: exit $rc, $(cat "$TMP/bad.err"), expected: $msg"
    grep -q "^training on\|trained" "$TMP/bad.out" && bad "$name: training started"
done <"$TMP/bad_cases"
# A FIFO is refused at once, never waited on
mkfifo "$TMP/fifo.bin"
timeout 10 "$GPIPE" train "${M[@]}" --data "$TMP/fifo.bin" >/dev/null 2>"$TMP/bad.err"
rc=$?
[ $rc -eq 1 ] && grep -qF "$TMP/fifo.bin" "$TMP/bad.err" || bad "a FIFO as --data: exit $rc, $(cat "$TMP/bad.err")"
# ... as --val-data too, named so
"$GPIPE" train "${M[@]}" --data "$TMP/train.bin" --val-data "$TMP/id.bin" >/dev/null 2>"$TMP/bad.err"
rc=$?
[ $rc -eq 1 ] && grep -qF -- "--val-data $TMP/id.bin: cannot load the llmc token file: $TMP/id.bin: byte offset 2578" "$TMP/bad.err" ||
    bad "--val-data id.bin: exit $rc, $(cat "$TMP/bad.err")"
# --vocab below the ids: the first id not below it
"$GPIPE" train "${M[@]}" --data "$TMP/train.u16" --data-format u16 --vocab 100 >/dev/null 2>"$TMP/bad.err"
[ $? -eq 1 ] && grep -q "train.u16: byte offset [0-9]*: token id [0-9]* (token [0-9]* of the file) is not below the vocabulary of 100" "$TMP/bad.err" ||
    bad "--vocab 100: $(cat "$TMP/bad.err")"
# A tokenizer.json that is not byte-level BPE
printf '{"model": {"type": "WordPiece", "vocab": {"a": 0}}}' >"$TMP/wp.json"
"$GPIPE" sample --checkpoint "$CK" --tokenizer "$TMP/wp.json" --prompt 1 --bytes 1 >/dev/null 2>"$TMP/bad.err"
[ $? -eq 1 ] && grep -qF "$TMP/wp.json: model.type is not \"BPE\"" "$TMP/bad.err" || bad "WordPiece tokenizer: $(cat "$TMP/bad.err")"

# Usage errors (exit 2), each naming its option; a bad --tokenizer before training (exit 1).
for case in "--data $TMP/train.bin --vocab 513|--vocab 513: more than the model's vocabulary of 512" \
            "--data $TMP/corpus.txt --val-data $TMP/val.bin|--val-data: only with token data" \
            "--data $TMP/corpus.txt --vocab 10|--vocab: only with token data" \
            "--data-format u16|--data-format u16: give the token file with --data" \
            "--data $TMP/train.bin --val-data $TMP/tiny.bin|--val-data $TMP/tiny.bin: 10 tokens, need at least 34" \
            "--data $TMP/corpus.txt --tokenizer $TMP/tok.json|--tokenizer: only with token data" \
            "--data $TMP/train.bin --sample 3 --prompts $TMP/prompts.txt|--prompts line 'Hello': expected token ids" \
            "--data $TMP/train.bin --sample 3 --prompts $TMP/prompts.txt --tokenizer $TMP/wp.json|--tokenizer $TMP/wp.json: $TMP/wp.json: model.type is not"; do
    args=${case%|*}; want=${case#*|}
    printf 'Hello\n' >"$TMP/prompts.txt"
    # shellcheck disable=SC2086
    "$GPIPE" train --model "$TMP/tok512.json" --steps 1 $args >"$TMP/u.out" 2>"$TMP/u.err"
    rc=$?
    case $want in "--tokenizer $TMP/"*) code=1 ;; *) code=2 ;; esac
    [ $rc -eq $code ] && grep -qF -- "$want" "$TMP/u.err" || bad "usage '$args': exit $rc, $(cat "$TMP/u.err")"
done
"$GPIPE" sample --checkpoint "$CK" --tokens --prompt "12 x" >/dev/null 2>"$TMP/u.err"
[ $? -eq 2 ] && grep -qF "expected token ids from 0 to 511" "$TMP/u.err" || bad "sample --prompt '12 x': $(cat "$TMP/u.err")"

cli_finish tokens
