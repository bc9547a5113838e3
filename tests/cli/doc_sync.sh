#!/usr/bin/env bash
# The option reference (docs/cli.md) and the man page (docs/gpipe.1) are what
# tools/gen_cli_doc.sh writes from this gpipe's --help texts, so neither can drift
# from the program: a changed help text fails here until `make docs` is run. And the example
# docs/library.md explains is the header's.
# Usage: bash tests/cli/doc_sync.sh /path/to/gpipe
# shellcheck disable=SC2016  # the backquotes are Markdown, not commands
set -u
source "$(dirname "$0")/lib/common.bash"
cli_init "$@"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

# check FORMAT FILE: FILE equals the generator's FORMAT output.
check() {
    local format=$1 file=$2
    if ! bash "$ROOT/tools/gen_cli_doc.sh" "$GPIPE" "$format" >"$TMP/$format" 2>"$TMP/$format.err"; then
        bad "tools/gen_cli_doc.sh $GPIPE $format failed: $(head -c 600 "$TMP/$format.err")"
        return
    fi
    if ! diff -u "$ROOT/$file" "$TMP/$format" >"$TMP/$format.diff"; then
        bad "$file differs from gpipe's --help texts (run \`make docs\` to regenerate it):"
        head -n 40 "$TMP/$format.diff"
    fi
}
check md docs/cli.md
check man docs/gpipe.1

# The generator found every command, and each is documented: a broken parse of
# `gpipe --help` would write (and commit) an empty reference without this.
for c in train eval sample plan bench import export launch; do
    grep -q "^## gpipe $c\$" "$ROOT/docs/cli.md" || bad "docs/cli.md has no section for gpipe $c"
    grep -q "^\.SS \"gpipe $c\"\$" "$ROOT/docs/gpipe.1" || bad "docs/gpipe.1 has no section for gpipe $c"
done
# docs/library.md walks through the header's example call by call: its copy must be the
# example the build compiles and runs (test_header_example).
sed -n '/EXAMPLE-BEGIN/,/EXAMPLE-END/p' "$ROOT/include/gpipe.h" | sed '1d;$d' |
    sed -e 's/^ \* \{0,1\}//' -e 's/^  //' >"$TMP/example.header"
sed -n '/^## The example, call by call/,/^1\. /p' "$ROOT/docs/library.md" |
    sed -n '/^```c$/,/^```$/p' | sed '1d;$d' >"$TMP/example.doc"
[ -s "$TMP/example.header" ] || bad "no example between EXAMPLE-BEGIN and EXAMPLE-END in include/gpipe.h"
diff -u "$TMP/example.header" "$TMP/example.doc" >"$TMP/example.diff" ||
    bad "the example in docs/library.md is not include/gpipe.h's: $(head -n 20 "$TMP/example.diff")"
cli_finish doc_sync
