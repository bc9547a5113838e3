#!/usr/bin/env bash
# A CPU run pays nothing for CUDA: gpipe links no CUDA library nor NCCL (ldd), and `gpipe --help` and a
# CPU training load none (LD_DEBUG=files lists every file the dynamic loader opens, dlopen's
# included). --device cuda with GP_CUDA_MODULE naming a missing file fails at once (exit 1)
# naming the file. Where the build made the CUDA module (beside gpipe), --device cuda loads it,
# and with it the CUDA runtime, then trains or says that there is no GPU.
# Run from the repository root: bash tests/cli/cuda_module.sh /path/to/gpipe
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"

CUDA_FILES='libcudart|libcublas|libnccl|libgpipe_cuda'

if command -v ldd >/dev/null 2>&1; then
    linked=$(ldd "$GPIPE" | grep -E "$CUDA_FILES")
    [ -z "$linked" ] || bad "gpipe links CUDA libraries: $linked"
fi

# traced NAME ARGS...: gpipe ARGS with the loader's file trace; $TMP/NAME.{out,err,rc} and the
# files it opened, $TMP/NAME.files.
traced() {
    local name=$1
    shift
    LD_DEBUG=files LD_DEBUG_OUTPUT="$TMP/$name.ld" "$GPIPE" "$@" >"$TMP/$name.out" \
        2>"$TMP/$name.err"
    echo $? >"$TMP/$name.rc"
    cat "$TMP/$name.ld".* 2>/dev/null | grep -o 'file=[^ ]*' | sort -u >"$TMP/$name.files"
    grep -q 'file=.*libc\.so' "$TMP/$name.files" || bad "$name: the loader's trace is empty"
}

# no_cuda NAME: the run exited 0 and opened no CUDA file.
no_cuda() {
    [ "$(cat "$TMP/$1.rc")" = 0 ] ||
        bad "$1 exited $(cat "$TMP/$1.rc"): $(tail -c 400 "$TMP/$1.err")"
    local opened
    opened=$(grep -E "$CUDA_FILES" "$TMP/$1.files")
    [ -z "$opened" ] || bad "$1 loaded CUDA files: $opened"
}

cli_write_corpus "$TMP/corpus"
TRAIN=(train --model "$TMP/tiny.json" --data "$TMP/corpus" --steps 2 --batch 4 --threads 1
       --quiet)

traced help --help
no_cuda help
traced cpu "${TRAIN[@]}"
no_cuda cpu
traced cpu_named "${TRAIN[@]}" --device cpu
no_cuda cpu_named

GP_CUDA_MODULE=$TMP/missing.so traced missing "${TRAIN[@]}" --device cuda
[ "$(cat "$TMP/missing.rc")" = 1 ] ||
    bad "--device cuda with a missing module exited $(cat "$TMP/missing.rc")"
grep -qF "gpipe train: --device cuda: cannot load the CUDA device's module $TMP/missing.so: " \
    "$TMP/missing.err" ||
    bad "--device cuda with a missing module: $(head -c 400 "$TMP/missing.err")"
grep -qE 'libcudart|libcublas' "$TMP/missing.files" &&
    bad "a missing module, yet CUDA libraries were loaded"

if [ -f "$(dirname "$GPIPE")/libgpipe_cuda.so" ]; then
    traced gpu "${TRAIN[@]}" --device cuda
    grep -q 'libgpipe_cuda\.so' "$TMP/gpu.files" || bad "--device cuda did not load the module"
    grep -q 'libcudart' "$TMP/gpu.files" || bad "--device cuda did not load the CUDA runtime"
    rc=$(cat "$TMP/gpu.rc")
    [ "$rc" = 0 ] || { [ "$rc" = 1 ] && grep -q "no CUDA GPU available" "$TMP/gpu.err"; } ||
        bad "--device cuda exited $rc: $(head -c 400 "$TMP/gpu.err")"
fi

cli_finish cuda_module
