#!/usr/bin/env bash
# The OpenBLAS kernels gpipe runs on: a core set in OPENBLAS_CORETYPE is kept; on a processor with
# AVX2 and FMA (skipped elsewhere), a run without it never reports one of OpenBLAS's SSE-only
# cores (OpenBLAS falls back to them on processor models it does not know; gpipe then restarts
# itself with kernels the processor can run), and the restart keeps the arguments and is named in
# --version and in the reports. GP_BLAS_DETECTED_CORE, a test hook, plays OpenBLAS choosing a
# core, so that the restart is tested on processors OpenBLAS knows.
# Run from the repository root: bash tests/cli/blas_core.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

# OpenBLAS's x86 cores whose kernels use SSE at most.
SSE_ONLY=" Katmai Coppermine Northwood Prescott Banias Atom Core2 Penryn Dunnington Nehalem Athlon Opteron Opteron_SSE3 Barcelona Nano Bobcat "

# gp NAME VAR=VALUE... -- ARGS...: gpipe ARGS in the environment without the three variables,
# plus the given ones; stdout and stderr into $TMP/NAME.{out,err}.
gp() {
    local name=$1 vars=()
    shift
    while [ "$1" != "--" ]; do vars+=("$1"); shift; done
    shift
    if ! env -u OPENBLAS_CORETYPE -u GP_BLAS_CORE_REPLACED -u GP_BLAS_DETECTED_CORE "${vars[@]}" \
        "$GPIPE" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"; then
        bad "$name: ${vars[*]} gpipe $* failed: $(tail -c 400 "$TMP/$name.err")"
    fi
}
# core NAME: the core named in $TMP/NAME.out's "BLAS core X" (first line).
core() { sed -n '1s/.*BLAS core \([A-Za-z0-9_]*\).*/\1/p' "$TMP/$1.out"; }

# The user's choice is kept, even an SSE-only one on a processor with AVX-512.
gp user OPENBLAS_CORETYPE=Prescott -- --version
grep -qxE 'gpipe [0-9]+\.[0-9]+\.[0-9]+, BLAS core Prescott, CPU kernels [a-z0-9]+' "$TMP/user.out" ||
    bad "OPENBLAS_CORETYPE=Prescott gpipe --version: '$(cat "$TMP/user.out")', expected core Prescott and nothing else"
gp user_hook OPENBLAS_CORETYPE=Prescott GP_BLAS_DETECTED_CORE=Prescott -- --version
[ "$(core user_hook)" = Prescott ] && ! grep -q "set by gpipe" "$TMP/user_hook.out" ||
    bad "OPENBLAS_CORETYPE=Prescott was not kept: $(cat "$TMP/user_hook.out")"

flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
if [[ "$flags" != *" avx2 "* || "$flags" != *" fma "* ]]; then
    [ "$fail" -eq 0 ] || cli_finish blas_core
    echo "cli blas_core: no AVX2 and FMA here: the restart is not tested (skipped)"
    exit 77
fi

# Unset: never an SSE-only core on this processor, and the output printed once.
gp unset -- --version
c=$(core unset)
[ -n "$c" ] && [[ "$SSE_ONLY" != *" $c "* ]] ||
    bad "gpipe --version without OPENBLAS_CORETYPE runs core '$c': $(cat "$TMP/unset.out")"
# (two lines: the cores, then the CPU kernel variants this processor runs)
[ "$(grep -c "^gpipe " "$TMP/unset.out")" -eq 1 ] && [ "$(wc -l <"$TMP/unset.out")" -eq 2 ] ||
    bad "gpipe --version printed $(wc -l <"$TMP/unset.out") lines: $(cat "$TMP/unset.out")"

# OpenBLAS choosing an SSE-only core (as 0.3.21 does on Emerald Rapids): replaced, and said.
gp hook GP_BLAS_DETECTED_CORE=Core2 -- --version
c=$(core hook)
[[ "$SSE_ONLY" != *" $c "* ]] && grep -qE "BLAS core $c \(set by gpipe: OpenBLAS [^ ]+ chose Core2 for this processor\), CPU kernels [a-z0-9]+$" "$TMP/hook.out" ||
    bad "GP_BLAS_DETECTED_CORE=Core2 gpipe --version: '$(cat "$TMP/hook.out")'"
# OpenBLAS's deliberate choices are kept (Zen on an AMD processor with AVX-512).
gp zen GP_BLAS_DETECTED_CORE=Zen -- --version
! grep -q "set by gpipe" "$TMP/zen.out" || bad "a Zen choice was replaced: $(cat "$TMP/zen.out")"

# The restarted program keeps its name for ps, pgrep and top (its file's, not "exe").
env -u OPENBLAS_CORETYPE -u GP_BLAS_CORE_REPLACED GP_BLAS_DETECTED_CORE=Core2 \
    "$GPIPE" bench --workload G1 --threads 1 --steps 1000 --quiet >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 200); do
    grep -qz "^GP_BLAS_CORE_REPLACED=Core2$" "/proc/$pid/environ" 2>/dev/null && break
    sleep 0.05
done
comm=$(cat "/proc/$pid/comm" 2>/dev/null)
grep -qz "^GP_BLAS_CORE_REPLACED=Core2$" "/proc/$pid/environ" 2>/dev/null ||
    bad "the restarted gpipe's environment lacks GP_BLAS_CORE_REPLACED=Core2"
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
want=$(basename "$GPIPE" | cut -c1-15)
[ "$comm" = "$want" ] || bad "the restarted gpipe is named '$comm' in /proc/PID/comm, expected '$want'"

# The restart keeps the arguments (the report lands where they say) and reports who chose.
gp g1_hook GP_BLAS_DETECTED_CORE=Core2 -- bench --workload G1 --threads 1 --steps 1 --warmup 0 --report "$TMP/g1_hook.json"
grep -q "BLAS core .* (set by gpipe: OpenBLAS .* chose Core2 for this processor)" "$TMP/g1_hook.out" ||
    bad "gpipe bench's line does not say gpipe set the core: $(head -1 "$TMP/g1_hook.out")"
gp g1_user OPENBLAS_CORETYPE=Haswell -- bench --workload G1 --threads 1 --steps 1 --warmup 0 --report "$TMP/g1_user.json"
python3 - "$TMP" "$SSE_ONLY" <<'PY' || fail=$((fail + 1))
import sys
from clicheck import finish, load, need
d, sse = sys.argv[1], sys.argv[2].split()
h = load(d, "g1_hook")
need(h.get("blas_core_chosen_by") == "gpipe" and h.get("blas_core_openblas_chose") == "Core2"
     and h.get("blas_core") not in sse + [None], f"restarted: {h.get('blas_core')}, "
     f"{h.get('blas_core_chosen_by')}, {h.get('blas_core_openblas_chose')}")
u = load(d, "g1_user")
need(u.get("blas_core") == "Haswell" and u.get("blas_core_chosen_by") == "OPENBLAS_CORETYPE"
     and "blas_core_openblas_chose" not in u, f"the user's: {u.get('blas_core')}, "
     f"{u.get('blas_core_chosen_by')}")
finish()
PY

cli_finish blas_core
