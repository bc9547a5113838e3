#!/usr/bin/env bash
# The library's files form a layering: no file of src/ depends on a file that depends back on it,
# directly or through other files. File A depends on file B (B != A) when
#   - A calls B: A uses a global symbol that B defines (read from the compiled objects, so it
#     sees what the code really calls: nm lists the symbols each object defines and uses), or
#   - A includes B's interface: A's translation unit includes, directly or through other headers,
#     a header of src/ that names a global symbol B defines (read from the compiler's dependency
#     file beside each object, OBJECT.d). A header shared by files that include it and define its
#     functions ties them into one circle even where no call closes it yet, so each file gets the
#     header of what it provides, and includes only the headers of the files below it. The public
#     header (include/gpipe.h) is not of src/: calls through it are seen as calls.
# Usage: bash tests/src_cycles.sh OBJECTS_LIST
#   OBJECTS_LIST: a file naming the library's object files, one a line (CMake writes it).
# Exit status: 0 no cycle; 1 a cycle (each printed with the symbols that make it), a stale
# exception, or an unusable input; 77 (skipped) without nm.
set -u
list=${1:?usage: bash $0 OBJECTS_LIST}

# Cycles known and waiting for their fix, one a line (a backslash continues it), each its files
# sorted and separated by one space (GP_KNOWN_CYCLES replaces the list, for the checker's own
# test). An exception that no longer holds fails too, so that this list only ever shrinks. None
# is known today: the list is empty.
KNOWN_CYCLES=${GP_KNOWN_CYCLES-$(cat <<END
END
)}

command -v nm >/dev/null 2>&1 || { echo "SKIP: nm not found"; exit 77; }
[ -r "$list" ] || { echo "FAIL: cannot read the object list $list"; exit 1; }

# One line per symbol: "FILE TYPE NAME" (POSIX nm format: name, type, value, size), one per
# header of src/ a file's translation unit includes: "FILE @inc src/dir/header.h PATH", and one
# per defined symbol such a header names: "src/dir/header.h @names SYMBOL".
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
table=$tmp/table
: >"$table"
: >"$tmp/includes"
nobj=0
ndep=0
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
    [ -r "$obj.d" ] || continue
    ndep=$((ndep + 1))
    # The dependency file's prerequisites, headers only.
    tr ' \\' '\n\n' <"$obj.d" | grep '\.h$' | sort -u | sed "s|^|$name |" >>"$tmp/includes"
done <"$list"
if [ "$nobj" -gt 0 ] && [ "$ndep" -eq 0 ]; then
    echo "FAIL: no object has a dependency file (OBJECT.d): the headers each file includes are unknown"
    echo "(CMake's Makefile generator leaves them beside the objects; Ninja folds them into .ninja_deps)"
    exit 1
fi
# A header reached through a link (the build's per-part include folders) is named by the file it
# links to; only the headers of src/ count.
awk '{ print $2 }' "$tmp/includes" | sort -u >"$tmp/paths"
tr '\n' '\0' <"$tmp/paths" | xargs -0 -r readlink -f -- >"$tmp/real" 2>/dev/null
[ "$(wc -l <"$tmp/paths")" -eq "$(wc -l <"$tmp/real")" ] || {
    echo "FAIL: cannot resolve the headers the dependency files name"
    exit 1
}
paste -d ' ' "$tmp/paths" "$tmp/real" >"$tmp/realof"
awk 'NR == FNR { real[$1] = $2; next }
     (r = real[$2]) ~ /\/src\// { h = r; sub(/^.*\/src\//, "src/", h); print $1, "@inc", h, r }' \
    "$tmp/realof" "$tmp/includes" | sort -u >>"$table"

# Which defined symbols each included header names.
awk '$2 ~ /^[A-TV-Z]$/ { print $3 }' "$table" | sort -u >"$tmp/defined"
awk '$2 == "@inc" { print $3, $4 }' "$table" | sort -u | while read -r hname hpath; do
    [ -s "$tmp/defined" ] || break
    # declarations only: a name in a comment declares nothing
    perl -0pe 's{/\*.*?\*/}{ }gs; s{//[^\n]*}{}g' -- "$hpath" 2>/dev/null |
        grep -owF -f "$tmp/defined" | sort -u | sed "s|^|$hname @names |"
done >>"$table"

known="$KNOWN_CYCLES" awk -v nobj="$nobj" '
    # Used, included, named by an included header, or defined (any upper-case type but U: text,
    # data, bss, read-only, common, weak).
    $2 == "U" { use[++nu] = $1 " " $3; next }
    $2 == "@inc" { inc[++ni] = $1 " " $3; next }
    $2 == "@names" { names[$1] = names[$1] " " $3; next }
    $2 ~ /^[A-TV-Z]$/ { def[$3] = $1; node[$1] = 1 }
    function add(a, b, why) {
        if (!((a, b) in edge)) { edge[a, b] = why; nedge++; reach[a, b] = 1 }
        else if (length(edge[a, b]) < 120 && index(" " edge[a, b] ", ", " " why ", ") == 0)
            edge[a, b] = edge[a, b] ", " why
    }
    END {
        # The edges A -> B, each with the first few symbols A uses from B, or the headers A
        # includes that name them.
        for (i = 1; i <= nu; i++) {
            split(use[i], u, " ")
            if ((u[2] in def) && def[u[2]] != u[1]) add(u[1], def[u[2]], u[2])
        }
        for (i = 1; i <= ni; i++) {
            split(inc[i], u, " ")
            n = split(names[u[2]], syms, " ")
            for (j = 1; j <= n; j++)
                if (def[syms[j]] != u[1]) add(u[1], def[syms[j]], syms[j] " (through " u[2] ")")
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
            printf "FAIL: these files depend on each other: %s\n", key
            for (i = 1; i <= n; i++) for (j = 1; j <= n; j++)
                if ((mem[i], mem[j]) in edge) printf "  %s uses %s from %s\n", mem[i], edge[mem[i], mem[j]], mem[j]
        }
        for (k in allowed)
            if (!(k in seen)) {
                printf "FAIL: known cycle \"%s\" is gone: remove it from KNOWN_CYCLES in this script\n", k
                bad++
            }
        if (bad) {
            print "Move what both sides need into a file of its own that depends on neither; give each"
            print "file a header of its own for what it provides."
            exit 1
        }
        for (k in seen) nseen++
        printf "ok: %d objects, %d pairs of dependent files, no cycle", nobj, nedge
        if (nseen) printf " but the %d known", nseen
        printf "\n"
    }' "$table"
