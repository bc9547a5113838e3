#!/usr/bin/env python3
"""T1 (the Transformer LM: d_model 512, 8 heads, d_ff 2048, 8 layers, 128 positions, batch 32,
AdamW): gpipe bench beside PyTorch, tokens/s on each thread count, and the ratio."""
import common
import models


def main():
    a = common.parse_args(__doc__)
    torch = common.import_torch()
    if torch is None:
        return 0
    rows = []
    for n in a.threads:
        note = common.set_threads(torch, n)
        print(note, flush=True)
        torch.manual_seed(1)
        model = models.transformer(torch)
        step = models.lm_step(torch, model, 32, 128, 256)

        def gp():
            r = common.run_gpipe(a.gpipe, ["--workload", "T1", "--threads", str(n)], a.steps,
                                 a.warmup)
            return r["throughput"]["tokens_per_s"], r["fraction_of_ceiling"]

        def pt():
            return 32 * 128 / common.time_steps(step, a.steps, a.warmup)
        g, frac, t = common.alternate(a.rounds, gp, pt)
        rows.append(("T1, %d thread%s" % (n, "s" if n > 1 else ""), g, t, frac))
    common.compare(rows, "tokens/s", a.json, {"torch_version": torch.__version__})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
