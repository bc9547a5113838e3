#!/usr/bin/env python3
"""C1 (the Fashion-MNIST ConvNet, batch 128, SGD momentum 0.9): gpipe bench beside PyTorch,
images/s on each thread count, and the ratio."""
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
        model = models.convnet(torch)
        step = models.classifier_step(torch, model, 128)

        def gp():
            r = common.run_gpipe(a.gpipe, ["--workload", "C1", "--threads", str(n)], a.steps,
                                 a.warmup)
            return r["throughput"]["examples_per_s"], r["fraction_of_ceiling"]

        def pt():
            return 128 / common.time_steps(step, a.steps, a.warmup)
        g, frac, t = common.alternate(a.rounds, gp, pt)
        rows.append(("C1, %d thread%s" % (n, "s" if n > 1 else ""), g, t, frac))
    common.compare(rows, "images/s", a.json, {"torch_version": torch.__version__})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
