#!/usr/bin/env bash
# `gpipe train --metrics FILE.jsonl --curve FILE.svg`: one JSON object per logged step and per
# evaluation with the documented keys, the step losses equal to the run's (the report's final
# loss, a run without the flags gives the same parameters), the curve a well-formed SVG whose
# training polyline has a point per step (inside the plot) and a marker per evaluation; a resumed
# run appends to the metrics; a classifier's lines carry images/s and accuracy; outputs that
# clash with another output or an input are refused before training.
# Run from the repository root: bash tests/cli/metrics.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

cli_write_corpus "$TMP/corpus"
COMMON=(--model "$TMP/tiny.json" --data "$TMP/corpus" --steps 12 --batch 4 --eval-every 4
        --eval-size 4 --threads 1 --log-every 3 --quiet)
run a "${COMMON[@]}" --metrics "$TMP/a.jsonl" --curve "$TMP/a.svg" --report "$TMP/a.json"
run plain "${COMMON[@]}" --report "$TMP/plain.json"
grep -q "learning curve written to $TMP/a.svg" "$TMP/a.out" || bad "no 'learning curve written' line"
grep -q "metrics written to $TMP/a.jsonl" "$TMP/a.out" || bad "no 'metrics written' line"

python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, math, sys
import xml.etree.ElementTree as ET
from clicheck import errors, finish, need
d = sys.argv[1]
lines = [json.loads(l) for l in open(f"{d}/a.jsonl")]
train = [l for l in lines if l["type"] == "train"]
ev = [l for l in lines if l["type"] == "eval"]
need([l["step"] for l in train] == [3, 6, 9, 12], f"train lines at steps {[l['step'] for l in train]}")
need([l["step"] for l in ev] == [4, 8, 12], f"eval lines at steps {[l['step'] for l in ev]}")
for l in train:
    for k in ("loss", "loss_mean", "lr", "sequences_per_s", "tokens_per_s", "train_s", "elapsed_s"):
        need(isinstance(l.get(k), (int, float)) and math.isfinite(l[k]), f"train line {l['step']}: {k} = {l.get(k)}")
    need(abs(l["tokens_per_s"] - 32 * l["sequences_per_s"]) <= 1e-9 * l["tokens_per_s"], "tokens_per_s != 32 x sequences_per_s")
need(3e-4 >= train[0]["lr"] > train[-1]["lr"] >= 0, "lr: not the cosine decay from 3e-4")
rep, plain = json.load(open(f"{d}/a.json")), json.load(open(f"{d}/plain.json"))
losses = rep["train"]["step_losses"]
need([l["loss"] for l in train] == [losses[s - 1] for s in (3, 6, 9, 12)], "train lines' losses differ from the report's step_losses")
need(abs(train[1]["loss_mean"] - sum(losses[3:6]) / 3) <= 1e-12, "loss_mean is not the mean of the steps since the last line")
need(rep["params_fnv1a64"] == plain["params_fnv1a64"], "--metrics/--curve changed the training")
hist = rep["eval_history"]
need([(e["step"], e["loss"], e["bits_per_byte"]) for e in hist] == [(e["step"], e["loss"], e["bits_per_byte"]) for e in ev],
     "eval lines differ from the report's eval_history")
svg = ET.parse(f"{d}/a.svg").getroot()
ns = "{http://www.w3.org/2000/svg}"
polys = svg.findall(f"{ns}polyline")
need(len(polys) == 3, f"{len(polys)} polylines (expected training loss, eval loss, bits per byte)")
if polys:
    pts = [tuple(map(float, p.split(","))) for p in polys[0].get("points").split()]
    need(len(pts) == 12, f"training polyline has {len(pts)} points, expected 12")
    rect = [r for r in svg.findall(f"{ns}rect") if r.get("fill") == "none"][0]
    x0, y0 = float(rect.get("x")), float(rect.get("y"))
    x1, y1 = x0 + float(rect.get("width")), y0 + float(rect.get("height"))
    need(all(x0 - 0.1 <= x <= x1 + 0.1 and y0 - 0.1 <= y <= y1 + 0.1 for x, y in pts), "points outside the plot")
    need(pts == sorted(pts, key=lambda p: p[0]), "training points not in step order")
need(len(svg.findall(f"{ns}circle")) == 2 * len(ev), "one marker per evaluation and series")
finish()
PY

# A resumed run appends its lines to the file of the run it resumes.
run r1 "${COMMON[@]}" --metrics "$TMP/r.jsonl" --checkpoint-dir "$TMP/ck" --stop-after 6
run r2 "${COMMON[@]}" --metrics "$TMP/r.jsonl" --checkpoint-dir "$TMP/ck" --resume
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
a = [json.loads(l) for l in open(f"{d}/a.jsonl")]
r = [json.loads(l) for l in open(f"{d}/r.jsonl")]
key = lambda l: (l["type"], l["step"], l["loss"])
need([key(l) for l in r] == [key(l) for l in a], "stop + resume: metrics lines differ from one run's")
finish()
PY

# A classifier: images/s, epochs and accuracy.
if [ -d /usr/share/datasets/fashion-mnist ]; then
    run c --model convnet --steps 4 --batch 8 --eval-every 2 --eval-size 16 --threads 1 --log-every 2 \
        --quiet --metrics "$TMP/c.jsonl" --curve "$TMP/c.svg"
    python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
lines = [json.loads(l) for l in open(f"{d}/c.jsonl")]
t = [l for l in lines if l["type"] == "train"]
e = [l for l in lines if l["type"] == "eval"]
need([l["step"] for l in t] == [2, 4] and all("images_per_s" in l and "epoch" in l for l in t), f"classifier train lines {t}")
need([l["step"] for l in e] == [2, 4] and all(0 <= l["accuracy"] <= 1 for l in e), f"classifier eval lines {e}")
finish()
PY
fi

# Clashing outputs are usage errors before any training.
for case in "--metrics $TMP/x.json --report $TMP/x.json|same file" \
            "--curve $TMP/tiny.json|--model" \
            "--metrics $TMP/corpus|--data"; do
    args=${case%|*}; want=${case#*|}
    # shellcheck disable=SC2086
    "$GPIPE" train "${COMMON[@]}" $args >/dev/null 2>"$TMP/e.err"
    rc=$?
    [ $rc -eq 2 ] && grep -q -- "$want" "$TMP/e.err" || bad "case '$args': exit $rc, $(cat "$TMP/e.err")"
done
mkfifo "$TMP/fifo"
timeout 20 "$GPIPE" train "${COMMON[@]}" --metrics "$TMP/fifo" >/dev/null 2>"$TMP/f.err"
rc=$?
[ $rc -eq 2 ] && grep -q "not a regular file" "$TMP/f.err" || bad "--metrics FIFO: exit $rc, $(cat "$TMP/f.err")"
timeout 20 "$GPIPE" train "${COMMON[@]}" --curve /nonexistent-dir/c.svg >/dev/null 2>"$TMP/n.err"
rc=$?
[ $rc -eq 1 ] && grep -q -- "--curve" "$TMP/n.err" || bad "--curve in a missing folder: exit $rc, $(cat "$TMP/n.err")"

cli_finish metrics
