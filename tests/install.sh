#!/usr/bin/env bash
# What a user of the installed library gets: `cmake --install` into a fresh prefix (the man page
# included), then the header's usage example built with nothing but `pkg-config --cflags --libs
# gpipe` from that prefix, once against the shared library and once (with the shared one
# removed) against the static one with `--static`, each run to its end. pkg-config must point
# into the prefix the files were installed to, not the one the build was configured with.
# Usage: bash tests/install.sh CMAKE BUILD_DIR C_COMPILER [EXTRA_C_FLAGS]
#   BUILD_DIR: a configured and built tree (its header_example.c is the example);
#   EXTRA_C_FLAGS: what the library was built with that a program must link with too
#   (the sanitizers).
set -u
CMAKE=${1:?usage: bash $0 CMAKE BUILD_DIR C_COMPILER [EXTRA_C_FLAGS]}
BUILD=${2:?usage: bash $0 CMAKE BUILD_DIR C_COMPILER [EXTRA_C_FLAGS]}
CC=${3:?usage: bash $0 CMAKE BUILD_DIR C_COMPILER [EXTRA_C_FLAGS]}
read -r -a EXTRA <<<"${4:-}"
command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: pkg-config not found"; exit 77; }
EXAMPLE=$BUILD/header_example.c
[ -r "$EXAMPLE" ] || { echo "FAIL: no $EXAMPLE (configure with GP_BUILD_TESTS=ON)"; exit 1; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
PREFIX=$TMP/prefix

if ! "$CMAKE" --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" 2>&1; then
    cat "$TMP/install.log"
    echo "FAIL: cmake --install $BUILD --prefix $PREFIX"
    exit 1
fi
pc=$(find "$PREFIX" -name gpipe.pc)
[ -n "$pc" ] || { echo "FAIL: no gpipe.pc under $PREFIX"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
"$PREFIX/bin/gpipe" --help >/dev/null 2>&1 || bad "the installed $PREFIX/bin/gpipe --help fails"

# The man page: installed where man looks (MANDIR/man1), a roff page (.TH first) with a
# section for every command the installed gpipe lists, and readable by man where it exists.
manpage=$(find "$PREFIX" -path '*/man1/gpipe.1' -type f | head -n 1)
if [ -z "$manpage" ]; then
    bad "no man1/gpipe.1 under $PREFIX"
else
    grep -v '^\.\\"' "$manpage" | head -n 1 | grep -q '^\.TH GPIPE 1 ' ||
        bad "$manpage does not start with .TH GPIPE 1: $(head -c 200 "$manpage")"
    cmds=$("$PREFIX/bin/gpipe" --help | sed -n '/^Commands:/,/^$/s/^  \([a-z][a-z0-9-]*\)  .*/\1/p')
    [ -n "$cmds" ] || bad "no commands in the installed gpipe --help"
    for c in $cmds; do
        grep -q "^\.SS \"gpipe $c\"\$" "$manpage" || bad "$manpage has no section for gpipe $c"
    done
    if command -v man >/dev/null 2>&1; then
        MANWIDTH=100 man -l "$manpage" >"$TMP/man.txt" 2>"$TMP/man.err" ||
            bad "man -l $manpage failed: $(head -c 400 "$TMP/man.err")"
        grep -q 'gpipe train' "$TMP/man.txt" || bad "man -l $manpage shows no 'gpipe train'"
    fi
fi

# inside DIR: DIR (pkg-config gives it unresolved, ../ and all) is a folder of the prefix.
inside() {
    local real
    real=$(cd "$1" 2>/dev/null && pwd -P) || return 1
    case "$real/" in "$(cd "$PREFIX" && pwd -P)"/*) return 0 ;; *) return 1 ;; esac
}
incdir=$(pkg-config --variable=includedir gpipe)
libdir=$(pkg-config --variable=libdir gpipe)
inside "$incdir" && [ -f "$incdir/gpipe.h" ] ||
    bad "pkg-config's includedir '$incdir' is not the installed header's folder under $PREFIX ($(grep '^prefix=' "$pc"))"
inside "$libdir" && ls "$libdir"/libgpipe.* >/dev/null 2>&1 ||
    bad "pkg-config's libdir '$libdir' is not the installed library's folder under $PREFIX ($(grep '^prefix=' "$pc"))"
found=0
for f in $(pkg-config --cflags-only-I gpipe); do
    d=${f#-I}
    inside "$d" && [ -f "$d/gpipe.h" ] && found=1
done
[ "$found" -eq 1 ] || bad "no -I of 'pkg-config --cflags gpipe' ($(pkg-config --cflags gpipe)) is the installed header's folder under $PREFIX"

# build NAME SOURCE PKG_CONFIG_ARGS...: SOURCE compiled and linked with only pkg-config's flags
# (the source tree's include/ is not on the path: the header must come from the prefix).
build() {
    local name=$1 src=$2
    shift 2
    # shellcheck disable=SC2046  # pkg-config's output is a list of words
    if ! "$CC" "${EXTRA[@]}" -o "$TMP/$name" "$src" $(pkg-config "$@" gpipe) \
        >"$TMP/$name.log" 2>&1; then
        bad "$name: $CC $src \$(pkg-config $* gpipe) failed: $(head -c 1500 "$TMP/$name.log")"
        return 1
    fi
}
# run NAME [ENV...]: the example runs to its end: exit 0, the loss fell.
run() {
    local name=$1 rc
    shift
    env "$@" "$TMP/$name" >"$TMP/$name.out" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || bad "$name exited $rc: $(head -c 1500 "$TMP/$name.out")"
    grep -q '^loss ' "$TMP/$name.out" || bad "$name printed no loss: $(head -c 400 "$TMP/$name.out")"
}

if build shared "$EXAMPLE" --cflags --libs; then
    run shared LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if command -v ldd >/dev/null 2>&1; then
        so=$(LD_LIBRARY_PATH="$libdir" ldd "$TMP/shared" | awk '/libgpipe/ { print $3 }')
        [ -n "$so" ] && inside "$(dirname "$so")" ||
            bad "the shared build does not load libgpipe from $libdir: '$so'"
    fi
fi

# The CUDA device's module, where the build made it: installed in LIBDIR/gpipe/, and found
# there by a program on the shared library and by the installed gpipe (libgpipe.a linked in),
# neither of which links a CUDA library. Asking for a GPU then reaches the CUDA runtime: a
# GPU, or "no CUDA GPU available", never a module that is not found.
cat >"$TMP/cuda_probe.c" <<'EOF'
#include <stdio.h>
#include "gpipe.h"
int main(void) {
    int n = 0;
    gp_status s = gp_cuda_device_count(&n);
    printf("%s: %s\n", gp_status_name(s), s == GP_OK ? "GPUs found" : gp_last_error());
    return 0;
}
EOF
if [ -f "$BUILD/libgpipe_cuda.so" ]; then
    [ -f "$libdir/gpipe/libgpipe_cuda.so" ] ||
        bad "the CUDA module is not installed in $libdir/gpipe/"
    if command -v ldd >/dev/null 2>&1; then
        for f in "$PREFIX/bin/gpipe" "$libdir"/libgpipe.so; do
            ! LD_LIBRARY_PATH="$libdir" ldd "$f" | grep -qE 'libcudart|libcublas' ||
                bad "$f links CUDA libraries"
        done
    fi
    if build cuda_probe "$TMP/cuda_probe.c" --cflags --libs; then
        LD_LIBRARY_PATH="$libdir" "$TMP/cuda_probe" >"$TMP/cuda_probe.out" 2>&1
        grep -qE "^GP_OK|no CUDA GPU available" "$TMP/cuda_probe.out" || bad "a program on" \
            "the installed libgpipe.so asking for a GPU: $(head -c 600 "$TMP/cuda_probe.out")"
    fi
    "$PREFIX/bin/gpipe" train --model transformer --device cuda --data "$TMP/none" --steps 1 \
        >"$TMP/gpipe_cuda.out" 2>&1
    ! grep -q "CUDA device's module" "$TMP/gpipe_cuda.out" ||
        bad "the installed gpipe --device cuda: $(head -c 600 "$TMP/gpipe_cuda.out")"
fi

# Static: with the shared library gone, -lgpipe can only be libgpipe.a, which needs the
# private dependencies --static adds (cJSON, zlib, OpenBLAS, MPI where built with it).
rm -f "$libdir"/libgpipe.so*
if build static "$EXAMPLE" --static --cflags --libs; then
    run static
    if command -v ldd >/dev/null 2>&1 && ldd "$TMP/static" | grep -q libgpipe; then
        bad "the static build still loads a libgpipe: $(ldd "$TMP/static" | grep libgpipe)"
    fi
fi
# The example never reaches the MPI backend, so the linker leaves it out of the archive; a
# program that asks for it brings it, and with it MPI's libraries where built with MPI.
printf '#include <stdio.h>\n#include "gpipe.h"\nint main(void) { printf("mpi %%d\\n", gp_mpi_built()); return 0; }\n' \
    >"$TMP/mpi_probe.c"
if build mpi_probe "$TMP/mpi_probe.c" --static --cflags --libs; then
    env "$TMP/mpi_probe" >"$TMP/mpi_probe.out" 2>&1 || bad "mpi_probe failed: $(head -c 400 "$TMP/mpi_probe.out")"
fi

[ "$fail" -eq 0 ] && echo "ok: installed into a fresh prefix, the header's example built with pkg-config (shared and static) and ran"
exit $((fail > 0))
