#!/usr/bin/env bash
# The mesh, as three markdown tables:
# 1. Bytes per step per rank on each mesh axis against the formula: a T2-style model (4 blocks)
#    on D x K x T = 2 x 2 x 2 MPI ranks (oversubscribed: only bytes are read here). Pipeline axis:
#    M x (b x S x d x 4 + 72) per boundary direction (b = batch / (D x M), S = 128, d = 256);
#    data axis: 4 x the shard's trainable parameters of its stage (the replicas' all-reduce);
#    tensor axis: per micro-batch, per block 2 all-reduces of b x S x d floats forward, 2 in the
#    recomputed forward (remat cell) and 2 backward; the embedding's forward (and recomputed),
#    the head's backward, and the split cross-entropy's 3 floats a row.
# 2. Table 1 for width: the largest d_ff (multiples of 256) of an 8-block T2-style model that
#    trains (one real step) under a per-device limit with T = 1, 2, 4 (K = 1) beside K = 2, 4
#    (T = 1): the planner's largest (`gpipe plan --tensor-parallel T --memory-limit`) first, then
#    real steps up or down until the largest that trains.
# 3. T2 (32 blocks) on the 2 cores: tokens/s of T = 2 against K = 2 and D = 2 (2 MPI ranks; T = 2
#    and K = 2 also on threads), all without re-materialization, in rounds (the machine drifts),
#    with the planner's prediction beside each (at G1's one-thread FLOP rate, collectives at
#    --bandwidth 10 GB/s).
# Usage: bash bench/run_mesh.sh [path/to/gpipe] (reports in ${GP_BENCH_OUT:-out/mesh});
# GP_BENCH_STEPS (3), GP_BENCH_WARMUP (1), GP_MESH_ROUNDS (3), GP_MESH_LIMIT (256MiB),
# GP_MESH_PARTS ("1 2 3").
set -eu
GPIPE=${1:-build/gpipe}
OUT=${GP_BENCH_OUT:-out/mesh}
STEPS=${GP_BENCH_STEPS:-3}
WARMUP=${GP_BENCH_WARMUP:-1}
LIMIT=${GP_MESH_LIMIT:-256MiB}
PARTS=${GP_MESH_PARTS:-1 2 3}
mkdir -p "$OUT"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
MPI=1
if "$GPIPE" bench --workload T2 --launcher mpi --stages 2 2>&1 >/dev/null |
    grep -q "MPI support was not built"; then
    echo "bench/run_mesh.sh: $GPIPE was built without MPI: the MPI rows are skipped" >&2
    MPI=0
fi

model() { # model L F: a T2-style model file with L blocks and d_ff F
    local f="$OUT/t2_L$1_F$2.json"
    [ -e "$f" ] || printf '{"family": "transformer", "vocab": 256, "dim": 256, "heads": 4, "d_ff": %d, "layers": %d, "seq_len": 128, "dropout": 0.0}\n' "$2" "$1" >"$f"
    echo "$f"
}

# ------------------------------------------------------------------ 1. bytes per axis
if [[ " $PARTS " == *" 1 "* ]] && [ "$MPI" = 1 ]; then
    echo "== mpirun -np 8 gpipe bench --workload T2 --layers 4 --data-parallel 2 --stages 2 --tensor-parallel 2 --micro-batches 2" >&2
    mpirun --oversubscribe --bind-to none -np 8 "$GPIPE" bench --workload T2 --layers 4 \
        --data-parallel 2 --stages 2 --tensor-parallel 2 --micro-batches 2 --steps 1 --warmup 0 \
        --quiet --report "$OUT/bytes_d2k2t2.json" >&2
fi

# ------------------------------------------------------------------ 2. width
L=8
planned() { # planned K T: the widest d_ff (multiple of 256) the planner fits
    local k=$1 t=$2 f=256 best=0
    while "$GPIPE" plan --model "$(model $L $f)" --stages "$k" --tensor-parallel "$t" \
        --micro-batches 8 --batch 32 --memory-limit "$LIMIT" --gflops 50 >/dev/null 2>&1; do
        best=$f
        f=$((f + 256))
    done
    echo "$best"
}
trains() { # trains K T F: one real step fits under the limit
    local k=$1 t=$2 f=$3 name="w_k$1_t$2_F$3"
    [ "$f" -ge 256 ] || return 1
    echo "== gpipe bench --workload T2 --layers $L --d-ff $f --stages $k --tensor-parallel $t --micro-batches 8 --memory-limit $LIMIT" >&2
    if "$GPIPE" bench --workload T2 --layers "$L" --d-ff "$f" --stages "$k" --tensor-parallel "$t" \
        --micro-batches 8 --memory-limit "$LIMIT" --steps 1 --warmup 0 --quiet \
        --report "$OUT/$name.json" >"$OUT/$name.out" 2>"$OUT/$name.err"; then
        echo "   trains" >&2
        return 0
    fi
    grep -q -i "limit" "$OUT/$name.err" || {
        echo "unexpected failure (not the memory limit): $(cat "$OUT/$name.err")" >&2
        exit 1
    }
    echo "   over the limit" >&2
    rm -f "$OUT/$name.json"
    return 1
}
if [[ " $PARTS " == *" 2 "* ]]; then
    : >"$OUT/width.txt"
    for cfg in "1 1" "1 2" "1 4" "2 1" "4 1"; do
        set -- $cfg
        k=$1 t=$2
        p=$(planned "$k" "$t")
        f=$p
        if trains "$k" "$t" "$f"; then
            while trains "$k" "$t" $((f + 256)); do f=$((f + 256)); done
        else
            f=$((f - 256))
            while [ "$f" -ge 256 ] && ! trains "$k" "$t" "$f"; do f=$((f - 256)); done
        fi
        echo "$k $t $f $p" >>"$OUT/width.txt"
    done
fi

# ------------------------------------------------------------------ 3. T2: T = 2 vs K = 2 vs D = 2
# The machine is shared and its speed drifts: the configurations run in ROUNDS rounds, one after
# another in each, and each row is the median over the rounds of its median step; the planner
# gets one FLOP rate, the median of G1's 2048^3 sgemm on one thread measured first.
ROUNDS=${GP_MESH_ROUNDS:-3}
if [[ " $PARTS " == *" 3 "* ]]; then
    T2=$(model 32 1024)
    "$GPIPE" bench --workload G1 --threads 1 --steps 5 --warmup 1 --quiet --report "$OUT/g1.json" >&2
    GFLOPS=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ceiling_gflops'])" "$OUT/g1.json")
    one() { # one NAME NP ARGS...: bench (NP = 0: threads), report $OUT/NAME.rROUND.json
        local name=$1 np=$2
        shift 2
        local cmd=("$GPIPE" bench --workload T2 --remat none "$@" --steps "$STEPS" --warmup "$WARMUP"
            --quiet --report "$OUT/$name.r$round.json")
        [ "$np" = 0 ] || cmd=(mpirun --bind-to core -np "$np" "${cmd[@]}")
        echo "== round $round: ${cmd[*]}" >&2
        "${cmd[@]}" >&2
    }
    plan() { # plan NAME ARGS...: the planner's prediction for the same configuration
        local name=$1
        shift
        echo "== gpipe plan --model $T2 --remat none $* --gflops $GFLOPS" >&2
        "$GPIPE" plan --model "$T2" --batch 32 --remat none --bandwidth 10 --gflops "$GFLOPS" "$@" \
            --report "$OUT/$name.plan.json" >"$OUT/$name.plan.out"
    }
    plan t2_k1 --stages 1 --micro-batches 1
    plan t2_k2 --stages 2 --micro-batches 8
    plan t2_t2 --tensor-parallel 2 --micro-batches 1
    plan t2_d2 --data-parallel 2 --micro-batches 1
    for round in $(seq 1 "$ROUNDS"); do
        one t2_k1 0 --stages 1 --micro-batches 1
        one t2_k2 0 --stages 2 --micro-batches 8
        one t2_t2 0 --tensor-parallel 2 --micro-batches 1
        if [ "$MPI" = 1 ]; then
            one t2_d2 2 --stages 1 --data-parallel 2 --micro-batches 1
            one t2_t2_mpi 2 --tensor-parallel 2 --micro-batches 1
            one t2_k2_mpi 2 --stages 2 --micro-batches 8
        fi
    done
    echo "$ROUNDS" >"$OUT/rounds.txt"
fi

python3 - "$OUT" "$PARTS" "$LIMIT" <<'PY'
import json, os, sys
d, parts, limit = sys.argv[1], sys.argv[2].split(), sys.argv[3]
def load(name):
    p = os.path.join(d, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None

if "1" in parts and load("bytes_d2k2t2"):
    r = load("bytes_d2k2t2")
    p = r["pipeline"]
    K, D, T, M = p["stages"], p["data_parallel"], p["tensor_parallel"], p["micro_batches"]
    S, C, F, V, H = 128, 256, 1024, 256, 72
    b = r["batch"] // (D * M)
    act = b * S * C * 4
    part = p["partition"]
    L = 4 + 4  # 4 blocks + embedding, positions, final norm, head
    kinds = ["embedding", "pos_embedding"] + ["block"] * 4 + ["layernorm", "head"]
    def shard_params(kind):  # trainable floats a shard holds
        return {"embedding": V * C // T, "pos_embedding": S * C, "layernorm": 2 * C, "head": V * C // T,
                "block": 4 * C + (3 * C * C + 3 * C) // T + C * C // T + C + (C * F + F) // T + F * C // T + C}[kind]
    def tensor(kind):  # forward, backward bytes of one micro-batch
        return {"embedding": (act, 0), "head": (0, act + 3 * b * S * 4), "block": (2 * act, 2 * act)}.get(kind, (0, 0))
    print(f"Bytes per step per rank on each mesh axis: T2-style, 4 blocks, D x K x T = {D} x {K} x {T} "
          f"(8 MPI ranks), batch {r['batch']}, M = {M} (b = {b} sequences a micro-batch), remat "
          f"{p['remat']}\n")
    print("| rank | replica | stage | shard | pipeline bytes | formula | data bytes | formula | tensor bytes | formula |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for e in p["bytes_sent_last_step"]:
        k = e["stage"]
        first, last = part[k], part[k + 1] if k + 1 < K else L
        f_pipe = ((k < K - 1) + (k > 0)) * M * (act + H)
        f_data = 4 * sum(shard_params(kinds[i]) for i in range(first, last)) if D > 1 else 0
        fw = sum(tensor(kinds[i])[0] for i in range(first, last))
        bw = sum(tensor(kinds[i])[1] for i in range(first, last))
        f_tensor = M * (fw * (2 if p["remat"] == "cell" else 1) + bw)
        print(f"| {e['rank']} | {e['replica']} | {k} | {e['shard']} | {e['p2p']} | {f_pipe} | "
              f"{e['allreduce']} | {f_data} | {e['tensor']} | {f_tensor} |")
    print()

if "2" in parts and os.path.exists(os.path.join(d, "width.txt")):
    print(f"Width: the largest d_ff of an 8-block T2-style model (d_model 256, 4 heads, batch 32, "
          f"M = 8, remat cell, AdamW) that trains under {limit} per device\n")
    print("| configuration | devices | largest d_ff | parameters | ratio to T = K = 1 | planner's largest d_ff | peak bytes of the fullest device |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for line in open(os.path.join(d, "width.txt")):
        k, t, f, planned = (int(x) for x in line.split())
        r = load(f"w_k{k}_t{t}_F{f}")
        if not r:
            print(f"| K = {k}, T = {t} | {k * t} | none | | | {planned} | |")
            continue
        peak = max(s["total"] for s in r["pipeline"]["stage_peak_bytes"])
        base = base or f
        print(f"| K = {k}, T = {t} | {k * t} | {f} | {r['nparams']:,} | {f / base:.2f}x | {planned} | "
              f"{peak / 2**20:.1f} MiB |")
    print()

if "3" in parts and os.path.exists(os.path.join(d, "rounds.txt")):
    rounds = int(open(os.path.join(d, "rounds.txt")).read())
    g1 = load("g1")
    print(f"T2 (32 blocks, batch 32, remat none) on the 2 cores, {rounds} rounds of every configuration "
          f"one after another: the median over the rounds of each round's median step; the planner at "
          f"{g1['ceiling_gflops']:.1f} GFLOP/s (G1's one-thread 2048^3 sgemm, measured first) and 10 GB/s\n")
    print("| configuration | launcher | M | tokens/s measured | step s (median of rounds) | each round's step s | planner's tokens/s | planner's step s | bytes per step per device (tensor / pipeline / data) |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = [("one device (K = 1)", "t2_k1", "t2_k1"), ("K = 2", "t2_k2", "t2_k2"),
            ("T = 2", "t2_t2", "t2_t2"), ("D = 2", "t2_d2", "t2_d2"),
            ("K = 2", "t2_k2_mpi", "t2_k2"), ("T = 2", "t2_t2_mpi", "t2_t2")]
    for label, name, plan in rows:
        runs = [load(f"{name}.r{i}") for i in range(1, rounds + 1)]
        if not all(runs):
            continue
        steps = sorted(r["step_seconds"]["median"] for r in runs)
        med = steps[len(steps) // 2] if len(steps) % 2 else 0.5 * (steps[len(steps) // 2 - 1] + steps[len(steps) // 2])
        r = runs[0]
        pl = json.load(open(os.path.join(d, plan + ".plan.json")))["pipeline"]
        p = r.get("pipeline") or {}
        tok = r["batch"] * 128 / med
        ptok = r["batch"] * 128 / pl["step_s"]
        c = max(pl["cells"], key=lambda c: c["bytes_per_step"]["tensor"] + c["bytes_per_step"]["pipeline"])
        by = c["bytes_per_step"]
        each = ", ".join(f"{x['step_seconds']['median']:.2f}" for x in runs)
        print(f"| {label} | {p.get('launcher', 'threads')} | {p.get('micro_batches', 1)} | {tok:.0f} | "
              f"{med:.3f} | {each} | {ptok:.0f} | {pl['step_s']:.3f} | "
              f"{by['tensor']:,} / {by['pipeline']:,} / {by['data']:,} |")
PY
