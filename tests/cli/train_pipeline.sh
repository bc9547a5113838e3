#!/usr/bin/env bash
# `gpipe train --stages K`: at --threads 1 a tiny byte LM and the convnet give
# the same final loss and parameter hash as the single-device trainer for
# every K, schedule and re-materialization mode; the report's pipeline object
# (per-stage peak bytes, partition, busy fractions, the last step's bubbles
# with theory (K-1)/(M+K-1), or (K-1)/(VM+K-1) interleaved), evaluation equal to the single-device run's for
# every K (selective re-materialization too, each cell's mode reported);
# --trace / --timeline files of a K = 2 run; bad pipeline options exit
# 2 naming the option.
# Run from the repository root: bash tests/cli/train_pipeline.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

printf '{"family": "transformer", "vocab": 256, "dim": 16, "heads": 2, "d_ff": 32, "layers": 2, "seq_len": 16}\n' \
    >"$TMP/lm.json"
cli_write_corpus "$TMP/corpus"
cli_write_idx "$TMP/syn"

# K:schedule:remat combinations; under GP_TEST_QUICK a cross-section of them.
if [ "${GP_TEST_QUICK:-0}" = 1 ]; then
    LM_COMBOS="1:gpipe:cell 2:1f1b:none 3:gpipe:none 3:1f1b:cell 2:gpipe:selective 3:zbh1:cell
               2:interleaved:none 2:zbv:cell"
    CN_COMBOS="2:gpipe:cell 3:1f1b:none 2:zbh1:none 2:interleaved:cell 3:zbv:none"
else
    LM_COMBOS=""
    for k in 1 2 3; do for s in gpipe 1f1b zbh1; do for r in none cell; do
        LM_COMBOS="$LM_COMBOS $k:$s:$r"
    done; done; done
    LM_COMBOS="$LM_COMBOS 2:gpipe:selective 3:1f1b:selective 1:interleaved:cell 2:interleaved:cell
               2:interleaved:none 2:zbv:cell 3:zbv:none"
    CN_COMBOS="1:gpipe:none 2:gpipe:cell 3:1f1b:none 4:1f1b:cell 2:zbh1:cell 3:zbh1:none
               2:interleaved:none 4:interleaved:cell 2:zbv:none 4:zbv:cell"
fi

LM=(--model "$TMP/lm.json" --data "$TMP/corpus" --steps 3 --batch 8 --micro-batches 4
    --eval-size 4 --threads 1 --quiet --seed 5)
CN=(--model convnet --data "$TMP/syn" --steps 2 --batch 16 --micro-batches 4 --eval-size 16
    --threads 1 --quiet --seed 5)
run lm_ref "${LM[@]}" --report "$TMP/lm_ref.json"
run cn_ref "${CN[@]}" --report "$TMP/cn_ref.json"
for c in $LM_COMBOS; do
    IFS=: read -r k s r <<<"$c"
    run "lm_$k$s$r" "${LM[@]}" --stages "$k" --schedule "$s" --remat "$r" \
        --report "$TMP/lm_$k$s$r.json"
done
for c in $CN_COMBOS; do
    IFS=: read -r k s r <<<"$c"
    run "cn_$k$s$r" "${CN[@]}" --stages "$k" --schedule "$s" --remat "$r" \
        --report "$TMP/cn_$k$s$r.json"
done
# A given partition is used and reported; the last step drawn as a trace and a timeline.
# Cells balanced on measured layer times, threads not pinned: other cells, same bits.
run lm_time "${LM[@]}" --stages 2 --balance time --pin off --report "$TMP/lm_time.json"
run lm_part "${LM[@]}" --stages 2 --partition 0,2 --report "$TMP/lm_part.json" \
    --trace "$TMP/lm_part_trace.json" --timeline "$TMP/lm_part.svg"
grep -q "<svg" "$TMP/lm_part.svg" && grep -q "stage 1" "$TMP/lm_part.svg" ||
    bad "--timeline: $TMP/lm_part.svg is no SVG with a 'stage 1' row: $(head -c 200 "$TMP/lm_part.svg" 2>&1)"
grep -q "^bubble of the last step .*measured .*theory .*simulated" "$TMP/lm_part.out" ||
    bad "no bubble line in the summary"
grep -q "^timeline of the last step written to $TMP/lm_part.svg" "$TMP/lm_part.out" ||
    bad "the summary does not say where the timeline is"
# --remat's default: selective, planned against the host's available memory shared by the two
# stage devices (every cell of this tiny model keeps its state), or against --memory-limit (the
# first cell's state would not fit 300 KiB beside its parameters: it recomputes), each cell's
# mode and the reason in the line after the pipeline's.
grep -Eq "^remat: selective \(the default\) against [0-9.]+ [KMGT]?i?B per stage device \([0-9.]+ [KMGT]?i?B available on the host / 2\): cells 0-1 none \(their state fits\)$" \
    "$TMP/lm_part.out" || bad "no default remat line: $(grep '^remat' "$TMP/lm_part.out")"
run lm_sel_limit "${LM[@]}" --stages 2 --partition 0,4 --memory-limit 300KiB \
    --report "$TMP/lm_sel_limit.json"
grep -qx "remat: selective (the default) against the --memory-limit of 300.0 KiB per stage device: cell 0 cell (its state would not fit), cell 1 none (its state fits)" \
    "$TMP/lm_sel_limit.out" || bad "remat line under --memory-limit: $(grep '^remat' "$TMP/lm_sel_limit.out")"
run lm_cell_given "${LM[@]}" --stages 2 --remat cell --report "$TMP/lm_cell_given.json"
grep -qx "remat: cell (--remat): cells 0-1 cell" "$TMP/lm_cell_given.out" ||
    bad "remat line of a given --remat: $(grep '^remat' "$TMP/lm_cell_given.out")"
# Sampling after a K = 2 run reads the stages' parameters: the same text as on one device.
run lm_sample1 "${LM[@]}" --sample 24
run lm_sample2 "${LM[@]}" --stages 2 --remat cell --sample 24
sed -n '/^sample (/,$p' "$TMP/lm_sample1.out" > "$TMP/sample1.txt"
sed -n '/^sample (/,$p' "$TMP/lm_sample2.out" > "$TMP/sample2.txt"
[ -s "$TMP/sample1.txt" ] || bad "no sample printed on one device"
cmp -s "$TMP/sample1.txt" "$TMP/sample2.txt" || bad "the K = 2 sample differs from the single-device one"
grep -q "^stage 1 peak" "$TMP/lm_part.out" || bad "no per-stage peak line in the summary"

python3 - "$TMP" "$LM_COMBOS" "$CN_COMBOS" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d, lm_combos, cn_combos = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def check(prefix, combos, extra=()):
    ref = json.load(open(f"{d}/{prefix}_ref.json"))
    need("pipeline" not in ref and isinstance(ref.get("eval"), dict), f"{prefix}_ref: no pipeline, eval")
    names = [(c, f"{prefix}_{c.replace(':', '')}") for c in combos] + list(extra)
    for c, name in names:
        r = json.load(open(f"{d}/{name}.json"))
        k, s, m = c.split(":")
        k = int(k)
        cps = 2 if s in ("interleaved", "zbv") else 1  # cells per stage: K V cells in all
        need(r["params_fnv1a64"] == ref["params_fnv1a64"],
             f"{name}: params {r['params_fnv1a64']} != single-device {ref['params_fnv1a64']}")
        need(r["train"]["final_loss"] == ref["train"]["final_loss"],
             f"{name}: final loss {r['train']['final_loss']} != {ref['train']['final_loss']}")
        p = r.get("pipeline", {})
        need(p.get("stages") == k and p.get("micro_batches") == 4 and p.get("schedule") == s
             and p.get("remat") == m, f"{name}: pipeline {p}")
        # each cell's own mode: selective without a memory limit keeps every cell's state
        need(p.get("chunks") == cps, f"{name}: chunks {p.get('chunks')}")
        need(p.get("cell_remat") == [m if m != "selective" else "none"] * (k * cps),
             f"{name}: cell_remat {p.get('cell_remat')}")
        st = p.get("stage_peak_bytes", [])
        need(len(st) == k and all(x.get("parameters", 0) > 0 and x.get("total", 0) > 0 for x in st),
             f"{name}: stage_peak_bytes {st}")
        need(sum(x.get("parameters", 0) for x in st) == ref["memory"]["peak_bytes"]["parameters"],
             f"{name}: stage parameter bytes do not add up to the single device's")
        # Evaluation between steps reads every stage's parameters: the same
        # figures as the single-device run, for every K.
        need(r.get("eval") == ref["eval"] and "eval_skipped" not in r, f"{name}: eval {r.get('eval')}")
        # The last step's figures: K cells from layer 0, K busy fractions, bubbles in [0, 1).
        part, busy = p.get("partition"), p.get("busy_fraction")
        need(isinstance(part, list) and len(part) == k * cps and part[0] == 0 and part == sorted(set(part)),
             f"{name}: partition {part}")
        need(isinstance(busy, list) and len(busy) == k and all(0 < b <= 1 for b in busy),
             f"{name}: busy_fraction {busy}")
        for key in ("bubble_measured", "bubble_theory", "bubble_simulated", "bubble_replayed"):
            v = p.get(key)
            need(isinstance(v, (int, float)) and 0 <= v < 1, f"{name}: {key} {v}")
        th = p.get("bubble_theory")
        need(isinstance(th, (int, float)) and abs(th - (k - 1) / (cps * 4 + k - 1)) <= 1e-12,
             f"{name}: bubble_theory {th} != (K-1)/(VM+K-1) = {(k - 1) / (cps * 4 + k - 1)}")
        need(isinstance(p.get("step_s"), (int, float)) and p["step_s"] > 0, f"{name}: step_s {p.get('step_s')}")
check("lm", lm_combos, [("2:gpipe:selective", "lm_part"), ("2:gpipe:cell", "lm_cell_given")])
lim = json.load(open(f"{d}/lm_sel_limit.json"))
need(lim["params_fnv1a64"] == json.load(open(f"{d}/lm_ref.json"))["params_fnv1a64"],
     "selective under --memory-limit: parameters differ from one device")
need(lim["pipeline"].get("cell_remat") == ["cell", "none"]
     and lim["pipeline"].get("memory_limit_bytes") == 300 * 1024,
     f"selective under --memory-limit: {lim['pipeline'].get('cell_remat')}, "
     f"limit {lim['pipeline'].get('memory_limit_bytes')}")
# the default's limit: the host's available memory over the 2 stage devices
need(json.load(open(f"{d}/lm_part.json"))["pipeline"].get("memory_limit_bytes", 0) > 0,
     "the default remat's limit is not reported")
check("cn", cn_combos)
part = json.load(open(f"{d}/lm_part.json"))["pipeline"]
need(part.get("partition") == [0, 2] and part.get("partition_source") == "--partition",
     f"lm_part: partition {part.get('partition')}")
tm = json.load(open(f"{d}/lm_time.json"))
ref = json.load(open(f"{d}/lm_ref.json"))
need(tm["params_fnv1a64"] == ref["params_fnv1a64"], "--balance time: parameters differ from one device")
need(tm["pipeline"].get("balance") == "time" and tm["pipeline"].get("pinned") is False,
     f"--balance time --pin off: report {tm['pipeline'].get('balance')}, pinned {tm['pipeline'].get('pinned')}")
bal = json.load(open(f"{d}/lm_2{'1f1b'}none.json"))["pipeline"]
need(bal.get("partition_source") == "balanced" and len(bal.get("partition") or []) == 2,
     f"a balanced partition is reported as the cells used: {bal.get('partition')}")
# The Chrome trace of the K = 2 run: one named track per stage, and events on both.
tr = json.load(open(f"{d}/lm_part_trace.json"))
ev = tr["traceEvents"] if isinstance(tr, dict) else tr
tracks = sorted(e["args"]["name"] for e in ev if e.get("name") == "thread_name")
need(tracks == ["stage 0", "stage 1"], f"--trace: thread_name tracks {tracks}")
need({e.get("tid") for e in ev if e.get("ph") == "X"} == {0, 1}, "--trace: no events on both stages")
finish()
PY

# --plan auto: the stages, micro-batches, schedule and remat of the fastest plan that fits the
# limit on 2 devices, trained with the plan's cells (the report says which and what was
# predicted and measured); with M given, that M.
LM_NO_M=("${LM[@]:0:8}" "${LM[@]:10}") # LM without its --micro-batches 4
run lm_auto "${LM_NO_M[@]}" --plan auto --devices 2 --memory-limit 200K --report "$TMP/lm_auto.json"
run lm_auto_m "${LM[@]}" --plan auto --devices 2 --report "$TMP/lm_auto_m.json"
run lm_auto_modelled "${LM[@]}" --plan auto --devices 2 --plan-trial 0 --report "$TMP/lm_auto_modelled.json"
# the plan lm_auto_m trained, given: the trial trains a copy of the model, the run's bits are the
# explicit plan's
read -r -a AUTO_PLAN < <(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["pipeline"]
print("--stages", p["stages"], "--micro-batches", p["micro_batches"], "--schedule", p["schedule"],
      "--remat", p["remat"], "--partition", ",".join(map(str, p["partition"])),
      "--chunks", p.get("chunks", 1))' "$TMP/lm_auto_m.json")
run lm_auto_given "${LM[@]:0:8}" "${LM[@]:10}" "${AUTO_PLAN[@]}" --report "$TMP/lm_auto_given.json"
grep -q "^plan auto: training the fastest, K = " "$TMP/lm_auto.out" || bad "--plan auto: no choice line"
grep -Eq "^plan auto: searching plans of 2 stage devices .*, [0-9]+ us per action of the runtime \(measured in [0-9.]+ s\)$" \
    "$TMP/lm_auto.out" || bad "--plan auto: no action cost in the search line: $(grep '^plan auto' "$TMP/lm_auto.out")"
grep -Eq "^plan auto: the fastest timed again with its layers measured at micro-batches of [0-9]+ \([0-9.]+ s\): step [0-9.]+ s \(by FLOPs [0-9.]+ s\)$" \
    "$TMP/lm_auto.out" || bad "--plan auto: no calibration line: $(grep '^plan auto' "$TMP/lm_auto.out")"
grep -Eq "^plan auto: timed by running it \([3-8] stand-in steps after one, [0-9]+ trials?, [0-9.]+ s\): step [0-9.]+ s \(modelled [0-9.]+ s\)" \
    "$TMP/lm_auto.out" || bad "--plan auto: no trial line: $(grep '^plan auto' "$TMP/lm_auto.out")"
grep -q "^plan auto: timed by running it" "$TMP/lm_auto_modelled.out" &&
    bad "--plan-trial 0: a trial ran: $(grep '^plan auto' "$TMP/lm_auto_modelled.out")"
grep -q "^plan auto: predicted .* s per step, measured .* s (median of 2" "$TMP/lm_auto.out" ||
    bad "--plan auto: no predicted/measured line: $(cat "$TMP/lm_auto.out")"
python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d = sys.argv[1]
auto, given = (json.load(open(f"{d}/{n}.json")) for n in ("lm_auto_m", "lm_auto_given"))
need(auto.get("params_fnv1a64") and auto.get("params_fnv1a64") == given.get("params_fnv1a64")
     and auto["train"].get("final_loss") == given["train"].get("final_loss"),
     f"the plan trained by --plan auto (after its trial) and given: other bits {auto.get('params_fnv1a64')} "
     f"{given.get('params_fnv1a64')}")
for name, m in (("lm_auto", None), ("lm_auto_m", 4), ("lm_auto_modelled", 4)):
    r = json.load(open(f"{sys.argv[1]}/{name}.json"))
    pa, p = r.get("plan_auto", {}), r.get("pipeline", {})
    best = (pa.get("plans") or [{}])[0]
    need(pa.get("devices") == 2 and best.get("stages") == 2 and best.get("data_parallel") == 1,
         f"{name}: plan_auto {pa}")
    tr = pa.get("trial")
    # the cells trained: the plan's, or those its trial moved to
    cells = tr.get("partition") if tr else best.get("partition")
    need((p.get("stages"), p.get("micro_batches"), p.get("schedule"), p.get("remat"),
          p.get("partition")) ==
         (best.get("stages"), best.get("micro_batches"), best.get("schedule"), best.get("remat"),
          cells), f"{name}: trained {p} != planned {best} (trial {tr})")
    need(tr is None or tr.get("moved") == (cells != best.get("partition")), f"{name}: trial {tr}")
    need(m is None or best.get("micro_batches") == m, f"{name}: M {best.get('micro_batches')}")
    need(pa.get("predicted_step_s", 0) > 0 and pa.get("measured_step_s", 0) > 0, f"{name}: times")
    # by default the FLOP search's fastest is timed again on measured layers, with the runtime's
    # measured cost per action: the step shown is that plan's
    need(pa.get("action_s", 0) > 0 and pa.get("flop_step_s", 0) > 0 and pa.get("calibration_s", 0) > 0
         and best.get("step_s", 0) > 0, f"{name}: calibration {pa}")
    # then, but with --plan-trial 0, the plan's step measured by running it is the prediction
    if name == "lm_auto_modelled":
        need(tr is None and pa["predicted_step_s"] == best.get("step_s"),
             f"{name}: a trial with --plan-trial 0: {tr}")
    else:
        need(tr and 3 <= tr.get("steps", 0) <= 8 and tr.get("trials", 0) >= 1
             and tr.get("seconds", 0) > 0 and isinstance(tr.get("moved"), bool)
             and pa["predicted_step_s"] == tr.get("step_s") > 0, f"{name}: trial {tr}")
    if name == "lm_auto":
        peaks = [s["total"] for s in p.get("stage_peak_bytes", [])]
        need(peaks and max(peaks) <= 200 * 1024, f"{name}: a stage over the 200K limit: {peaks}")
        need(pa["fitting"] < pa["candidates"], f"{name}: the limit ruled nothing out")
finish()
PY

# expect2 NEEDLE ARGS...: gpipe train ARGS exits 2 and stderr names NEEDLE.
expect2() {
    local needle=$1 rc
    shift
    "$GPIPE" train "$@" >"$TMP/bad.out" 2>"$TMP/bad.err"
    rc=$?
    if [ "$rc" -ne 2 ] || ! grep -qF -- "$needle" "$TMP/bad.err"; then
        bad "gpipe train $*: exit $rc, expected 2 naming '$needle': $(head -c 300 "$TMP/bad.err")"
    fi
}
expect2 "--stages: expected an integer from 1 to 4096, got '0'" "${LM[@]}" --stages 0
expect2 "--stages 9: more than the" "${LM[@]}" --stages 9
expect2 "--micro-batches 3: does not divide the batch of 8 examples" "${LM[@]:0:8}" \
    --micro-batches 3 --stages 2
expect2 "--schedule: expected one of gpipe|1f1b|zbh1|interleaved|zbv, got 'zigzag'" "${LM[@]}" --stages 2 --schedule zigzag
expect2 "--remat: expected one of cell|none|selective" "${LM[@]}" --stages 2 --remat all
expect2 "--partition 0,1: 2 entries for --stages 3" "${LM[@]}" --stages 3 --partition 0,1
expect2 "--partition 0,2: 2 entries for --stages 2; expected the first layer of each of the 4 cells" \
    "${LM[@]}" --stages 2 --schedule interleaved --partition 0,2
expect2 "--partition" "${LM[@]}" --stages 2 --partition 3,1
expect2 "--chunks 3: schedule zbv with 3 cells per stage (chunks); expected 2 (its V)" \
    "${LM[@]}" --stages 2 --schedule zbv --chunks 3
expect2 "--chunks 2: schedule 1f1b with 2 cells per stage" "${LM[@]}" --stages 2 --schedule 1f1b --chunks 2
# --device cuda: trains where a GPU is; elsewhere exits 1 saying why (no GPU, or no CUDA built in)
"$GPIPE" train "${LM[@]}" --stages 2 --device cuda >"$TMP/cuda.out" 2>"$TMP/cuda.err"
rc=$?
if [ "$rc" -ne 0 ] && { [ "$rc" -ne 1 ] || ! grep -qE -- "--device cuda: (no CUDA GPU available|gpipe was built without CUDA)" "$TMP/cuda.err"; }; then
    bad "--device cuda: exit $rc, expected 0 or 1 naming why: $(head -c 300 "$TMP/cuda.err")"
fi
expect2 "--partition" "${LM[@]}" --stages 2 --partition 0,x
expect2 "--schedule: only with --stages K" "${LM[@]}" --schedule 1f1b
expect2 "--balance: only with --stages K" "${LM[@]}" --balance time
expect2 "--pin: only with --stages K" "${LM[@]}" --pin off
expect2 "--balance: expected one of cost|time" "${LM[@]}" --stages 2 --balance flops
expect2 "--pin: expected one of auto|off" "${LM[@]}" --stages 2 --pin yes
expect2 "--partition 0,2 with --balance time" "${LM[@]}" --stages 2 --partition 0,2 --balance time
expect2 "--devices: only with --plan auto" "${LM[@]}" --devices 2
expect2 "--plan-trial: only with --plan auto" "${LM[@]}" --plan-trial 5
# a language model whose head is wider than its embedding: the trial's stand-in tokens stay below
# the data's bytes, so the run that trains without a trial trains with one
printf '{"input": {"shape": [16], "dtype": "int32"}, "layers": [{"kind": "embedding", "vocab": 256, "dim": 16}, {"kind": "linear", "in": 16, "out": 16}, {"kind": "relu"}, {"kind": "linear", "in": 16, "out": 512}]}\n' \
    >"$TMP/lm_wide.json"
run lm_wide_auto --model "$TMP/lm_wide.json" --data "$TMP/corpus" --steps 2 --batch 8 --eval-size 4 \
    --threads 1 --quiet --plan auto --devices 2
grep -q "^plan auto: timed by running it" "$TMP/lm_wide_auto.out" ||
    bad "--plan auto on a head wider than the embedding: no trial: $(grep '^plan auto' "$TMP/lm_wide_auto.out")"
expect2 "--plan-trial: expected a number >= 0 and <= 3600" "${LM[@]}" --plan auto --plan-trial -1
# A memory limit under a byte per cell of a stage is a limit, not "none": the cells are refused
# naming it before any parameter is placed, and --plan auto's search says no plan fits (it once
# partitioned as if no limit were given, and aborted on an internal assertion).
for args in "--stages 2 --schedule zbv" "--plan auto --devices 2"; do
    "$GPIPE" train "${LM[@]}" $args --memory-limit 1 >"$TMP/lim.out" 2>"$TMP/lim.err"
    rc=$?
    [ "$rc" -eq 1 ] && grep -qE "(over|fits) the 1 bytes per-device limit" "$TMP/lim.err" &&
        ! grep -q "allocating" "$TMP/lim.err" ||
        bad "train $args --memory-limit 1: exit $rc: $(head -c 400 "$TMP/lim.err")"
done
expect2 "--partition: fits one plan only" "${LM[@]}" --plan auto --partition 0,2
expect2 "--plan: expected one of auto" "${LM[@]}" --plan fastest
expect2 "--trace: only with --stages K" "${LM[@]}" --trace "$TMP/t.json"
expect2 "--timeline: only with --stages K" "${LM[@]}" --timeline "$TMP/t.svg"
[ ! -e "$TMP/t.json" ] && [ ! -e "$TMP/t.svg" ] || bad "a usage error still wrote --trace/--timeline"
"$GPIPE" train --help | grep -q -- "--stages K .*" || bad "--help does not list --stages"
"$GPIPE" train --help | grep -q -- "(default: gpipe)" || bad "--help does not give --schedule's default"

"$GPIPE" train --help | grep -q -- "--timeline FILE.svg" || bad "--help does not list --timeline"

cli_finish train_pipeline
