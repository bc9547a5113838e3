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

# cli_write_tiny_lm: $TMP/lm.json, a Transformer of 2 blocks (dim 16, vocabulary 256, windows
# of 16 bytes), and the corpus $TMP/corpus for it.
cli_write_tiny_lm() {
    printf '{"family": "transformer", "vocab": 256, "dim": 16, "heads": 2, "d_ff": 32, "layers": 2, "seq_len": 16}\n' \
        >"$TMP/lm.json"
    cli_write_corpus "$TMP/corpus"
}

# cli_write_idx DIR [NTRAIN NTEST]: a synthetic IDX data set in DIR (created, plain files):
# NTRAIN (48) train and NTEST (16) t10k images of 28x28, labels (i * 7) % 10, pixel values that
# depend on the label so that a model can learn.
# cli_write_corpus FILE: a fortune-style text corpus, 300 entries separated by "%" lines (every
# 20th entry goes to validation), with some multi-byte UTF-8; and a tiny LM config beside it,
# $(dirname FILE)/tiny.json (dim 32, 2 blocks, 32-byte windows).
cli_write_corpus() {
    printf '{"family": "transformer", "vocab": 256, "dim": 32, "heads": 4, "d_ff": 64, "layers": 2, "seq_len": 32}\n' \
        >"$(dirname "$1")/tiny.json"
    python3 - "$1" <<'PY' || { echo "FAIL: cannot write the corpus $1"; exit 1; }
import sys
words = "the pipeline splits every mini-batch into micro-batches über café ложка".split()
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for i in range(300):
        f.write(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8 + i % 5)) + ".\n%\n")
PY
}

cli_write_idx() {
    python3 - "$1" "${2:-48}" "${3:-16}" <<'PY' || { echo "FAIL: cannot write the IDX files in $1"; exit 1; }
import os, struct, sys
d = sys.argv[1]
os.makedirs(d)
for split, n in (("train", int(sys.argv[2])), ("t10k", int(sys.argv[3]))):
    labels = [(i * 7) % 10 for i in range(n)]
    pix = bytearray()
    for i, l in enumerate(labels):
        pix += bytes(((r * 28 + c) * (l + 1) + i) % 256 for r in range(28) for c in range(28))
    with open(os.path.join(d, split + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + pix)
    with open(os.path.join(d, split + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(labels))
PY
}

# cli_need_pydeps: PY, the Python with the `safetensors` package (make pydeps), or exit 1.
cli_need_pydeps() {
    PY=${GP_PYTHON:-$PWD/.pyenv/bin/python}
    if ! "$PY" -c "import safetensors, numpy" 2>/dev/null; then
        echo "FAIL: $PY cannot import safetensors and numpy (run 'make pydeps')"
        exit 1
    fi
}

# cli_need_mpi: for the tests of gpipe under mpirun. Without MPI built in, `--launcher mpi` must
# be a usage error (exit 2) and the test is skipped (exit 77, saying why), as it is without
# mpirun. Sets MPIRUN (oversubscribed on the few cores of CI) and lets Open MPI run as root (CI
# tests run as root); the probe's exit status and stderr stay in probe_rc and $TMP/probe.err.
cli_need_mpi() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    MPIRUN=(mpirun --oversubscribe --bind-to none)
    "$GPIPE" train --model convnet --launcher mpi --stages 2 >"$TMP/probe.out" 2>"$TMP/probe.err"
    probe_rc=$?
    if grep -q "MPI support was not built" "$TMP/probe.err"; then
        [ "$probe_rc" = 2 ] || bad "--launcher mpi without MPI: exit $probe_rc, expected 2"
        [ "$fail" = 0 ] || exit 1
        echo "SKIP: this gpipe was built without MPI (no MPI library at configure time, or -DGP_MPI=OFF)"
        exit 77
    fi
    if ! command -v mpirun >/dev/null; then
        echo "SKIP: gpipe has MPI support but mpirun is not on PATH (install openmpi-bin)"
        exit 77
    fi
}

# cli_mpirun NAME NP ARGS...: like run, under mpirun -np NP (after cli_need_mpi). A run that
# timed out without a line from rank 0 (whose first comes right after MPI's start-up) is said so
# and run once more: Open MPI's start-up can hang now and then (test_pipeline_mpi does the same).
cli_mpirun() {
    local name=$1 np=$2 attempt rc
    shift 2
    for attempt in 1 2; do
        rc=0
        timeout -k 10 300 "${MPIRUN[@]}" -np "$np" "$GPIPE" train "$@" >"$TMP/$name.out" \
            2>"$TMP/$name.err" || rc=$?
        if { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && [ ! -s "$TMP/$name.out" ] &&
            [ "$attempt" = 1 ]; then
            echo "$name: mpirun -np $np timed out with nothing from rank 0 (Open MPI's start-up): trying once more"
            continue
        fi
        break
    done
    if [ "$rc" != 0 ]; then
        bad "mpirun -np $np gpipe train $* failed (exit $rc): $(tail -c 800 "$TMP/$name.err")"
        return 1
    fi
}

# cli_same_run STRAIGHT SECOND: the reports $TMP/STRAIGHT.json and $TMP/SECOND.json of a run
# straight through and of one resumed from a checkpoint: the second resumed (first_step > 0),
# its step losses are the straight run's last ones, and its parameters and evaluation are the
# same bits. A failure is counted.
cli_same_run() {
    python3 - "$TMP/$1.json" "$TMP/$2.json" "$2" <<'PY' || fail=$((fail + 1))
import json, sys
from clicheck import finish, need
a, b = (json.load(open(p)) for p in sys.argv[1:3])
first = b["train"]["first_step"]
need(first > 0, f"{sys.argv[3]}: did not resume (first_step {first})")
need(a["train"]["step_losses"][first:] == b["train"]["step_losses"],
     f"{sys.argv[3]}: losses {b['train']['step_losses']} vs straight "
     f"{a['train']['step_losses'][first:]}")
need(a["params_fnv1a64"] == b["params_fnv1a64"],
     f"{sys.argv[3]}: params {b['params_fnv1a64']} vs straight {a['params_fnv1a64']}")
need(a["eval"] == b["eval"], f"{sys.argv[3]}: eval {b['eval']} vs {a['eval']}")
finish(f"FAIL: {sys.argv[3]}:")
PY
}
