"""Shared parts of the PyTorch peers of gpipe's benchmark workloads (docs/WORKLOADS.md).

Each peer script trains the same model, batch and optimizer in PyTorch on random data, times
steps the way `gpipe bench` does (median of --steps after --warmup, forward + backward +
update), runs `gpipe bench` on the same workload and thread count right beside it, alternating
the two for --rounds rounds, and prints both sides and the ratio gpipe / PyTorch.

PyTorch runs with OMP_WAIT_POLICY=PASSIVE (its OpenMP workers sleep between parallel regions
instead of spinning against gpipe's, and against each other on a small machine), one inter-op
thread and N threads: torch.set_num_threads(N) and, because Debian's torch calls OpenBLAS's
pthreads build, whose own pool set_num_threads does not reach (a "1-thread" PyTorch would run
its GEMMs on every core), openblas_set_num_threads(N) on the OpenBLAS loaded in the process.
A GPU peer (t3.py) takes no thread count and ends each timed step with torch.cuda.synchronize().
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def parse_args(doc, default_threads="1,2", extra=None):
    """The options every peer takes; default_threads None: no --threads (a GPU peer);
    extra(parser) adds a peer's own."""
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--gpipe", default=os.path.join(ROOT, "build", "gpipe"),
                   help="the gpipe binary (default: build/gpipe)")
    if default_threads is not None:
        p.add_argument("--threads", default=default_threads,
                       help="comma-separated thread counts (default: %(default)s)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--rounds", type=int, default=int(os.environ.get("GP_PEER_ROUNDS", "1")),
                   help="gpipe and PyTorch alternate this many times; medians over the rounds "
                        "(default: GP_PEER_ROUNDS or 1)")
    p.add_argument("--json", help="also write the figures to this JSON file")
    if extra is not None:
        extra(p)
    a = p.parse_args()
    if default_threads is not None:
        a.threads = [int(t) for t in a.threads.split(",")]
    return a


def import_torch():
    """torch with passive OpenMP waits; None (and a message) when it is not installed."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed for %s (Debian: apt-get install python3-torch); "
              "nothing to compare" % sys.executable)
        return None
    torch.set_num_interop_threads(1)
    return torch


def _loaded_openblas():
    """The OpenBLAS library mapped into this process (torch's), or None."""
    import ctypes
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libopenblas" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_set_num_threads  # noqa: B018 (present in every OpenBLAS)
            return lib
        except (OSError, AttributeError):
            continue
    return None


def set_threads(torch, n):
    """PyTorch on n threads, its BLAS included; returns a note saying how BLAS threads were set."""
    torch.set_num_threads(n)
    lib = _loaded_openblas()
    if lib is None:
        return "BLAS threads: torch.set_num_threads only (no OpenBLAS found in the process)"
    lib.openblas_set_num_threads(n)
    return "BLAS threads: openblas_set_num_threads(%d) on torch's OpenBLAS" % n


def time_steps(step, steps, warmup):
    """Median seconds of `steps` calls of step() after `warmup` calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def try_gpipe(gpipe, args, steps, warmup):
    """`gpipe bench ARGS` with a report; returns (the report's dict, None), or (None, what went
    wrong) when gpipe is missing, fails or writes no readable report."""
    if not os.access(gpipe, os.X_OK):
        return None, ("%s is not an executable gpipe: build it first (make build) or give "
                      "--gpipe" % gpipe)
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "report.json")
        cmd = [gpipe, "bench"] + args + ["--steps", str(steps), "--warmup", str(warmup),
                                         "--quiet", "--report", report]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            return None, "gpipe failed (%s):\n%s" % (" ".join(cmd), r.stdout)
        try:
            with open(report) as f:
                return json.load(f), None
        except (OSError, ValueError) as e:
            return None, "gpipe wrote no readable report %s (%s): %s" % (report, " ".join(cmd), e)


def run_gpipe(gpipe, args, steps, warmup):
    """`gpipe bench ARGS` with a report; returns the report's dict, exits when gpipe fails."""
    rep, err = try_gpipe(gpipe, args, steps, warmup)
    if rep is None:
        sys.exit(err)
    return rep


def compare(rows, unit, json_path=None, extra=None, ceiling="sgemm"):
    """rows: [(label, gpipe per s or None, torch per s, gpipe fraction of ceiling or None)]."""
    print()
    print("| workload | gpipe %s | PyTorch %s | gpipe / PyTorch | gpipe of its %s ceiling |"
          % (unit, unit, ceiling))
    print("|---|---|---|---|---|")
    out = []
    for label, g, t, frac in rows:
        ratio = g / t if g is not None else None
        print("| %s | %s | %.0f | %s | %s |"
              % (label, "%.0f" % g if g is not None else "-", t,
                 "%.2fx" % ratio if ratio is not None else "-",
                 "%.3f" % frac if frac is not None else "-"))
        out.append({"workload": label, "gpipe": g, "torch": t, "ratio": ratio,
                    "gpipe_fraction_of_ceiling": frac})
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"unit": unit, "rows": out, **(extra or {})}, f, indent=1)
    sys.stdout.flush()


def alternate(rounds, run_gpipe_once, run_torch_once):
    """Medians of (gpipe per s, fraction, torch per s) over rounds, the two alternating.
    run_gpipe_once may return None (no gpipe figure that round) and a fraction may be None;
    a median over no figures is None."""
    g, fr, t = [], [], []
    for _ in range(rounds):
        rep = run_gpipe_once()
        if rep is not None:
            g.append(rep[0])
            if rep[1] is not None:
                fr.append(rep[1])
        t.append(run_torch_once())

    def median(xs):
        return statistics.median(xs) if xs else None
    return median(g), median(fr), median(t)
