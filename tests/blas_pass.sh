#!/usr/bin/env bash
# Runs one test under another set of OpenBLAS kernels: bash tests/blas_pass.sh GPIPE CORE CMD...
# sets OPENBLAS_CORETYPE=CORE for CMD. OpenBLAS picks its kernels by processor and by shape, so a
# test whose assertion holds only for one processor's rounding fails here, on the project's own
# machines, instead of on a user's. Skipped (77) where the processor cannot run CORE's kernels
# (Sandybridge's need AVX) or the BLAS does not take the variable (not OpenBLAS, or an OpenBLAS
# built for one processor): `gpipe --version` names the core the BLAS runs.
set -u
gpipe=${1:?usage: bash $0 GPIPE CORE CMD...}
core=${2:?usage: bash $0 GPIPE CORE CMD...}
shift 2
case $core in
Sandybridge) need=avx ;;
Haswell | Zen) need=avx2 ;;
SkylakeX | Cooperlake) need=avx512f ;;
*) need="" ;;
esac
if [ -n "$need" ] && ! grep -qw "$need" /proc/cpuinfo 2>/dev/null; then
    echo "skipped: OpenBLAS's $core kernels need $need, which this processor lacks"
    exit 77
fi
export OPENBLAS_CORETYPE=$core
got=$("$gpipe" --version 2>&1)
if ! [[ $got =~ "BLAS core $core"($|[^A-Za-z0-9]) ]]; then
    echo "skipped: OPENBLAS_CORETYPE=$core is not taken by this BLAS ($got)"
    exit 77
fi
exec "$@"
