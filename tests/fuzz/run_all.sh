#!/usr/bin/env bash
# Runs each libFuzzer target for SECONDS from its committed seed corpus, JOBS targets at a time
# (each target is one process on one core, so a 2-core machine runs two at once and takes half
# the wall time). New inputs go to BUILD/corpus/TARGET, never the tree; a failing input stays in
# BUILD/ with the target's log printed.
# Usage: bash tests/fuzz/run_all.sh BUILD SECONDS JOBS TARGET...
set -u
if [ $# -lt 4 ]; then
    echo "usage: tests/fuzz/run_all.sh BUILD SECONDS JOBS TARGET..." >&2
    exit 2
fi
build=$1 seconds=$2 jobs=$3
shift 3

run_one() {
    local build=$1 seconds=$2 t=$3
    rm -rf "$build/corpus/$t" && mkdir -p "$build/corpus/$t" || return 1
    if ! "./$build/fuzz_$t" -max_total_time="$seconds" -seed=1 -timeout=10 \
            -artifact_prefix="$build/fuzz_$t-" "$build/corpus/$t" "tests/fuzz/corpus/$t" \
            >"$build/fuzz_$t.log" 2>&1; then
        tail -n 40 "$build/fuzz_$t.log"
        echo "fuzz_$t FAILED: the input is in $build/ (fuzz_$t-*); fix it and add it to tests/fuzz/corpus/$t"
        return 1
    fi
    echo "fuzz_$t: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$build/fuzz_$t.log"), no failure"
}
export -f run_one
# xargs exits 123 when any run failed; every target still runs to the end.
printf '%s\n' "$@" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ "$build" "$seconds" {}
