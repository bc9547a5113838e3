#!/usr/bin/env bash
# `gpipe train` on a tiny byte-level Transformer LM (a JSON config): the
# report has the LM keys (eval.loss, eval.bits_per_byte, tokens/s), --sample
# prints the asked number of bytes, the same seed gives the same text and
# parameters and another seed other ones, micro-batching keeps the loss.
# Run from the repository root: bash tests/cli/train_lm.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

cli_write_corpus "$TMP/corpus"

COMMON=(--model "$TMP/tiny.json" --data "$TMP/corpus" --steps 6 --batch 4 --eval-every 3
        --eval-size 6 --threads 1 --quiet --sample 64)
run a "${COMMON[@]}" --seed 3 --report "$TMP/a.json"
run b "${COMMON[@]}" --seed 3 --report "$TMP/b.json"
run c "${COMMON[@]}" --seed 4 --report "$TMP/c.json"
run t0 "${COMMON[@]}" --seed 3 --temperature 0 --report "$TMP/t0.json"
grep -q "validation loss .* bits/byte" "$TMP/a.out" || bad "no validation line in the output"
grep -q "defaults used:.*optimizer=adamw.*lr=0.0003" "$TMP/a.out" || bad "the defaults line is missing"

python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, math, re, sys
from clicheck import errors, finish, need
d = sys.argv[1]
def sample(name):
    out = open(f"{d}/{name}.out", "rb").read()
    m = re.search(rb"^sample \(64 bytes, temperature [0-9.]+, seed \d+\):\n", out, re.M)
    if not m:
        errors.append(f"{name}: no sample header")
        return b""
    text = out[m.end():m.end() + 65]
    need(len(text) == 65 and text[64:] == b"\n", f"{name}: expected 64 sampled bytes and a newline")
    return text[:64]
a, b, c = (json.load(open(f"{d}/{n}.json")) for n in "abc")
for key in ("model", "seed", "steps", "train", "eval", "throughput", "memory", "params_fnv1a64",
            "threads", "batch", "lr", "elapsed_s", "blas_core", "nparams"):
    need(key in a, f"missing key {key}")
need(a.get("model", "").endswith("tiny.json"), f"model {a.get('model')}")
need(a.get("task") == "language_model" and a.get("seq_len") == 32, "task/seq_len")
need(a.get("steps") == 6 and a.get("batch") == 4 and a.get("seed") == 3, "steps/batch/seed")
need(a.get("lr") == 3e-4 and a.get("optimizer") == "adamw" and a.get("clip") == 1, "LM defaults")
ev = a.get("eval", {})
loss, bpb = ev.get("loss"), ev.get("bits_per_byte")
need(isinstance(loss, float) and 0 < loss < 10, f"eval.loss {loss}")
need(isinstance(bpb, float) and abs(bpb - loss / math.log(2)) < 1e-9, f"bits_per_byte {bpb}")
need(ev.get("windows") == 6, "eval.windows")
need([e.get("step") for e in a.get("eval_history", [])] == [3, 6], "eval_history steps")
th = a.get("throughput", {})
need(th.get("tokens_per_s", 0) > 0 and abs(th["tokens_per_s"] - 32 * th["examples_per_s"]) < 1e-6 * th["tokens_per_s"],
     f"throughput {th}")
need(re.fullmatch(r"[0-9a-f]{16}", a.get("params_fnv1a64", "")) is not None, "params_fnv1a64")
need(a.get("params_fnv1a64") == b.get("params_fnv1a64"), "same seed, different hashes")
need(a["eval"]["loss"] == b["eval"]["loss"], "same seed, different validation loss")
need(a.get("params_fnv1a64") != c.get("params_fnv1a64"), "different seeds, same hash")
sa, sb, sc, s0 = sample("a"), sample("b"), sample("c"), sample("t0")
need(sa == sb, "same seed, different samples")
need(sa != sc, "different seeds, same sample")
finish()
PY

# --prompts: one sample after each line (empty lines and # comments skipped), each the prompt
# then --sample bytes; the sampled bytes after a prompt equal `gpipe sample`'s from a checkpoint of
# the same parameters; a file that is not a regular text file, or --prompts without --sample, is
# a usage error before any training.
printf 'Der Hund \n\n# not a prompt\nЖизнь \n' >"$TMP/prompts.txt"
run p --model "$TMP/tiny.json" --data "$TMP/corpus" --steps 6 --batch 4 --eval-size 6 --threads 1 \
    --quiet --seed 3 --sample 40 --prompts "$TMP/prompts.txt" --checkpoint-dir "$TMP/pck"
python3 - "$TMP/p.out" <<'PY' || fail=$((fail + 1))
import re, sys
from clicheck import errors, finish, need
out = open(sys.argv[1], "rb").read()
heads = list(re.finditer(rb"^sample (\d) of 2 \(40 bytes, temperature 0.8, seed 3\) after the prompt:\n", out, re.M))
need(len(heads) == 2, f"expected 2 prompt headers, got {len(heads)}")
for h, prompt in zip(heads, ["Der Hund ".encode(), "Жизнь ".encode()]):
    body = out[h.end():]
    need(body.startswith(prompt), f"sample {h.group(1)} does not start with its prompt")
    need(len(body) >= len(prompt) + 41 and body[len(prompt) + 40:len(prompt) + 41] == b"\n",
         f"sample {h.group(1)}: expected 40 bytes and a newline after the prompt")
open(sys.argv[1] + ".second", "wb").write(out[heads[1].end():][:len("Жизнь ".encode()) + 40])
finish()
PY
CK=$(ls "$TMP"/pck/ckpt-*.safetensors | tail -1)
"$GPIPE" sample --checkpoint "$CK" --prompt "Жизнь " --bytes 40 --seed 3 --threads 1 >"$TMP/ps.out" 2>"$TMP/ps.err"
head -c $(wc -c <"$TMP/p.out.second") "$TMP/ps.out" | cmp -s - "$TMP/p.out.second" ||
    bad "--prompts: the second sample differs from gpipe sample's with that prompt"
for case in "--sample 5 --prompts /nonexistent/prompts.txt|/nonexistent/prompts.txt" \
            "--prompts $TMP/prompts.txt|only with --sample" \
            "--sample 5 --prompts $TMP|not a regular file"; do
    args=${case%|*}; want=${case#*|}
    # shellcheck disable=SC2086
    "$GPIPE" train --model "$TMP/tiny.json" --data "$TMP/corpus" --steps 1 $args >/dev/null 2>"$TMP/pe.err"
    rc=$?
    [ $rc -eq 2 ] && grep -q -- "$want" "$TMP/pe.err" || bad "--prompts case '$args': exit $rc, $(cat "$TMP/pe.err")"
done
printf '\n# only a comment\n' >"$TMP/empty_prompts.txt"
"$GPIPE" train --model "$TMP/tiny.json" --data "$TMP/corpus" --steps 1 --sample 5 --prompts "$TMP/empty_prompts.txt" >/dev/null 2>"$TMP/pe.err"
[ $? -eq 2 ] && grep -q "no prompt" "$TMP/pe.err" || bad "--prompts with no prompt: $(cat "$TMP/pe.err")"

# Micro-batches: the summed gradients equal the whole batch's up to rounding,
# and the validation windows are fixed, so the losses agree closely.
run m1 --model "$TMP/tiny.json" --data "$TMP/corpus" --steps 3 --batch 4 --eval-size 4 --quiet --report "$TMP/m1.json"
run m2 --model "$TMP/tiny.json" --data "$TMP/corpus" --steps 3 --batch 4 --eval-size 4 --quiet \
    --micro-batches 2 --report "$TMP/m2.json"
python3 -c '
import json, sys
a, b = (json.load(open(p))["eval"]["loss"] for p in sys.argv[1:])
ok = abs(a - b) < 1e-4 * abs(a)
print("" if ok else f"FAIL: M=1 validation loss {a}, M=2 {b}", end="")
sys.exit(0 if ok else 1)
' "$TMP/m1.json" "$TMP/m2.json" || fail=$((fail + 1))

# The default corpus, when the fortunes are installed
if [ -d /usr/share/games/fortunes ]; then
    run def --model "$TMP/tiny.json" --steps 2 --batch 2 --eval-size 2 --quiet
    grep -q "training on /usr/share/games/fortunes" "$TMP/def.out" || bad "default corpus not used"
fi

# A corpus too small for the model's windows is a usage error naming --data
printf 'tiny\n%%\n' >"$TMP/small"
"$GPIPE" train --model "$TMP/tiny.json" --data "$TMP/small" --steps 1 >/dev/null 2>"$TMP/s.err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--data" "$TMP/s.err" || bad "small corpus: exit $rc, $(cat "$TMP/s.err")"

cli_finish train_lm
