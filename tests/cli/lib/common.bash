# Shared set-up of the shell tests of the gpipe CLI, sourced by tests/cli/*.sh
# (not a test itself: CTest runs only tests/cli/*.sh): the gpipe path, a
# temporary folder, failure counting, `gpipe train` runs, and clicheck.py for
# the Python checks of the JSON reports.

# Python checks import clicheck from this folder; no bytecode in the tree.
CLI_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH="$CLI_LIB_DIR${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

# cli_init "$@": GPIPE from the script's first argument, an empty $TMP removed
# on exit, fail=0.
cli_init() {
    GPIPE=${1:?usage: bash $0 /path/to/gpipe}
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    fail=0
}

bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# run NAME ARGS...: gpipe train ARGS, stdout/stderr into $TMP/NAME.{out,err};
# a failure is counted and returns 1.
run() {
    local name=$1
    shift
    if ! "$GPIPE" train "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"; then
        bad "gpipe train $* failed: $(tail -c 600 "$TMP/$name.err")"
        return 1
    fi
}

# cli_finish NAME: the last line, and the exit status: 1 if any check failed.
cli_finish() {
    if [ "$fail" -ne 0 ]; then
        echo "cli $1: $fail check(s) FAILED"
        exit 1
    fi
    echo "cli $1: all checks passed"
}
