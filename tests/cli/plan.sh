#!/usr/bin/env bash
# `gpipe plan`: --help lists every option, bad values exit 2 naming the option,
# impossible plans exit 1 with the library's message, a T1 plan covers every
# layer once, and the JSON report carries the cells and the bubble.
# Run from the repository root: bash tests/cli/plan.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

# expect STATUS NEEDLE ARGS...: gpipe plan ARGS exits STATUS and its stderr contains NEEDLE.
expect() {
    local want=$1 needle=$2 rc
    shift 2
    "$GPIPE" plan "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        bad "gpipe plan $*: exit status $rc, expected $want; stderr: $(head -c 400 "$TMP/err")"
    elif ! grep -qF -- "$needle" "$TMP/err"; then
        bad "gpipe plan $*: stderr does not mention '$needle': $(head -c 400 "$TMP/err")"
    fi
}

# --help lists every option; gpipe --help lists the command
"$GPIPE" plan --help >"$TMP/help" 2>&1 || bad "gpipe plan --help exited non-zero"
for opt in --model --stages --micro-batches --batch --memory-limit --remat --schedule \
    --partition --optimizer --gflops --threads --report --devices --top --device --help "default:"; do
    grep -qF -- "$opt" "$TMP/help" || bad "gpipe plan --help does not document $opt"
done
"$GPIPE" --help | grep -q '^  plan ' || bad "gpipe --help does not list plan"

# Bad values: exit 2 naming the option
T="--model transformer --gflops 100"
expect 2 "--model: required" --stages 2
expect 2 "--model" --model "$TMP/missing.json"
for opt in --stages --micro-batches --batch; do
    for v in 0 -1 two 1.5; do expect 2 "$opt" $T "$opt" "$v"; done
done
for v in 0 -1 nan inf abc; do expect 2 "--gflops" --model transformer --gflops "$v"; done
for v in 0 -5 12Q abc; do expect 2 "--memory-limit" $T --memory-limit "$v"; done
for v in 0 -1 two 1025; do expect 2 "--threads" $T --threads "$v"; done
expect 2 "--remat" $T --remat all
expect 2 "--schedule" $T --schedule looped
expect 2 "--optimizer" $T --optimizer rmsprop
expect 2 "--report" $T --report ""
expect 2 "--partition" $T --stages 2 --partition 0,x
expect 2 "--partition 0,6: 2 entries for --stages 3" $T --stages 3 --partition 0,6
expect 2 "--partition 0,6,4" $T --stages 3 --partition 0,6,4
expect 2 "--partition 0,6,12" $T --stages 3 --partition 0,6,12
expect 2 "--micro-batches 5: does not divide the batch of 32 examples" $T --micro-batches 5
expect 2 "--stages 13: more than the model's 12 layers" $T --stages 13
# the library's check of the options, each complaint naming the option that sets the field
expect 2 "--batch 30: does not divide into 4 replicas x 2 micro-batches" $T --batch 30 \
    --micro-batches 2 --data-parallel 4
expect 2 "--micro-batches 3: not a multiple of the 2 stages" $T --stages 2 --micro-batches 3 \
    --batch 30 --schedule interleaved
expect 2 "--balance time with 2 tensor-parallel shards" $T --stages 2 --tensor-parallel 2 \
    --balance time
expect 2 "unknown option '--steps'" $T --steps 3
expect 2 "--device" $T --device tpu
expect 2 "--balance time with --device cuda: layers are timed on the CPU only" $T --stages 2 \
    --balance time --device cuda
# Stage devices on GPUs: sized and timed on a GPU, so where this machine has none, exit 1
# naming why (a GPU machine plans: bench/gpu/run.sh).
if ! "$GPIPE" plan $T --stages 2 --device cuda >"$TMP/cuda.out" 2>"$TMP/cuda.err"; then
    grep -qE "CUDA|cuda" "$TMP/cuda.err" || bad "plan --device cuda without a GPU: $(cat "$TMP/cuda.err")"
elif ! grep -q "stage devices: cuda" "$TMP/cuda.out"; then
    bad "plan --device cuda: no 'stage devices: cuda' line: $(cat "$TMP/cuda.out")"
fi

# Impossible plans: exit 1 with the library's message
expect 2 "--gflops with --balance time" --model transformer --stages 2 --balance time --gflops 10
expect 2 "--balance: expected one of cost|time" $T --stages 2 --balance flops
# Balanced on measured times: a plan, saying so, with a balance key in the report.
if "$GPIPE" plan --model convnet --stages 2 --micro-batches 4 --balance time \
    --report "$TMP/time.json" >"$TMP/time.out" 2>"$TMP/time.err"; then
    grep -q "cells balanced by measured time" "$TMP/time.out" || bad "plan --balance time: $(cat "$TMP/time.out")"
    python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['pipeline']; sys.exit(p['balance'] != 'time' or len(p['partition']) != 2)" \
        "$TMP/time.json" || bad "plan --balance time: report $(cat "$TMP/time.json")"
else
    bad "gpipe plan --balance time failed: $(cat "$TMP/time.err")"
fi
expect 1 "over the" $T --stages 2 --micro-batches 8 --memory-limit 100M
expect 1 "over the" $T --stages 3 --partition 0,1,2 --memory-limit 200M
expect 1 "stage k keeps at most min(K - k, M)" $T --stages 2 --micro-batches 8 --schedule 1f1b \
    --memory-limit 64M

# T1 with K = 2, M = 8: two cells covering layers 0-11, the bubble beside the formula
if "$GPIPE" plan $T --stages 2 --micro-batches 8 --report "$TMP/p.json" >"$TMP/t1.out" 2>"$TMP/t1.err"; then
    rows=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+-[0-9]+$/ { print $1 ":" $2 }' "$TMP/t1.out" | tr '\n' ' ')
    [ "$rows" = "0:0-5 1:6-11 " ] || bad "T1 K=2 cells are '$rows', expected '0:0-5 1:6-11 '"
    grep -qF "(K-1)/(M+K-1) = 0.1111" "$TMP/t1.out" || bad "no theoretical bubble 0.1111 in: $(cat "$TMP/t1.out")"
    grep -q "^predicted step" "$TMP/t1.out" || bad "no predicted step time"
    python3 - "$TMP/p.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
r = json.load(open(sys.argv[1]))
p = r["pipeline"]
cells = p["cells"]
need(p["stages"] == 2 and p["micro_batches"] == 8, "stages/micro_batches %r" % p)
need(p["schedule"] == "gpipe" and p["remat"] == "cell", "schedule/remat")
need(len(cells) == 2, "%d cells" % len(cells))
need([c["first"] for c in cells] == p["partition"] == [0, 6], "partition %r" % p["partition"])
need(cells[0]["last"] == 5 and cells[1]["last"] == 11, "last layers")
need(sum(c["nparams"] for c in cells) == r["nparams"] == 25547776, "parameters add up")
for c in cells:
    b = c["peak_bytes"]
    need(b["transient"] > 0, "cell %d transient bytes: %r" % (c["stage"], b))
    need(b["total"] == b["parameters"] + b["gradients"] + b["optimizer_state"] + b["activations"]
         + b["transient"],
         "cell %d bytes add up: %r" % (c["stage"], b))
    need(b["optimizer_state"] == 2 * b["gradients"], "adamw keeps 2 states")
    need(abs(c["busy_s"] + c["idle_s"] - p["step_s"]) < 1e-9 * p["step_s"], "busy + idle = step")
    need(c["peak_in_flight"] == 8, "gpipe holds all 8 micro-batches")
need(abs(p["bubble_theory"] - 1 / 9) < 1e-12, "bubble_theory %r" % p["bubble_theory"])
need(abs(p["bubble_simulated"] - 1 / 9) < 0.02, "bubble_simulated %r" % p["bubble_simulated"])
need(r["gflops_assumed"] == 100 and r["gflops_measured"] is False, "gflops")
finish()
PY
else
    bad "gpipe plan $T --stages 2 --micro-batches 8 failed: $(cat "$TMP/t1.err")"
fi

# 1F1B without --remat: fewer micro-batches in flight, less activation memory
if "$GPIPE" plan $T --stages 2 --micro-batches 8 --schedule 1f1b --remat none \
    --report "$TMP/f.json" >"$TMP/f.out" 2>"$TMP/f.err"; then
    python3 - "$TMP/f.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
p = json.load(open(sys.argv[1]))["pipeline"]
need(p["schedule"] == "1f1b" and p["remat"] == "none", "schedule/remat")
need([c["peak_in_flight"] for c in p["cells"]] == [2, 1], "1f1b in flight per stage")
finish()
PY
else
    bad "1f1b plan failed: $(cat "$TMP/f.err")"
fi

# Selective re-materialization under a limit just below the keep-all plan's largest cell:
# the cells that still fit keep their state, the others recompute, all within the limit.
worst() { # worst REMAT [LIMIT]: the largest cell's total bytes of a K = 4 plan
    "$GPIPE" plan $T --stages 4 --micro-batches 8 --remat "$1" ${2:+--memory-limit "$2"} \
        --report "$TMP/sel_$1.json" >"$TMP/sel_$1.out" 2>"$TMP/sel.err" ||
        bad "plan --remat $1 ${2:-}: $(cat "$TMP/sel.err")"
    python3 -c "import json,sys; print(max(c['peak_bytes']['total'] for c in json.load(open(sys.argv[1]))['pipeline']['cells']))" "$TMP/sel_$1.json"
}
wn=$(worst none)
if [ -n "$wn" ]; then
    worst selective $((wn - 1)) >/dev/null
    python3 - "$TMP/sel_selective.json" "$((wn - 1))" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
p, limit = json.load(open(sys.argv[1]))["pipeline"], int(sys.argv[2])
modes = [c["remat"] for c in p["cells"]]
need(p["remat"] == "selective" and "none" in modes and "cell" in modes, f"selective cells {modes}")
need(all(c["peak_bytes"]["total"] <= limit for c in p["cells"]), "a selective cell over the limit")
finish()
PY
    grep -Eq "^ +[0-9]+ +[0-9]+-[0-9]+ +(cell|none) " "$TMP/sel_selective.out" ||
        bad "plan --remat selective: no remat column in the table: $(head -c 600 "$TMP/sel_selective.out")"
fi

# A search over 2 devices: the fastest plans, sorted, each of 2 devices (D x K), the fastest in
# full after the table and in the report; given options stay fixed; bad combinations exit 2; a
# limit nothing meets exits 1 naming the leanest plan.
if "$GPIPE" plan $T --devices 2 --top 3 --memory-limit 400M --report "$TMP/search.json" \
    >"$TMP/search.out" 2>"$TMP/search.err"; then
    grep -q "^the fastest in full:" "$TMP/search.out" || bad "plan --devices: no full plan: $(head -c 600 "$TMP/search.out")"
    grep -q "plans of 2 devices tried" "$TMP/search.out" || bad "plan --devices: no count line"
    grep -q "planning: .* of .* plans tried" "$TMP/search.err" || bad "plan --devices: no progress on stderr"
    python3 - "$TMP/search.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
r = json.load(open(sys.argv[1]))
s, p = r["search"], r["pipeline"]
plans = s["plans"]
need(s["devices"] == 2 and len(plans) == 3 and s["fitting"] <= s["candidates"], f"search {s}")
need(all(x["stages"] * x["data_parallel"] * x["tensor_parallel"] == 2 for x in plans), "devices")
need([x["step_s"] for x in plans] == sorted(x["step_s"] for x in plans), "not sorted")
need(all(x["fullest_device_bytes"] <= 400 * 2**20 for x in plans), "over the limit")
b = plans[0]
need((p["stages"], p["micro_batches"], p["data_parallel"], p["schedule"], p["remat"], p["partition"])
     == (b["stages"], b["micro_batches"], b["data_parallel"], b["schedule"], b["remat"], b["partition"]),
     f"the full plan {p} is not the fastest {b}")
need(abs(p["step_s"] - b["step_s"]) <= 1e-12 * b["step_s"], "step")
finish()
PY
else
    bad "plan --devices 2: $(cat "$TMP/search.err")"
fi
"$GPIPE" plan $T --devices 4 --stages 2 --schedule 1f1b --remat cell --micro-batches 4 \
    --report "$TMP/fixed.json" >/dev/null 2>"$TMP/fixed.err" || bad "fixed search: $(cat "$TMP/fixed.err")"
python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))['search']
sys.exit(not (s['candidates'] == 1 and [(x['stages'], x['data_parallel'], x['micro_batches'], x['schedule'], x['remat']) for x in s['plans']] == [(2, 2, 4, '1f1b', 'cell')]))
" "$TMP/fixed.json" || bad "a search with K, M, schedule and remat given: $(cat "$TMP/fixed.json")"
expect 2 "--top: only with --devices" $T --top 3
expect 2 "--partition: fits one plan only" $T --devices 2 --stages 2 --partition 0,6
for v in 0 -1 two; do expect 2 "--devices" $T --devices "$v"; done
expect 1 "the leanest balanced one" $T --devices 2 --memory-limit 20M
expect 1 "no plan of 3 devices meets the constraints" $T --devices 3 --stages 2

# Out of the library's range: usage errors naming the option (not its failure, exit 1, in words
# of the library's fields), and products of options that could overflow refused first.
expect 2 "--devices: expected an integer from 1 to 4096, got '1000000'" $T --devices 1000000
expect 2 "--tensor-parallel: expected an integer from 1 to 4096, got '2147483647'" \
    $T --tensor-parallel 2147483647
expect 2 "--data-parallel: expected an integer from 1 to 4096, got '2147483647'" \
    $T --micro-batches 2 --data-parallel 2147483647
expect 2 "--threads: expected an integer from 1 to 1024, got '1025'" $T --threads 1025
expect 2 "--stages: expected an integer from 1 to 4096, got '4097'" $T --stages 4097
# as many of the fastest as asked for: every plan that fits, when that is fewer
"$GPIPE" plan $T --devices 2 --top 2147483647 >"$TMP/top.out" 2>"$TMP/top.err" ||
    bad "plan --devices 2 --top 2147483647: $(cat "$TMP/top.err")"
grep -qE "^[0-9]+ plans of 2 devices tried, [0-9]+ within the memory limit; the fastest [0-9]+:" \
    "$TMP/top.out" || bad "plan --top 2147483647 lists no plans: $(head -3 "$TMP/top.out")"

# A memory limit under a byte per cell of a stage is a limit, not "none": refused naming it,
# for every schedule that runs several cells a stage and in the search (it once aborted on an
# internal assertion).
for s in "--schedule zbv" "--schedule interleaved --micro-batches 2" \
    "--schedule interleaved --micro-batches 2 --remat selective"; do
    expect 1 "over the 1 bytes per-device limit" $T --stages 2 $s --memory-limit 1
done
expect 1 "none of the" $T --devices 4 --memory-limit 1

# For every schedule the plan's own fullest device is a limit that plan meets, with the same
# cells (zbh1 once refused it); selective keeps each cell's state where the stage fits it.
fullest() { # fullest REPORT: the most bytes of a stage's cells together, and the partition
    python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))['pipeline']
stages = {}
for c in p['cells']:
    stages[c['stage']] = stages.get(c['stage'], 0) + c['peak_bytes']['total']
print(max(stages.values()), ','.join(str(x) for x in p['partition']),
      ','.join(c['remat'] for c in p['cells']))" "$1"
}
for s in gpipe 1f1b zbh1 interleaved zbv; do
    for r in cell none selective; do
        args=($T --stages 2 --micro-batches 8 --schedule "$s" --remat "$r")
        if ! "$GPIPE" plan "${args[@]}" --report "$TMP/free.json" >/dev/null 2>"$TMP/free.err"; then
            bad "plan ${args[*]}: $(cat "$TMP/free.err")"
            continue
        fi
        read -r need cells modes < <(fullest "$TMP/free.json")
        if ! "$GPIPE" plan "${args[@]}" --memory-limit "$need" --report "$TMP/lim.json" \
            >/dev/null 2>"$TMP/lim.err"; then
            bad "plan ${args[*]} --memory-limit $need (its own fullest device): $(cat "$TMP/lim.err")"
            continue
        fi
        read -r got gcells gmodes < <(fullest "$TMP/lim.json")
        [ "$got $gcells $gmodes" = "$need $cells $modes" ] ||
            bad "plan ${args[*]} under its own $need bytes: $got bytes, cells $gcells ($gmodes), expected $cells ($modes)"
    done
done

# Each stage device's threads size its kernels' workspace (attention keeps a T x T score block
# per thread): more threads, more transient bytes, the rest unchanged.
transient() { # transient THREADS: stage 0's transient bytes in the report
    "$GPIPE" plan $T --stages 2 --micro-batches 8 --threads "$1" --report "$TMP/th$1.json" \
        >/dev/null 2>"$TMP/th.err" || bad "plan --threads $1: $(cat "$TMP/th.err")"
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pipeline']['cells'][0]['peak_bytes']['transient'])" "$TMP/th$1.json"
}
t1=$(transient 1)
t2=$(transient 2)
[ -n "$t1" ] && [ -n "$t2" ] && [ "$t2" -gt "$t1" ] ||
    bad "plan --threads 2 transient bytes $t2, expected more than --threads 1's $t1"

# The default rate is measured (a 2048^3 sgemm on one thread); convnet defaults
if "$GPIPE" plan --model convnet --stages 3 --micro-batches 4 >"$TMP/c.out" 2>"$TMP/c.err"; then
    grep -q "measured now" "$TMP/c.out" || bad "convnet plan does not say the rate was measured"
    grep -qF "batch 128 in 4 micro-batches of 32" "$TMP/c.out" || bad "convnet batch default: $(head -1 "$TMP/c.out")"
    n=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+-[0-9]+$/' "$TMP/c.out" | wc -l)
    [ "$n" -eq 3 ] || bad "convnet K=3 printed $n cells"
else
    bad "gpipe plan --model convnet failed: $(cat "$TMP/c.err")"
fi

cli_finish plan
