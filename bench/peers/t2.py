#!/usr/bin/env python3
"""T2 (the deep Transformer: d_model 256, 4 heads, d_ff 1024, 32 layers, batch 32, AdamW) on
all the given threads: gpipe on one device and as a K-stage pipeline (--stages, M = 8
micro-batches, one thread per stage) beside PyTorch on one device with the same threads;
tokens/s and the ratios."""
import common
import models


def main():
    a = common.parse_args(__doc__, default_threads="2")
    torch = common.import_torch()
    if torch is None:
        return 0
    rows = []
    for n in a.threads:
        note = common.set_threads(torch, n)
        print(note, flush=True)
        torch.manual_seed(1)
        model = models.transformer(torch, dim=256, heads=4, d_ff=1024, layers=32)
        step = models.lm_step(torch, model, 32, 128, 256)
        configs = [("one device", ["--threads", str(n)])]
        if n > 1:
            configs.append(("K = %d stages, M = 8" % n,
                            ["--stages", str(n), "--micro-batches", "8", "--threads", "1"]))
        for label, extra in configs:
            def gp():
                r = common.run_gpipe(a.gpipe, ["--workload", "T2"] + extra, a.steps, a.warmup)
                return r["throughput"]["tokens_per_s"], r["fraction_of_ceiling"]

            def pt():
                return 32 * 128 / common.time_steps(step, a.steps, a.warmup)
            g, frac, t = common.alternate(a.rounds, gp, pt)
            rows.append(("T2, %d thread%s, gpipe %s" % (n, "s" if n > 1 else "", label), g, t,
                         frac))
    common.compare(rows, "tokens/s", a.json, {"torch_version": torch.__version__})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
