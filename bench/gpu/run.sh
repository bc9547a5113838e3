#!/usr/bin/env bash
# The prepared run for a GPU machine: gpipe's GPU tests, training on the GPU against the CPU, and
# T3's speed beside PyTorch on the same GPU, in tiers, each part under its own time guard so one
# failure does not lose the rest. Writes into --out DIR (else $OUT where set, else ./gpu-out):
#   summary.json  the GPU, driver, CUDA version, commit, every part's status (pass, fail,
#                 unavailable, skipped) and figures
#   run.log       every part's command and output
#   timeline.svg  a two-stage training step on the GPU, stages as rows
#   profile_fp32.txt, profile_bf16.txt  T3's GPU time per kernel (GP_CUDA_PROFILE)
#
#   bash bench/gpu/bundle.sh                  # here: build-gpu/ and gpu-bundle.tar.xz (~6 MB)
#   bash bench/gpu/run.sh --tier 1            # there, with gpu-bundle.tar.xz carried
#   bash bench/gpu/run.sh --tier 2 --budget 400   # both tiers, tier 2's parts while under 400 s
#   bash bench/gpu/run.sh --tier 0            # the GPU tests, then T3 bf16 and its profile
#                                             # (and with GP_CUDA_ATTENTION=gemm): a check of
#                                             # a change in under a minute
#   bash bench/gpu/run.sh --dry-run           # no GPU: every step that needs none, from build/
#                                             # (or --bundle BUILD_DIR; a ctest of make test)
#
# Tier 1 (under 4 minutes): the GPU tests (the kernel test also under each bf16 fallback,
# GP_CUDA_ATTENTION=gemm and GP_CUDA_EPILOGUE=prefill); the demo LM and T1 trained at K = 1 on
# the GPU and on the CPU (losses within 1e-5 relative at the first step, 1e-4 at the 50th); K = 1, 2, 4 stages
# on the one GPU with gpipe and 1F1B, bit-identical (the parameters' FNV-1a hash), in fp32 and
# bf16; the demo LM's bf16 loss after 200 steps within 1% of fp32's; a checkpoint saved on the
# GPU resumed on the CPU and on the GPU (bit for bit), one saved on the CPU resumed on the GPU;
# `gpipe plan --device cuda` on T3; T3 (gpipe bench --device cuda) in fp32 and bf16, each with
# its kernel profile and beside bench/peers/t3.py, bf16 also with GP_CUDA_ATTENTION=gemm; the bf16 GEMM's paths on T3's shapes
# (gp_gemm_paths: rounded copies, cuBLAS's own conversion, bf16 storage). Parts of a mode this
# gpipe lacks are marked unavailable. Tier 2 (4 minutes more): T3 in bf16 with the blocks'
# activations kept in fp32 (GP_BF16_ACTIVATIONS=fp32), and with the linear's bias and residual
# prefilled (GP_CUDA_EPILOGUE=prefill); T3 on two stages of the one GPU; every schedule at K = 2
# and 4; compute-sanitizer memcheck over test_kernels_cuda and a 3-step two-stage training; the
# GPU Table 1 (the largest T3-wide model under 16 GiB per stage at K = 1 without
# re-materialization and at K = 4 with it); the PyTorch peer under torch.compile; racecheck.
# --dry-run runs the same comparisons with the CPU in the GPU's place (what they check is then
# trivially true: it shows the script, the programs and the summary work), in under a minute.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TIER=1 DRY=0 OUTDIR=${OUT:-$ROOT/gpu-out} BUNDLE="" BUDGET=0
while [ $# -gt 0 ]; do
    case "$1" in
    --tier) TIER=${2:-}; shift 2 ;;
    --out) OUTDIR=${2:-}; shift 2 ;;
    --bundle) BUNDLE=${2:-}; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --budget) BUDGET=${2:-}; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (--tier 0|1|2, --out DIR, --bundle DIR, --budget S, --dry-run)" >&2
       exit 2 ;;
    esac
done
case "$TIER" in 0 | 1 | 2) ;; *) echo "run.sh: --tier $TIER: expected 0, 1 or 2" >&2; exit 2 ;; esac
case "$BUDGET" in '' | *[!0-9]*) echo "run.sh: --budget $BUDGET: expected whole seconds" >&2; exit 2 ;; esac
[ -n "$OUTDIR" ] || { echo "run.sh: --out: empty" >&2; exit 2; }
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d /tmp/gpipe-gpu.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PARTS=$WORK/parts.jsonl LOG=$OUTDIR/run.log
: >"$PARTS"
: >"$LOG"
T_START=$(date +%s)
CHECK="python3 $ROOT/bench/gpu/check.py"

# ---- the programs: the bundle's on a GPU machine, build/'s for a dry run
if [ $DRY = 1 ]; then
    BIN=${BUNDLE:-$ROOT/build} DEV=cpu
    [ -x "$BIN/gpipe" ] || { echo "run.sh: no gpipe in $BIN (make build, or --bundle BUILD_DIR)" >&2; exit 2; }
else
    DEV=cuda
    if [ -z "$BUNDLE" ]; then
        BUNDLE=$ROOT/gpu-bundle
        if [ ! -d "$BUNDLE" ] && [ -f "$ROOT/gpu-bundle.tar.xz" ]; then
            tar -C "$WORK" -xJf "$ROOT/gpu-bundle.tar.xz" && BUNDLE=$WORK/gpu-bundle
        fi
    fi
    [ -x "$BUNDLE/gpipe" ] || { echo "run.sh: no bundle at $BUNDLE (make it with bench/gpu/bundle.sh and carry gpu-bundle.tar.xz)" >&2; exit 2; }
    BIN=$BUNDLE
    # lib_dir FILE: the folder of the first FILE (the CUDA 13 runtime, cuBLAS) where the image
    # keeps it: the system's, the toolkit's, or PyTorch's wheels.
    lib_dir() {
        local found
        found=$( (ldconfig -p | awk -v f="$1" '$1 == f && !p {p = $NF} END {if (p) print p}'
                  ls /usr/local/cuda*/lib*/"$1" /usr/local/cuda*/targets/*/lib/"$1" 2>/dev/null
                  python3 -c 'import nvidia, os, glob, sys; print(*glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib", sys.argv[1])))' "$1" 2>/dev/null
                 ) | head -1)
        [ -n "$found" ] && dirname "$found"
    }
    cudalibs=$(lib_dir libcublas.so.13)
    rtlibs=$(lib_dir libcudart.so.13)
    export LD_LIBRARY_PATH=$BUNDLE/lib:$cudalibs:$rtlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
GPIPE=$BIN/gpipe
NT=$(nproc)

# ---- helpers
# part NAME SECONDS CMD...: runs CMD under a time guard, its output in the log; sets RC.
part() {
    local name=$1 secs=$2
    shift 2
    local t0=$(date +%s)
    { echo; echo "==== $name (guard ${secs}s): $*"; } >>"$LOG"
    timeout -k 5 "$secs" "$@" >"$WORK/$name.out" 2>&1
    RC=$?
    cat "$WORK/$name.out" >>"$LOG"
    echo "---- $name: exit $RC after $(($(date +%s) - t0))s" >>"$LOG"
    [ $RC = 124 ] || [ $RC = 137 ] && echo "---- $name: stopped by its time guard" >>"$LOG"
    return 0
}
# The summary so far, rewritten after every part: a run stopped from outside keeps what it did.
summarize() {
    $CHECK merge "$PARTS" "gpu=$GPU_NAME" "driver=$DRIVER" "cuda=$CUDA_VERSION" "commit=$COMMIT" \
        "tier=$TIER" "dry_run=$DRY" "cores=$NT" "seconds=$(($(date +%s) - T_START))" \
        "date=$(date -u +%Y-%m-%dT%H:%MZ)" >"$OUTDIR/summary.json.tmp" 2>>"$LOG" &&
        mv "$OUTDIR/summary.json.tmp" "$OUTDIR/summary.json"
}
# record NAME STATUS [KEY JSON-VALUE]...: one part of the summary.
record() {
    local name=$1 status=$2
    shift 2
    $CHECK part "$name" "$status" "$@" >>"$PARTS" 2>>"$LOG" ||
        echo "{\"part\": \"$name\", \"status\": \"$status\"}" >>"$PARTS"
    printf '[%4ds] %-34s %s\n' $(($(date +%s) - T_START)) "$name" "$status"
    summarize
}
# compare NAME check.py-ARGS...: a comparison's JSON into the summary.
compare() {
    local name=$1
    shift
    if $CHECK "$1" "$name" "${@:2}" >"$WORK/$name.json" 2>>"$LOG"; then
        cat "$WORK/$name.json" >>"$PARTS"
        cat "$WORK/$name.json" >>"$LOG"
        printf '[%4ds] %-34s %s\n' $(($(date +%s) - T_START)) "$name" \
            "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$WORK/$name.json")"
        summarize
    else
        record "$name" fail why '"the comparison failed (see run.log)"'
    fi
}

# ---- the machine
if [ $DRY = 1 ]; then
    GPU_NAME="none (dry run)" DRIVER="" CUDA_VERSION=""
else
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
    CUDA_VERSION=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)
    nvidia-smi >>"$LOG" 2>&1
fi
COMMIT=$(cat "$BIN/COMMIT" 2>/dev/null || git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
echo "gpipe GPU run, tier $TIER$([ $DRY = 1 ] && echo ', dry run (CPU in the GPU place)'): GPU $GPU_NAME, driver ${DRIVER:-none}, CUDA ${CUDA_VERSION:-none}, commit ${COMMIT:0:12}, $NT cores"

# Whether this gpipe has the bf16 mode (--precision): its parts run only then.
PRECISIONS=fp32
[[ "$("$GPIPE" train --help 2>/dev/null)" == *--precision* ]] && PRECISIONS="fp32 bf16"

# ---- tier 1, part 1: the GPU tests
for t in test_kernels_cuda test_cuda_api test_pipeline; do
    if [ ! -x "$BIN/$t" ]; then
        record "test:$t" unavailable why '"not built"'
        continue
    fi
    part "test_$t" 120 "$BIN/$t"
    # 77: the test's own skip (no GPU, or no module of this build)
    if [ $RC = 77 ] || { [ $DRY = 1 ] && [ $RC = 0 ]; }; then
        record "test:$t" skipped why '"no GPU (see run.log)"'
    else
        record "test:$t" "$([ $RC = 0 ] && echo pass || echo fail)" exit $RC
    fi
done
# the kernels once more with each of bf16's fallbacks: attention through cuBLAS where the fused
# kernels would take it, and the linear's bias and residual in a prefill pass instead of
# cuBLASLt's epilogue
if [ $DRY = 0 ] && [ -x "$BIN/test_kernels_cuda" ]; then
    for fallback in gemm_attention:GP_CUDA_ATTENTION=gemm prefill_epilogue:GP_CUDA_EPILOGUE=prefill; do
        part "test_kernels_cuda_${fallback%%:*}" 120 env "${fallback#*:}" "$BIN/test_kernels_cuda"
        record "test:test_kernels_cuda_${fallback%%:*}" "$([ $RC = 0 ] && echo pass || echo fail)" \
            exit $RC
    done
fi

# T3 timed by gpipe bench in a precision, then once more with the CUDA device's kernel profile
# (GP_CUDA_PROFILE: GPU time per kernel, printed when the device is freed) into
# profile_PRECISION.txt.
if [ $DRY = 1 ]; then
    T3=(--workload T3 --device cpu --layers 1 --batch 1 --steps 1 --warmup 0)
else
    T3=(--workload T3 --device cuda --steps 5 --warmup 2)
fi
t3_speed() { # t3_speed PRECISION
    local prec=$1 popt=()
    [ "$prec" = bf16 ] && popt=(--precision bf16)
    part "t3_$prec" 150 "$GPIPE" bench "${T3[@]}" "${popt[@]}" --quiet --report "$WORK/t3_$prec.json"
    if [ $RC = 0 ]; then
        record "speed:T3_$prec" pass figures "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({k: r.get(k) for k in ("model","device","precision","nparams","achieved_gflops","ceiling_gflops","fraction_of_ceiling","ceiling_basis")} | {"tokens_per_s": r["throughput"].get("tokens_per_s"), "step_s": r["step_seconds"]["median"], "peak_bytes": r.get("memory", {}).get("peak_bytes", {}).get("total")}))' "$WORK/t3_$prec.json")"
    else
        record "speed:T3_$prec" fail exit $RC
    fi
    [ $DRY = 1 ] && return
    part "profile_$prec" 90 env GP_CUDA_PROFILE=1 "$GPIPE" bench --workload T3 --device cuda \
        --steps 2 --warmup 1 "${popt[@]}" --quiet
    cp "$WORK/profile_$prec.out" "$OUTDIR/profile_$prec.txt"
    record "profile:T3_$prec" "$([ $RC = 0 ] && echo pass || echo fail)" exit $RC
    [ "$prec" = bf16 ] || return
    # bf16 attention through cuBLAS and the softmax kernels instead of the fused kernels
    # (GP_CUDA_ATTENTION=gemm): the comparison
    t3_bf16_with gemm_attention 150 GP_CUDA_ATTENTION=gemm
}

# t3_bf16_with NAME GUARD VAR=VALUE...: T3 in bf16 again with the environment's VAR=VALUE, one
# of bf16's parts turned back to its fallback, for the comparison with t3_bf16
t3_bf16_with() {
    local name=$1 secs=$2
    shift 2
    part "t3_bf16_$name" "$secs" env "$@" "$GPIPE" bench "${T3[@]}" --precision bf16 --quiet \
        --report "$WORK/t3_bf16_$name.json"
    if [ $RC = 0 ]; then
        record "speed:T3_bf16_$name" pass figures "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({"tokens_per_s": r["throughput"].get("tokens_per_s"), "step_s": r["step_seconds"]["median"], "fraction_of_ceiling": r.get("fraction_of_ceiling"), "peak_bytes": r.get("memory", {}).get("peak_bytes", {}).get("total")}))' "$WORK/t3_bf16_$name.json")"
    else
        record "speed:T3_bf16_$name" fail exit $RC
    fi
}

# ---- tier 0: the tests above, then T3 in bf16 with its profile; no more
if [ "$TIER" = 0 ]; then
    if [[ " $PRECISIONS " == *" bf16 "* ]] && [ $DRY = 0 ]; then t3_speed bf16; else t3_speed fp32; fi
fi

if [ "$TIER" != 0 ]; then # tiers 1 and 2
# ---- tier 1, part 2: training on the GPU against the CPU
awk 'BEGIN {RS = ""; ORS = "\n%\n"} {print}' "$ROOT"/README.md "$ROOT"/BENCHMARKS.md "$ROOT"/docs/*.md >"$WORK/corpus.txt"
LM=(--data "$WORK/corpus.txt" --eval-size 8 --quiet --log-every 1 --seed 1)
# train NAME DEVICE GUARD ARGS...: a run with its metrics and report in $WORK/NAME.*
train() {
    local name=$1 dev=$2 secs=$3
    shift 3
    part "$name" "$secs" "$GPIPE" train "${LM[@]}" --device "$dev" --metrics "$WORK/$name.jsonl" \
        --report "$WORK/$name.json" "$@"
    [ $RC = 0 ] || record "run:$name" fail exit $RC
}
# A dry run trains the demo LM 3 steps where the GPU's runs train it and T1 50: it shows the
# comparisons work, not the figures. The CPU's runs go in the background, beside the GPU's.
STEPS=$([ $DRY = 1 ] && echo 3 || echo 50)
MODELS="demo $([ $DRY = 1 ] || echo transformer)"
spec_of() { [ "$1" = demo ] && echo "$ROOT/examples/demo_lm.json" || echo transformer; }
(
    for model in $MODELS; do
        train "${model}_cpu" cpu 200 --model "$(spec_of $model)" --steps $STEPS \
            --threads $((NT > 2 ? NT - 2 : 1))
    done
) &
CPU_RUNS=$!
for model in $MODELS; do
    train "${model}_gpu" $DEV 150 --model "$(spec_of $model)" --steps $STEPS --threads 1
done
# K = 1, 2, 4 stages on the one GPU, gpipe and 1F1B, and no stages: the same parameters bit
# for bit, in each precision.
for prec in $PRECISIONS; do
    runs=()
    popt=()
    [ $prec = bf16 ] && popt=(--precision bf16)
    KS=$([ $DRY = 1 ] && echo 2 || echo 1 2 4) # a dry run: the comparison, not every K
    for k in $KS; do
        for s in gpipe 1f1b; do
            extra=()
            [ "$k" = 2 ] && [ $s = gpipe ] && [ $prec = fp32 ] && extra=(--timeline "$OUTDIR/timeline.svg")
            train "k${k}_${s}_$prec" $DEV 60 --model "$ROOT/examples/demo_lm.json" --steps 10 \
                --stages "$k" --micro-batches 4 --schedule $s --threads 1 "${popt[@]}" "${extra[@]}"
            [ $RC = 0 ] && runs+=("$WORK/k${k}_${s}_$prec.json")
        done
    done
    train "k0_$prec" $DEV 60 --model "$ROOT/examples/demo_lm.json" --steps 10 --micro-batches 4 \
        --threads 1 "${popt[@]}"
    [ $RC = 0 ] && runs+=("$WORK/k0_$prec.json")
    [ ${#runs[@]} -ge 2 ] && compare "bitwise:$prec:K=0,${KS// /,}_gpipe_1f1b" same "${runs[@]}"
done
# bf16's loss beside fp32's: the demo LM, 200 steps, within 1% at the end.
if [ "$PRECISIONS" != fp32 ]; then
    BSTEPS=$([ $DRY = 1 ] && echo 5 || echo 200)
    train lm200_fp32 $DEV 120 --model "$ROOT/examples/demo_lm.json" --steps $BSTEPS --threads 1
    train lm200_bf16 $DEV 120 --model "$ROOT/examples/demo_lm.json" --steps $BSTEPS --threads 1 \
        --precision bf16
    [ -s "$WORK/lm200_bf16.jsonl" ] && [ -s "$WORK/lm200_fp32.jsonl" ] &&
        compare "bf16:demo_loss_vs_fp32_${BSTEPS}_steps" losses "$WORK/lm200_bf16.jsonl" \
            "$WORK/lm200_fp32.jsonl" 1 0.01
else
    record "bf16:demo_loss_vs_fp32" unavailable why '"gpipe has no --precision bf16"'
fi
wait $CPU_RUNS
for model in $MODELS; do
    if [ -s "$WORK/${model}_cpu.jsonl" ] && [ -s "$WORK/${model}_gpu.jsonl" ]; then
        compare "fp32:${model}_gpu_vs_cpu" losses "$WORK/${model}_gpu.jsonl" "$WORK/${model}_cpu.jsonl" 1e-5 1e-4
    else
        record "fp32:${model}_gpu_vs_cpu" fail why '"a run failed (run.log)"'
    fi
done
# Checkpoints across devices: 20 steps, stopped after 10 and resumed.
CK=(--model "$ROOT/examples/demo_lm.json" --steps 20 --threads "$NT")
train full_gpu $DEV 60 "${CK[@]}"
CK+=(--checkpoint-sync)
train stop_gpu $DEV 60 "${CK[@]}" --stop-after 10 --checkpoint-dir "$WORK/ck_gpu"
train stop_cpu cpu 60 "${CK[@]}" --stop-after 10 --checkpoint-dir "$WORK/ck_cpu"
cp -r "$WORK/ck_gpu" "$WORK/ck_gpu2" 2>/dev/null
train gpu_to_cpu cpu 60 "${CK[@]}" --resume --checkpoint-dir "$WORK/ck_gpu"
train gpu_to_gpu $DEV 60 "${CK[@]}" --resume --checkpoint-dir "$WORK/ck_gpu2"
train cpu_to_gpu $DEV 60 "${CK[@]}" --resume --checkpoint-dir "$WORK/ck_cpu"
[ -s "$WORK/gpu_to_gpu.jsonl" ] && compare "checkpoint:gpu_to_gpu_bitwise" resume "$WORK/full_gpu.jsonl" "$WORK/gpu_to_gpu.jsonl" 0
[ -s "$WORK/gpu_to_cpu.jsonl" ] && compare "checkpoint:gpu_to_cpu" resume "$WORK/full_gpu.jsonl" "$WORK/gpu_to_cpu.jsonl" 1e-4
[ -s "$WORK/cpu_to_gpu.jsonl" ] && compare "checkpoint:cpu_to_gpu" resume "$WORK/full_gpu.jsonl" "$WORK/cpu_to_gpu.jsonl" 1e-4

# The planner on GPU stages: T3 on 4 stages of the one GPU, sized by a GPU's kernels, against
# its free memory, timed at its GEMM rate.
printf '{"family": "transformer", "vocab": 256, "dim": 2048, "heads": 16, "d_ff": 8192, "layers": 24, "seq_len": 1024}\n' >"$WORK/t3.json"
part plan_t3 60 "$GPIPE" plan --model "$WORK/t3.json" --batch 8 --stages 4 --micro-batches 8 \
    --device $DEV $([ $DRY = 1 ] && echo --gflops 100) --report "$WORK/plan_t3.json"
if [ $RC = 0 ]; then
    record "plan:T3_K4_$DEV" pass figures "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); p=r["pipeline"]; print(json.dumps({"gflops_assumed": r["gflops_assumed"], "step_s": p["step_s"], "memory_limit_bytes": p["memory_limit_bytes"], "largest_cell_bytes": max(c["peak_bytes"]["total"] for c in p["cells"])}))' "$WORK/plan_t3.json")"
else
    record "plan:T3_K4_$DEV" fail exit $RC
fi

# ---- tier 1, part 3: T3's speed beside PyTorch (t3_speed above, then the peer)
for prec in fp32 bf16; do
    if ! [[ " $PRECISIONS " == *" $prec "* ]]; then
        record "speed:T3_$prec" unavailable why '"gpipe has no --precision bf16"'
        [ $DRY = 0 ] && peer "t3_peer_$prec" 120 --precision $prec --no-gpipe --rounds 1 --steps 5 \
            --warmup 2
        continue
    fi
    if [ $DRY = 1 ] && [ $prec != fp32 ]; then # a dry run times one precision: the plumbing
        record "speed:T3_$prec" skipped why '"dry run"'
        continue
    fi
    t3_speed $prec
    if [ $DRY = 0 ]; then
        # PyTorch right after gpipe's run above (one round each: the lease is short), and the
        # ratio of the two.
        peer "t3_peer_$prec" 150 --precision $prec --no-gpipe --rounds 1 --steps 5 --warmup 2
        if [ -s "$WORK/t3_$prec.json" ] && [ -s "$WORK/t3_peer_$prec.json" ]; then
            record "ratio:T3_${prec}_gpipe_over_pytorch" pass figures "$(python3 -c 'import json,sys; g=json.load(open(sys.argv[1]))["throughput"]["tokens_per_s"]; t=json.load(open(sys.argv[2]))["torch_tokens_per_s"]; print(json.dumps({"gpipe_tokens_per_s": g, "torch_tokens_per_s": t, "ratio": g / t}))' "$WORK/t3_$prec.json" "$WORK/t3_peer_$prec.json")"
        fi
    else
        record "peer:t3_peer_$prec" skipped why '"dry run: no GPU"'
    fi
done

# The bf16 GEMM's three paths on T3's shapes (bench/gpu/gemm_paths.cu): what rounding the
# operands into copies costs against cuBLAS converting inside its kernels and against bf16
# storage.
if [ $DRY = 1 ]; then
    record "gemm:bf16_paths" skipped why '"dry run: no GPU"'
elif [ -x "$BIN/gp_gemm_paths" ]; then
    part gemm_paths 90 "$BIN/gp_gemm_paths"
    if [ $RC = 0 ]; then record "gemm:bf16_paths" pass figures "$(cat "$WORK/gemm_paths.out")"
    else record "gemm:bf16_paths" fail exit $RC; fi
else
    record "gemm:bf16_paths" unavailable why '"no gp_gemm_paths in this build"'
fi

# ---- tier 2, within --budget SECONDS of the start where given (the rest marked skipped)
in_budget() {
    [ "$BUDGET" = 0 ] || [ $(($(date +%s) - T_START)) -lt "$BUDGET" ] && return 0
    record "$1" skipped why '"past --budget"'
    return 1
}
# guard N: N seconds, or what is left of --budget where that is less (at least 10)
guard() {
    local left=$((BUDGET - ($(date +%s) - T_START)))
    [ "$BUDGET" = 0 ] || [ "$left" -ge "$1" ] && { echo "$1"; return; }
    echo $((left > 10 ? left : 10))
}
if [ "$TIER" = 2 ]; then
    # T3 in bf16 with the blocks' activations kept in fp32 (GP_BF16_ACTIVATIONS=fp32): what
    # keeping them in bf16 saves
    if [ $DRY = 0 ] && [[ " $PRECISIONS " == *" bf16 "* ]] && in_budget "speed:T3_bf16_fp32_activations"; then
        t3_bf16_with fp32_activations "$(guard 150)" GP_BF16_ACTIVATIONS=fp32
    fi
    # ... and with the linear's bias and residual prefilled before cuBLAS (GP_CUDA_EPILOGUE=
    # prefill): what cuBLASLt's epilogue saves
    if [ $DRY = 0 ] && [[ " $PRECISIONS " == *" bf16 "* ]] && in_budget "speed:T3_bf16_prefill_epilogue"; then
        t3_bf16_with prefill_epilogue "$(guard 150)" GP_CUDA_EPILOGUE=prefill
    fi
    # T3 on 2 stages of the one GPU (messages GPU to GPU): what a pipeline costs on one device.
    if [ $DRY = 0 ] && in_budget "speed:T3_fp32_K2"; then
        part t3_k2 "$(guard 150)" "$GPIPE" bench --workload T3 --device cuda --stages 2 --micro-batches 4 \
            --steps 3 --warmup 1 --quiet --report "$WORK/t3_k2.json"
        if [ $RC = 0 ]; then
            record "speed:T3_fp32_K2" pass figures "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); p=r.get("pipeline") or {}; print(json.dumps({"tokens_per_s": r["throughput"].get("tokens_per_s"), "step_s": r["step_seconds"]["median"], "fraction_of_ceiling": r.get("fraction_of_ceiling"), "bubble_measured": p.get("bubble_measured"), "bubble_theory": p.get("bubble_theory"), "remat": p.get("cell_remat")}))' "$WORK/t3_k2.json")"
        else
            record "speed:T3_fp32_K2" fail exit $RC
        fi
    fi
    if in_budget "bitwise:every_schedule_K=0,2,4"; then
        runs=()
        for k in 2 4; do
            for s in gpipe 1f1b zbh1 interleaved zbv; do
                train "s${k}_$s" $DEV "$(guard 60)" --model "$ROOT/examples/demo_lm.json" --steps 10 \
                    --stages "$k" --micro-batches 8 --schedule $s --threads 1
                [ $RC = 0 ] && runs+=("$WORK/s${k}_$s.json")
            done
        done
        train s0 $DEV "$(guard 60)" --model "$ROOT/examples/demo_lm.json" --steps 10 --micro-batches 8 \
            --threads 1
        [ $RC = 0 ] && runs+=("$WORK/s0.json")
        [ ${#runs[@]} -ge 2 ] && compare "bitwise:every_schedule_K=0,2,4" same "${runs[@]}"
    fi
    if [ $DRY = 0 ] && command -v compute-sanitizer >/dev/null; then
        if in_budget "sanitizer:memcheck:test_kernels_cuda"; then
            part sanitizer_memcheck "$(guard 150)" compute-sanitizer --tool memcheck --error-exitcode 9 \
                "$BIN/test_kernels_cuda"
            record "sanitizer:memcheck:test_kernels_cuda" "$([ $RC = 0 ] && echo pass || echo fail)" exit $RC
        fi
        if in_budget "sanitizer:memcheck:train_K2"; then
            part sanitizer_train "$(guard 150)" compute-sanitizer --tool memcheck --error-exitcode 9 "$GPIPE" \
                train "${LM[@]}" --device cuda --model "$ROOT/examples/demo_lm.json" --steps 3 \
                --stages 2 --micro-batches 2
            record "sanitizer:memcheck:train_K2" "$([ $RC = 0 ] && echo pass || echo fail)" exit $RC
        fi
    else
        record "sanitizer" "$([ $DRY = 1 ] && echo skipped || echo unavailable)" why '"no compute-sanitizer or no GPU"'
    fi
    # The GPU Table 1: the largest T3-wide model (its layers grown or cut) whose training fits a
    # per-stage limit, at K = 1 without re-materialization and at K = 4 stages on the one GPU
    # with it (M = 8): the planner's largest (a bisection on its verdict), then one step trained
    # at that size under the limit. A dry run: 2 GiB, batch 1, on the CPU.
    if in_budget "table1"; then
        T1_LIMIT=$([ $DRY = 1 ] && echo 2G || echo 16G)
        T1_BATCH=$([ $DRY = 1 ] && echo 1 || echo 8)
        t1_layers=()
        for cfg in "1 1 none" "4 8 cell"; do
            set -- $cfg
            k=$1 mb=$(($2 < T1_BATCH ? $2 : T1_BATCH)) rm=$3 lo=0 hi=512
            while [ $lo -lt $hi ]; do
                mid=$(((lo + hi + 1) / 2))
                printf '{"family": "transformer", "vocab": 256, "dim": 2048, "heads": 16, "d_ff": 8192, "layers": %d, "seq_len": 1024}\n' \
                    $mid >"$WORK/table1.json"
                if "$GPIPE" plan --model "$WORK/table1.json" --batch $T1_BATCH --stages $k \
                    --micro-batches $mb --remat $rm --memory-limit $T1_LIMIT --device $DEV \
                    --gflops 1 >/dev/null 2>&1; then
                    lo=$mid
                else
                    hi=$((mid - 1))
                fi
            done
            if [ $lo = 0 ]; then
                record "table1:K=${k}_$rm" fail why "\"no layer count fits $T1_LIMIT\""
                continue
            fi
            part "table1_k$k" "$(guard 120)" "$GPIPE" bench --workload T3 --device $DEV \
                --layers $lo --batch $T1_BATCH --stages $k --micro-batches $mb --remat $rm \
                --memory-limit $T1_LIMIT --steps 1 --warmup 0 --quiet --report "$WORK/table1_k$k.json"
            if [ $RC = 0 ]; then
                record "table1:K=${k}_$rm" pass figures "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({"limit": sys.argv[2], "layers": int(sys.argv[3]), "nparams": r["nparams"], "stage_peak_bytes": [s["total"] for s in (r.get("pipeline") or {}).get("stage_peak_bytes", [])], "step_s": r["step_seconds"]["median"]}))' "$WORK/table1_k$k.json" $T1_LIMIT $lo)"
            else
                record "table1:K=${k}_$rm" fail exit $RC layers $lo
            fi
        done
    fi
    if [ $DRY = 0 ] && in_budget "peer:t3_peer_compile"; then
        peer t3_peer_compile "$(guard 200)" --precision bf16 --compile --no-gpipe --rounds 1 --steps 5 --warmup 3
    fi
    if [ $DRY = 0 ] && command -v compute-sanitizer >/dev/null &&
        in_budget "sanitizer:racecheck:test_kernels_cuda"; then
        part sanitizer_racecheck "$(guard 150)" compute-sanitizer --tool racecheck --error-exitcode 9 \
            "$BIN/test_kernels_cuda"
        record "sanitizer:racecheck:test_kernels_cuda" "$([ $RC = 0 ] && echo pass || echo fail)" exit $RC
    fi
fi

fi # tiers 1 and 2

rm -f "$OUTDIR/summary.json"
summarize || { echo "run.sh: the summary could not be written (run.log says why)" >&2; exit 1; }
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("summary:", s["counts"], "in", s["seconds"], "s ->", sys.argv[1])' "$OUTDIR/summary.json"
python3 -c 'import json,sys; sys.exit(1 if json.load(open(sys.argv[1]))["counts"]["fail"] else 0)' "$OUTDIR/summary.json"
