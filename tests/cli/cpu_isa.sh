#!/usr/bin/env bash
# GP_CPU_ISA: every variant of the CPU kernels this build has and this CPU runs (`gpipe
# --version` lists them) trains the tiny LM and the convnet, and says so in the report; all give
# the same parameters bit for bit (the convnet's default paths all but baseline, which has no
# AVX2 convolutions; with GP_CPU_CONV=im2col every variant); a variant that is unknown, not
# built or beyond this CPU stops gpipe before it starts, with exit 1 and a message naming it.
# Run from the repository root: bash tests/cli/cpu_isa.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

runs=$(GP_CPU_ISA= "$GPIPE" --version | sed -n 's/^CPU kernel variants this CPU runs: //p')
[ -n "$runs" ] || { echo "FAIL: gpipe --version names no variant this CPU runs"; exit 1; }
echo "variants this CPU runs: $runs"

cli_write_corpus "$TMP/corpus"
cli_write_idx "$TMP/syn" 48 16
LM=(--model "$TMP/tiny.json" --data "$TMP/corpus" --steps 4 --batch 4 --eval-size 4 --threads 2
    --quiet)
CONV=(--model convnet --data "$TMP/syn" --steps 2 --batch 16 --eval-size 16 --threads 2 --quiet)
for v in ${runs//,/}; do
    GP_CPU_ISA=$v run "lm_$v" "${LM[@]}" --report "$TMP/lm_$v.json"
    GP_CPU_ISA=$v run "conv_$v" "${CONV[@]}" --report "$TMP/conv_$v.json"
    GP_CPU_ISA=$v GP_CPU_CONV=im2col run "im2col_$v" "${CONV[@]}" --report "$TMP/im2col_$v.json"
done

python3 - "$TMP" ${runs//,/} <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
d, variants = sys.argv[1], sys.argv[2:]
for kind, which in (("lm", variants), ("conv", [v for v in variants if v != "baseline"]),
                    ("im2col", variants)):
    reps = {v: json.load(open(f"{d}/{kind}_{v}.json")) for v in which}
    for v, r in reps.items():
        need(r.get("cpu_isa") == v, f"{kind} under GP_CPU_ISA={v}: report says {r.get('cpu_isa')}")
    hashes = {v: r["params_fnv1a64"] for v, r in reps.items()}
    need(len(set(hashes.values())) == 1, f"{kind}: the variants' parameters differ: {hashes}")
    print(f"{kind}: {', '.join(which)} give parameters {next(iter(hashes.values()))}")
finish("FAIL:")
PY

# refuse: NAME VALUE MESSAGE: gpipe --version and gpipe train under GP_CPU_ISA=VALUE exit 1
# before anything runs, saying MESSAGE.
refuse() {
    local rc=0
    GP_CPU_ISA=$2 "$GPIPE" train "${LM[@]}" --report "$TMP/$1.json" >"$TMP/$1.out" \
        2>"$TMP/$1.err" || rc=$?
    [ "$rc" = 1 ] || bad "GP_CPU_ISA=$2 gpipe train: exit $rc, expected 1"
    grep -qF "$3" "$TMP/$1.err" || bad "GP_CPU_ISA=$2: no '$3' in: $(head -c 400 "$TMP/$1.err")"
    [ -e "$TMP/$1.json" ] && bad "GP_CPU_ISA=$2: a report was written"
    rc=0
    GP_CPU_ISA=$2 "$GPIPE" --version >/dev/null 2>&1 || rc=$?
    [ "$rc" = 1 ] || bad "GP_CPU_ISA=$2 gpipe --version: exit $rc, expected 1"
}
refuse unknown sse9 "gpipe: GP_CPU_ISA=sse9: unknown variant of the CPU kernels, expected \
baseline, avx2, avx512 or native"
for v in avx2 avx512 native; do
    case ", $runs," in
    *", $v,"*) ;;
    *) # not built here (native without GP_NATIVE; off x86-64), or beyond this CPU
        refuse "missing_$v" "$v" "gpipe: GP_CPU_ISA=$v: this"
        grep -qE "this (build has no $v variant|CPU lacks)" "$TMP/missing_$v.err" ||
            bad "GP_CPU_ISA=$v: $(head -c 400 "$TMP/missing_$v.err")" ;;
    esac
done

cli_finish cpu_isa
