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

# cli_make_tiny_data: $TMP/corpus (a small multilingual text of %-separated
# entries) and $TMP/syn (IDX files of 48 train and 16 test 28x28 images whose
# pixels depend on their label), for short training runs.
cli_make_tiny_data() {
    python3 - "$TMP" <<'PY'
import os, struct, sys
d = sys.argv[1]
words = "the pipeline splits every mini-batch into micro-batches über café".split()
with open(os.path.join(d, "corpus"), "w", encoding="utf-8") as f:
    for i in range(200):
        f.write(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(6 + i % 5)) + ".\n%\n")
os.makedirs(os.path.join(d, "syn"))
for split, n in (("train", 48), ("t10k", 16)):
    labels = [(i * 7) % 10 for i in range(n)]
    pix = bytearray()
    for i, l in enumerate(labels):
        pix += bytes(((r * 28 + c) * (l + 1) + i) % 256 for r in range(28) for c in range(28))
    with open(os.path.join(d, "syn", split + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + pix)
    with open(os.path.join(d, "syn", split + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(labels))
PY
}
