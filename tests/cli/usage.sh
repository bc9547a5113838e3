#!/usr/bin/env bash
# Usage errors of the gpipe CLI: every bad value exits 2 with a message naming
# the option, runtime failures exit 1, and --help lists every option.
# Run from the repository root: bash tests/cli/usage.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"
n=0

# expect STATUS NEEDLE ARGS...: gpipe ARGS exits STATUS and its stderr contains NEEDLE.
expect() {
    local want=$1 needle=$2 rc
    shift 2
    n=$((n + 1))
    "$GPIPE" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "FAIL: gpipe $*: exit status $rc, expected $want; stderr: $(head -c 400 "$TMP/err")"
        fail=$((fail + 1))
    elif ! grep -qF -- "$needle" "$TMP/err"; then
        echo "FAIL: gpipe $*: stderr does not mention '$needle': $(head -c 400 "$TMP/err")"
        fail=$((fail + 1))
    fi
}

printf '{"family": "transformer", "vocab": 256, "dim": 16, "heads": 2, "d_ff": 32, "layers": 1, "seq_len": 8}\n' >"$TMP/lm.json"
printf '{"family": "transformer", "dim": 16,\n' >"$TMP/broken.json"
printf '{"family": "transformer", "dimension": 16}\n' >"$TMP/unknown_key.json"

# The command itself
expect 2 "missing command"
expect 2 "unknown command 'trian'" trian
expect 2 "unknown option '--bogus'" --bogus

# gpipe train: one bad value at a time
C="train --model convnet"
expect 2 "--model: required" train
expect 2 "--model" train --model
expect 2 "--model" train --model ""
expect 2 "--model" train --model "$TMP/missing.json"
expect 2 "--model" train --model "$TMP/broken.json"
expect 2 "dimension" train --model "$TMP/unknown_key.json"
expect 2 "unknown option '--bogus'" $C --bogus 1
expect 2 "unexpected argument 'extra'" $C extra
expect 2 "--epochs: missing value" $C --epochs
for v in abc -1 0 1.5 "" " 3" 3x 99999999999; do
    expect 2 "--epochs" $C --epochs "$v"
done
for opt in --steps --batch --micro-batches --threads --eval-every --eval-size --log-every; do
    expect 2 "$opt" $C "$opt" 0
    expect 2 "$opt" $C "$opt" -3
    expect 2 "$opt" $C "$opt" two
done
expect 2 "--warmup" $C --warmup -1
expect 2 "--warmup" $C --warmup x
for v in 0 -1 abc nan inf 1e999 0.1x; do
    expect 2 "--lr" $C --lr "$v"
done
for opt in --weight-decay --clip --momentum; do
    expect 2 "$opt" $C "$opt" -0.5
    expect 2 "$opt" $C "$opt" nan
done
expect 2 "--momentum" $C --momentum 1
expect 2 "--min-lr 0.1: must not exceed the peak --lr 0.05" $C --min-lr 0.1
expect 2 "--min-lr" $C --min-lr -1
expect 2 "--momentum" train --model "$TMP/lm.json" --momentum 0.9
expect 2 "--seed" $C --seed -1
expect 2 "--seed" $C --seed 1.5
expect 2 "--seed" $C --seed 99999999999999999999999
for v in 0 -5 12Q 1.5X K abc; do
    expect 2 "--memory-limit" $C --memory-limit "$v"
done
expect 2 "--optimizer" $C --optimizer rmsprop
expect 2 "--lr-schedule" $C --lr-schedule linear
expect 2 "--quiet" $C --quiet=1
expect 2 "--lr: given more than once" $C --lr 0.1 --lr 0.2
expect 2 "--epochs and --steps" $C --epochs 1 --steps 10
expect 2 "--micro-batches 3: does not divide the batch of 16 examples" $C --batch 16 \
    --micro-batches 3
expect 2 "--sample" $C --sample 10
expect 2 "--temperature" $C --temperature 0.5
expect 2 "--epochs" train --model "$TMP/lm.json" --epochs 2
expect 2 "--sample" train --model "$TMP/lm.json" --sample 0
expect 2 "--temperature" train --model "$TMP/lm.json" --sample 5 --temperature -1
expect 2 "--report" $C --report ""

# Out of range where the library, or a float or product the value becomes, has a bound: usage
# errors naming the option and its range, before any work (once the library's failures, exit 1)
expect 2 "--tensor-parallel: expected an integer from 1 to 4096, got '2147483647'" \
    $C --tensor-parallel 2147483647
expect 2 "--stages: expected an integer from 1 to 4096, got '4097'" $C --stages 4097
expect 2 "--devices: expected an integer from 1 to 4096, got '1000000'" $C --plan auto --devices 1000000
expect 2 "--data-parallel: expected an integer from 1 to 4096, got '2147483647'" \
    $C --data-parallel 2147483647
FLOAT_MAX="3.40282e+38"
for v in 1e300 1e-300; do
    expect 2 "--lr: expected a number >= 1.4013e-45 and <= $FLOAT_MAX, got '$v'" $C --lr "$v"
done
for opt in --weight-decay --clip --min-lr; do
    expect 2 "$opt: expected a number >= 0 and <= $FLOAT_MAX, got '1e300'" $C "$opt" 1e300
done
expect 2 "--momentum: expected a number >= 0 and < 1, got '1'" $C --momentum 1
expect 2 "--label-smoothing: expected a number >= 0 and < 1, got '1'" $C --label-smoothing 1
expect 2 "--erase: expected a number >= 0 and <= 1, got '1.5'" $C --erase 1.5
expect 2 "--comm-timeout: expected a number > 0 and <= 1e+09, got '1e300'" $C --comm-timeout 1e300
expect 2 "--layers: expected an integer from 1 to 9996, got '2147483647'" \
    bench --workload T2 --layers 2147483647
expect 2 "--tensor-parallel: expected an integer from 1 to 4096, got '2147483647'" \
    bench --workload T2 --tensor-parallel 2147483647

# Runtime failures: exit 1 with the library's message
expect 1 "cannot load the IDX data from $TMP/nodata" $C --data "$TMP/nodata" --steps 1
expect 1 "--data $TMP/nodata: cannot load the text corpus" train --model "$TMP/lm.json" --data "$TMP/nodata" --steps 1
expect 1 "--memory-limit" $C --memory-limit 1K --steps 1

# gpipe bench
expect 2 "--workload: required" bench
expect 2 "--workload" bench --workload X1
expect 2 "--workload" bench --workload
for opt in --steps --threads --batch; do
    expect 2 "$opt" bench --workload C1 "$opt" 0
done
expect 2 "--warmup" bench --workload C1 --warmup -1
expect 2 "--seed" bench --workload C1 --seed x
expect 2 "--batch: only for T1 and C1" bench --workload G1 --batch 8
expect 2 "unknown option '--epochs'" bench --workload G1 --epochs 1

# --help lists every option (and exits 0), --version prints the version
check_help() {
    local what=$1
    shift
    n=$((n + 1))
    if ! "$GPIPE" "$@" >"$TMP/help" 2>"$TMP/err"; then
        echo "FAIL: gpipe $* exited non-zero"
        fail=$((fail + 1))
        return
    fi
    for opt in $what; do
        if ! grep -qF -- "$opt" "$TMP/help"; then
            echo "FAIL: gpipe $* does not document $opt"
            fail=$((fail + 1))
        fi
    done
}
check_help "train bench --help --version" --help
check_help "train bench" -h
check_help "--model --data --epochs --steps --batch --lr --seed --threads --report --sample
    --eval-every --warmup --weight-decay --clip --optimizer --micro-batches --memory-limit --quiet
    --temperature --eval-size --momentum --lr-schedule --log-every --min-lr --help default:" train --help
check_help "--workload G1 T1 C1 --threads --steps --warmup --report --batch --seed --quiet --help
    default:" bench --help
n=$((n + 1))
if ! "$GPIPE" --version | grep -qE '^gpipe [0-9]+\.[0-9]+\.[0-9]+'; then
    echo "FAIL: gpipe --version does not print 'gpipe X.Y.Z'"
    fail=$((fail + 1))
fi
# every option line of the train help names its default or says it has none
n=$((n + 1))
# (an option's entry may continue on lines indented by 27 spaces)
undocumented=$("$GPIPE" train --help | awk '
    /^  --/ { if (cur != "") print cur; cur = $0; next }
    /^                           / { if (cur != "") cur = cur $0; next }
    { if (cur != "") print cur; cur = "" }
    END { if (cur != "") print cur }' | grep -vE 'default:|^  --quiet|^  --model' || true)
if [ -n "$undocumented" ]; then
    echo "FAIL: options without a default in 'gpipe train --help':"
    echo "$undocumented"
    fail=$((fail + 1))
fi

if [ "$fail" -ne 0 ]; then
    echo "cli usage: $fail of $n checks FAILED"
    exit 1
fi
echo "cli usage: all $n checks passed"
