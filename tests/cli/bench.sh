#!/usr/bin/env bash
# `gpipe bench`: G1, C1, T1 and T2 (K = 2 pipeline stages) on minimal settings
# write reports with the required keys; T1's FLOP count follows the
# WORKLOADS.md formula exactly; T2's pipeline options are checked.
# Run from the repository root: bash tests/cli/bench.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

for w in "G1 --steps 1 --warmup 0" "C1 --batch 8 --steps 2 --warmup 1" "T1 --batch 1 --steps 1 --warmup 0"; do
    set -- $w
    name=$1
    shift
    if ! "$GPIPE" bench --workload "$name" --threads 1 --quiet "$@" --report "$TMP/$name.json" \
        >"$TMP/$name.out" 2>"$TMP/$name.err"; then
        bad "gpipe bench --workload $w failed: $(tail -c 600 "$TMP/$name.err")"
    fi
done
grep -q "^2048^3 " "$TMP/G1.out" || bad "G1 summary lacks the 2048^3 line"
grep -q "images/s" "$TMP/C1.out" || bad "C1 summary lacks images/s"
grep -q "tokens/s" "$TMP/T1.out" || bad "T1 summary lacks tokens/s"

python3 - "$TMP" <<'PY' || fail=$((fail + 1))
import sys
from clicheck import finish, load, need
d = sys.argv[1]
g = load(d, "G1")
need(g.get("workload") == "G1" and g.get("threads") == 1, "G1 workload/threads")
shapes = [(s.get("m"), s.get("n"), s.get("k")) for s in g.get("sgemm", [])]
need(shapes == [(2048, 2048, 2048), (4096, 1536, 512), (4096, 512, 512), (4096, 2048, 512),
                (4096, 512, 2048)], f"G1 shapes {shapes}")
need(all(s["gflops"]["min"] <= s["gflops"]["median"] <= s["gflops"]["max"] and s["gflops"]["min"] > 0
         for s in g.get("sgemm", [])), "G1 spreads")
need(g.get("ceiling_gflops", 0) > 0 and isinstance(g.get("blas_core"), str), "G1 ceiling/blas_core")
for name in ("C1", "T1"):
    r = load(d, name)
    for key in ("workload", "threads", "throughput", "achieved_gflops", "ceiling_gflops",
                "fraction_of_ceiling", "step_seconds", "blas_core", "memory"):
        need(key in r, f"{name}: missing key {key}")
    if not all(k in r for k in ("achieved_gflops", "ceiling_gflops", "fraction_of_ceiling", "step_seconds")):
        continue
    st = r["step_seconds"]
    need(0 < st["min"] <= st["median"] <= st["max"], f"{name}: step_seconds {st}")
    need(r["achieved_gflops"] > 0 and r["ceiling_gflops"] > 0, f"{name}: GFLOP/s")
    fr = r.get("step_fraction_of_ceiling", {})
    need(abs(r["fraction_of_ceiling"] - fr.get("median", -1)) < 1e-12, f"{name}: fraction = median of per-step ratios")
    need(0 < fr.get("min", 0) <= r["fraction_of_ceiling"] <= fr.get("max", 0), f"{name}: fraction spread {fr}")
    sc = r.get("step_ceiling_gflops", {})
    need(abs(r["ceiling_gflops"] - sc.get("median", -1)) < 1e-12 and sc.get("min", 0) > 0, f"{name}: per-step ceilings {sc}")
    need(abs(r["achieved_gflops"] - r["flops_per_step"] / st["median"] / 1e9) < 1e-6 * r["achieved_gflops"],
         f"{name}: achieved = flops / median step")
    peak = r.get("memory", {}).get("peak_bytes", {})
    need(all(isinstance(peak.get(c), int) for c in
             ("parameters", "gradients", "optimizer_state", "activations", "workspace", "total")),
         f"{name}: memory.peak_bytes {peak}")
c1 = load(d, "C1")
need(c1.get("throughput", {}).get("examples_per_s", 0) > 0 and c1.get("batch") == 8, "C1 throughput/batch")
need(c1.get("nparams") == 870826, f"C1 nparams {c1.get('nparams')}")
t1 = load(d, "T1")
need(t1.get("throughput", {}).get("tokens_per_s", 0) > 0, "T1 tokens_per_s")
need(t1.get("nparams") == 25547776, f"T1 nparams {t1.get('nparams')} (WORKLOADS.md: 25,547,776)")
# 647.5 GFLOP for 32 sequences: 6 x 25,296,896 x 128 + 12 x 8 x 128 x 512 x 128 for one
need(t1.get("flops_per_step") == 20233322496, f"T1 flops_per_step {t1.get('flops_per_step')}")
need(t1.get("optimizer_state", 0) == 0 and
     t1.get("memory", {}).get("peak_bytes", {}).get("optimizer_state") == 2 * 4 * 25547776,
     "T1: AdamW state should be two floats per parameter")
finish()
PY

# T2 on 2 stages, 2 micro-batches of one sequence: the real 32-layer model.
if ! "$GPIPE" bench --workload T2 --stages 2 --micro-batches 2 --schedule 1f1b --batch 2 \
    --steps 1 --warmup 0 --quiet --report "$TMP/T2.json" >"$TMP/T2.out" 2>"$TMP/T2.err"; then
    bad "gpipe bench --workload T2 --stages 2 failed: $(tail -c 600 "$TMP/T2.err")"
fi
grep -q "bubble measured" "$TMP/T2.out" || bad "T2 summary lacks the bubble line"
grep -Eq "^remat: selective \(the default\) against .* available on the host / 2\): cells 0-1 none \(their state fits\)$" \
    "$TMP/T2.out" || bad "T2 lacks the remat line: $(grep '^remat' "$TMP/T2.out")"
python3 - "$TMP/T2.json" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import errors, finish, need
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    r = {}
    errors.append(f"T2: {e}")
need(r.get("nparams") == 25436672, f"T2 nparams {r.get('nparams')} (WORKLOADS.md: 25,436,672)")
need(r.get("threads") == 1 and r.get("batch") == 2, "T2 threads/batch")
need(r.get("throughput", {}).get("tokens_per_s", 0) > 0, "T2 tokens_per_s")
# 6 x 25,231,360 matmul params x 256 tokens + 12 x 32 x 128 x 256 x 256
need(r.get("flops_per_step") == 41976594432, f"T2 flops_per_step {r.get('flops_per_step')}")
st = r.get("step_seconds", {})
need(0 < st.get("min", 0) <= st.get("median", 0) <= st.get("max", 0), f"T2 step_seconds {st}")
need(r.get("fraction_of_ceiling", 0) > 0 and r.get("achieved_gflops", 0) > 0, "T2 GFLOP/s")
# The ceiling of 2 stages on threads: one sgemm over both stages' threads at once.
need(r.get("ceiling_basis") == "2048^3 sgemm on all devices' threads at once",
     f"T2 ceiling_basis {r.get('ceiling_basis')}")
alone = r.get("ceiling_one_device_alone_gflops", 0)
need(alone > 0 and abs(r.get("ceiling_together_over_alone", 0) - r.get("ceiling_gflops", 0) / (2 * alone)) < 1e-9,
     f"T2 one device's ceiling alone {alone}, together over alone {r.get('ceiling_together_over_alone')}")
p = r.get("pipeline") or {}
for key in ("stages", "micro_batches", "schedule", "remat", "partition", "busy_fraction",
            "bubble_measured", "bubble_theory", "bubble_simulated", "bubble_replayed"):
    need(key in p, f"T2 pipeline: missing key {key}")
K, M = p.get("stages"), p.get("micro_batches")
# --remat's default: selective against the host's available memory, which T2 fits whole
need((K, M, p.get("schedule"), p.get("remat"), p.get("cell_remat")) == (2, 2, "1f1b", "selective", ["none", "none"])
     and p.get("memory_limit_bytes", 0) > 0, f"T2 pipeline {p}")
if K and M:
    need(abs(p.get("bubble_theory", -1) - (K - 1) / (M + K - 1)) < 1e-12, f"T2 bubble_theory {p.get('bubble_theory')}")
part = p.get("partition", [])
need(len(part) == 2 and part[0] == 0 and 0 < part[1] < 32, f"T2 partition {part}")
sp = p.get("stage_peak_bytes", [])
need(len(sp) == 2 and all(s.get("activations", 0) > 0 and s.get("parameters", 0) > 0 for s in sp),
     f"T2 stage_peak_bytes by category {sp}")
need(isinstance(p.get("pinned"), bool) and p.get("balance") == "cost", f"T2 pinned/balance {p}")
need(len(p.get("busy_fraction", [])) == 2 and all(0 < f <= 1 for f in p.get("busy_fraction", [])),
     f"T2 busy_fraction {p.get('busy_fraction')}")
for key in ("bubble_measured", "bubble_simulated"):
    need(0 <= p.get(key, -1) < 1, f"T2 {key} {p.get(key)}")
finish()
PY

# C1 on 2 stages with the zero-bubble schedule: a pipeline object with its split backwards' bubble.
if "$GPIPE" bench --workload C1 --stages 2 --micro-batches 2 --schedule zbh1 --remat none \
    --batch 4 --steps 1 --warmup 0 --quiet --report "$TMP/C1z.json" >"$TMP/C1z.out" 2>"$TMP/C1z.err"; then
    python3 -c "
import json, sys
p = json.load(open(sys.argv[1])).get('pipeline') or {}
sys.exit(not (p.get('stages') == 2 and p.get('schedule') == 'zbh1' and 0 <= p.get('bubble_simulated', -1) < 1))
" "$TMP/C1z.json" || bad "C1 zbh1 pipeline: $(head -c 400 "$TMP/C1z.json")"
else
    bad "gpipe bench --workload C1 --stages 2 --schedule zbh1 failed: $(tail -c 600 "$TMP/C1z.err")"
fi

# Bad combinations are usage errors (exit 2) naming the option.
usage() {
    local want=$1
    shift
    "$GPIPE" bench "$@" >"$TMP/u.out" 2>"$TMP/u.err"
    local rc=$?
    [ "$rc" -eq 2 ] || bad "gpipe bench $*: exit $rc, expected 2"
    grep -q -e "$want" "$TMP/u.err" || bad "gpipe bench $*: message does not name $want: $(cat "$TMP/u.err")"
}
usage --stages --workload T1 --stages 2
usage --micro-batches --workload T1 --micro-batches 2
usage --schedule --workload C1 --schedule 1f1b
usage --schedule --workload G1 --schedule 1f1b
usage --remat --workload T1 --remat none
usage --schedule --workload T2 --schedule 1f1b
usage --remat --workload T2 --remat none
usage --threads --workload T2 --stages 2 --threads 0
usage --micro-batches --workload T2 --stages 2 --micro-batches 3 --batch 4 --steps 1 --warmup 0
usage --stages --workload T2 --stages 100000 --batch 2 --steps 1 --warmup 0
usage --stages --workload T2 --stages 0
usage --schedule --workload T2 --stages 2 --schedule zigzag
usage --layers --workload T1 --layers 4
usage --memory-limit --workload T2 --memory-limit 1G
usage --balance --workload T2 --balance time
usage --pin --workload C1 --pin off
usage --layers --workload T2 --stages 2 --layers 0
# A limit no split of the layers meets: exit 1 before any step, naming the limit and the cell.
"$GPIPE" bench --workload T2 --layers 2 --stages 2 --memory-limit 4MiB --steps 1 --warmup 0 \
    --quiet >"$TMP/lim.out" 2>"$TMP/lim.err"
rc=$?
[ "$rc" -eq 1 ] && grep -q "4 MiB per-device limit" "$TMP/lim.err" ||
    bad "bench T2 --memory-limit 4MiB: exit $rc, $(cat "$TMP/lim.err")"

cli_finish bench
