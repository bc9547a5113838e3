#!/usr/bin/env bash
# The library's files form a layering: no file of src/ calls into a file that calls back into it,
# directly (A uses a global symbol that B defines and B uses one that A defines) or through other
# files. Read from the compiled objects, so it sees what the code really calls, not what a header
# declares: nm lists the global symbols each object defines and the undefined ones it uses.
# Usage: bash tests/src_cycles.sh OBJECTS_LIST
#   OBJECTS_LIST: a file naming the library's object files, one a line (CMake writes it).
# Exit status: 0 no cycle; 1 a cycle (each printed with the symbols that make it), a stale
# exception, or an unusable input; 77 (skipped) without nm.
set -u
list=${1:?usage: bash $0 OBJECTS_LIST}

# Cycles known and waiting for their fix, one a line, each its files sorted and separated by one
# space (GP_KNOWN_CYCLES replaces the list, for the checker's own test). None today. An exception
# that no longer holds fails too, so that this list only ever shrinks.
KNOWN_CYCLES=${GP_KNOWN_CYCLES-""}

command -v nm >/dev/null 2>&1 || { echo "SKIP: nm not found"; exit 77; }
[ -r "$list" ] || { echo "FAIL: cannot read the object list $list"; exit 1; }

# One line per symbol: "FILE TYPE NAME" (POSIX nm format: name, type, value, size).
table=$(mktemp)
trap 'rm -f "$table"' EXIT
nobj=0
while IFS= read -r obj; do
    [ -n "$obj" ] || continue
    if [ ! -r "$obj" ]; then
        echo "FAIL: object $obj is missing (build the library first)"
        exit 1
    fi
    # The source file the object was compiled from, as a reader knows it: src/dir/file.c.
    name=$(printf '%s\n' "$obj" | sed -e 's|^.*\.dir/||' -e 's|\.o$||' -e 's|\.obj$||')
    if ! nm -P -g "$obj" | awk -v f="$name" 'NF >= 2 { print f, $2, $1 }' >>"$table"; then
        echo "FAIL: nm could not read $obj"
        exit 1
    fi
    nobj=$((nobj + 1))
done <"$list"

known="$KNOWN_CYCLES" awk -v nobj="$nobj" '
    # Defined (any upper-case type but U: text, data, bss, read-only, common, weak) or used.
    $2 == "U" { use[++nu] = $1 " " $3; next }
    $2 ~ /^[A-TV-Z]$/ { def[$3] = $1; node[$1] = 1 }
    END {
        # The edges A -> B, each with the first few symbols A uses from B.
        for (i = 1; i <= nu; i++) {
            split(use[i], u, " ")
            a = u[1]; s = u[2]
            if (!(s in def) || def[s] == a) continue
            b = def[s]
            if (!((a, b) in edge)) { edge[a, b] = s; nedge++; reach[a, b] = 1 }
            else if (length(edge[a, b]) < 120 && index(" " edge[a, b] ", ", " " s ", ") == 0)
                edge[a, b] = edge[a, b] ", " s
        }
        # An empty table means nm or the list went wrong, not that the layering holds.
        if (nobj < 2 || nedge == 0) {
            printf "FAIL: %d objects, %d calls between them: expected the whole library\n",
                   nobj, nedge
            exit 1
        }
        # Which file reaches which (transitive closure; a few dozen files).
        for (m in node) for (a in node) if ((a, m) in reach) for (b in node)
            if ((m, b) in reach) reach[a, b] = 1
        # Files that reach each other form one cycle; name it by its sorted files.
        nknown = split(ENVIRON["known"], kl, "\n")
        for (i = 1; i <= nknown; i++) if (kl[i] != "") allowed[kl[i]] = 1
        bad = 0
        for (a in node) {
            if (a in done || !((a, a) in reach)) continue
            n = 0
            for (b in node) if (b == a || ((a, b) in reach && (b, a) in reach)) mem[++n] = b
            for (i = 2; i <= n; i++)
                for (j = i; j > 1 && mem[j - 1] > mem[j]; j--) { t = mem[j]; mem[j] = mem[j - 1]; mem[j - 1] = t }
            key = mem[1]
            for (i = 2; i <= n; i++) key = key " " mem[i]
            for (i = 1; i <= n; i++) done[mem[i]] = 1
            if (key in allowed) { seen[key] = 1; continue }
            bad++
            printf "FAIL: these files call into each other: %s\n", key
            for (i = 1; i <= n; i++) for (j = 1; j <= n; j++)
                if ((mem[i], mem[j]) in edge) printf "  %s uses %s from %s\n", mem[i], edge[mem[i], mem[j]], mem[j]
        }
        for (k in allowed)
            if (!(k in seen)) {
                printf "FAIL: known cycle \"%s\" is gone: remove it from KNOWN_CYCLES in this script\n", k
                bad++
            }
        if (bad) {
            print "Move what both sides need into a file of its own that depends on neither."
            exit 1
        }
        printf "ok: %d objects, %d pairs of files with calls between them, no cycle", nobj, nedge
        for (k in seen) printf " (known: %s)", k
        printf "\n"
    }' "$table"
