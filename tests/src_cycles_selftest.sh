#!/usr/bin/env bash
# The cycle checker (tests/src_cycles.sh) on small objects made for it: it must find a pair of
# files that call each other, a cycle through three files, and files tied by a header they share
# (each defines what it declares, none calls the other), name them, pass a layered set (a header
# per file, included from above only; a name in a header's comment declares nothing), and hold
# its list of known cycles to what is there.
# Usage: bash tests/src_cycles_selftest.sh C_COMPILER
set -u
CC=${1:?usage: bash $0 C_COMPILER}
CHECK="$(dirname "$0")/src_cycles.sh"
command -v nm >/dev/null 2>&1 || { echo "SKIP: nm not found"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# obj NAME 'C SOURCE': compiles NAME.c into the layout CMake uses (lib.dir/src/NAME.c.o, with
# its dependency file NAME.c.o.d); its headers are those of $TMP/src/ (hdr NAME 'TEXT').
mkdir -p "$TMP/lib.dir/src" "$TMP/src"
obj() {
    printf '%s\n' "$2" >"$TMP/$1.c"
    "$CC" -c -MD -MF "$TMP/lib.dir/src/$1.c.o.d" -I"$TMP" -o "$TMP/lib.dir/src/$1.c.o" "$TMP/$1.c" ||
        bad "cannot compile $1.c"
    echo "$TMP/lib.dir/src/$1.c.o"
}
hdr() { printf '%s\n' "$2" >"$TMP/src/$1.h"; }
# a <-> b directly; c -> d -> e -> c; f -> a and f -> c only (not in any cycle).
{
    obj a 'int b1(void); int a1(void) { return b1(); }'
    obj b 'int a1(void); int b1(void) { return 1; } int b2(void) { return a1(); }'
    obj c 'int d1(void); int c1(void) { return d1(); }'
    obj d 'int e1(void); int d1(void) { return e1(); }'
    obj e 'int c1(void); int e1(void) { return c1(); }'
    obj f 'int a1(void); int c1(void); int f1(void) { return a1() + c1(); }'
} >"$TMP/cyclic.txt"
{
    obj g 'int h1(void); int g1(void) { return h1(); }'
    obj h 'int i1(void); int h1(void) { return i1(); }'
    obj i 'int i1(void) { return 2; }'
} >"$TMP/layered.txt"

# One header for p.c and q.c, each including it and defining one of its functions: no call
# between them, but each one's build sees the other's interface, so a change to either's part
# rebuilds both, and either may start calling the other. r.c uses p.c through the header.
hdr pq 'int p1(void); int q1(void);'
{
    obj p '#include "src/pq.h"
int p1(void) { return 1; }'
    obj q '#include "src/pq.h"
int q1(void) { return 2; }'
    obj r '#include "src/pq.h"
int r1(void) { return p1(); }'
} >"$TMP/shared.txt"
# The same split into a header per file (s.h for s.c, t.h for t.c): t.c uses s.c, s.c sees
# nothing of t.c; t1 named in a comment of s.h is no declaration.
hdr s '/* t1 builds on this */ int s1(void);'
hdr t '#include "src/s.h"
int t1(void);'
{
    obj s '#include "src/s.h"
int s1(void) { return 1; }'
    obj t '#include "src/t.h"
int t1(void) { return s1(); }'
} >"$TMP/split.txt"

# check WANT_STATUS KNOWN LIST NEEDLE...: the checker exits WANT_STATUS and prints every NEEDLE.
check() {
    local want=$1 known=$2 list=$3 rc
    shift 3
    GP_KNOWN_CYCLES=$known bash "$CHECK" "$list" >"$TMP/out" 2>&1
    rc=$?
    [ "$rc" -eq "$want" ] || bad "on $(basename "$list") (known: '$known'): exit $rc, expected $want: $(cat "$TMP/out")"
    for needle in "$@"; do
        grep -qF -- "$needle" "$TMP/out" || bad "on $(basename "$list"): no '$needle' in: $(cat "$TMP/out")"
    done
}

check 1 "" "$TMP/cyclic.txt" \
    "depend on each other: src/a.c src/b.c" "src/a.c uses b1 from src/b.c" \
    "src/b.c uses a1 from src/a.c" "depend on each other: src/c.c src/d.c src/e.c" \
    "src/e.c uses c1 from src/c.c"
grep -q "src/f.c" "$TMP/out" && bad "f.c is in no cycle, but the checker names it: $(cat "$TMP/out")"
check 0 "" "$TMP/layered.txt" "ok: 3 objects, 2 pairs"
check 1 "" "$TMP/shared.txt" "depend on each other: src/p.c src/q.c" \
    "src/p.c uses q1 (through src/pq.h) from src/q.c" "src/q.c uses p1 (through src/pq.h) from src/p.c"
grep -q "src/r.c" "$TMP/out" && bad "r.c is in no cycle, but the checker names it: $(cat "$TMP/out")"
check 0 "" "$TMP/split.txt" "ok: 2 objects, 1 pairs"
# Known cycles pass; a known cycle that is not there fails.
check 0 "$(printf 'src/a.c src/b.c\nsrc/c.c src/d.c src/e.c')" "$TMP/cyclic.txt" "ok:"
check 1 "src/c.c src/d.c src/e.c" "$TMP/cyclic.txt" "src/a.c src/b.c"
check 1 "src/g.c src/h.c" "$TMP/layered.txt" 'known cycle "src/g.c src/h.c" is gone'
# Nothing to read is a failure, not a pass.
: >"$TMP/empty.txt"
check 1 "" "$TMP/empty.txt" "0 objects"
check 1 "" "$TMP/missing.txt" "cannot read"
# Without the dependency files the headers are unknown: a failure, not a pass.
rm -f "$TMP"/lib.dir/src/*.d
check 1 "" "$TMP/layered.txt" "no object has a dependency file"

[ "$fail" -eq 0 ] && echo "ok: the cycle checker finds, names and passes what it should"
exit $((fail > 0))
