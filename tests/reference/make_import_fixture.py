#!/usr/bin/python3
"""Writes the import fixtures that tests/test_import.c loads into gpipe: the weights of the
reference PyTorch models (make_fixtures.py), renamed by the documented mapping (README.md,
"Names") and saved with the `safetensors` package's own writer (safetensors.torch.save_file),
as a PyTorch user would export them; beside each, the input and the eval-mode logits PyTorch
computes from those weights (float64 from the float32-rounded weights, stored as float32).

Needs torch and safetensors:  .pyenv/bin/python tests/reference/make_import_fixture.py
(`make pydeps` makes .pyenv from /usr/bin/python3 with Debian's python3-torch visible).
"""
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402


def build(family, fill):
    if family == "transformer":
        c = mf.TRANSFORMER
        model = mf.Transformer(c)
        named = model.c_names(c)
        mf.set_initial(named, fill, (0, 1))
        x = torch.from_numpy(fill.ints((c["batch"], c["seq_len"]), c["vocab"]))
    else:
        c = mf.CONVNET
        model = mf.make_convnet(c)
        named = mf.convnet_c_names(model)
        mf.set_initial(named, fill, ())
        x = torch.from_numpy(fill.signed((c["batch"], c["in_ch"], c["height"], c["width"]),
                                         0.0, 2.0))
    return c, model, x


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    for family in ("transformer", "convnet"):
        torch.manual_seed(0)
        c, model, x = build(family, mf.Filler(7))
        model = model.to(torch.float64).eval()  # batch norm on its running statistics
        named = model.c_names(c) if family == "transformer" else mf.convnet_c_names(model)
        weights = {name: t.detach().to(torch.float32).contiguous() for name, t in named}
        with torch.no_grad():
            logits = model(x if family == "transformer" else x.to(torch.float64))
        config = {"family": family}
        config.update({k: v for k, v in c.items() if k != "batch"})
        meta = {"model_config": repr(config).replace("'", '"'),
                "generator": f"tests/reference/make_import_fixture.py, torch {torch.__version__}"}
        base = os.path.join(mf.FIXTURES, "import_" + family)
        save_file(weights, base + ".safetensors", metadata=meta)
        save_file({"input": x.contiguous(), "logits": logits.to(torch.float32).contiguous()},
                  base + ".expect.safetensors")
        print(f"{base}.safetensors: {len(weights)} tensors; logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
