#!/usr/bin/env python3
"""The parts of the GPT-2 round trip (tests/hf/roundtrip.sh) that need transformers.

  roundtrip.py make DIR          a random tiny GPT2LMHeadModel saved in DIR (save_pretrained),
                                 and DIR/input.safetensors: int32 token ids (B, T)
  roundtrip.py compare DIR LOGITS
                                 loads DIR with GPT2LMHeadModel.from_pretrained (what gpipe export
                                 wrote), computes the logits of DIR/../input.safetensors in float64
                                 and checks gpipe's LOGITS against them: within 1e-5 of the largest
                                 logit's magnitude (float32 rounding through 2 blocks of dim 32 is
                                 about 1e-7 of it)
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, POSITIONS, BATCH = 100, 16, 3


def make(folder):
    torch.manual_seed(7)
    config = GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=32, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    ids = torch.randint(0, VOCAB, (BATCH, POSITIONS), dtype=torch.int32)
    save_file({"input": ids}, os.path.join(folder, "input.safetensors"))


def compare(folder, logits_path):
    model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").double().eval()
    ids = load_file(os.path.join(folder, "..", "model", "input.safetensors"))["input"].long()
    with torch.no_grad():
        want = model(ids).logits
    got = load_file(logits_path)["logits"].double()
    if got.shape != want.shape:
        sys.exit(f"logits: gpipe {tuple(got.shape)}, transformers {tuple(want.shape)}")
    big = want.abs().max().item()
    worst = (got - want).abs().max().item()
    print(f"logits {tuple(want.shape)}: worst difference {worst:.3g}, "
          f"{worst / (1e-5 * big):.3g} of the tolerance 1e-5 x {big:.4g}")
    if not worst <= 1e-5 * big:
        sys.exit("logits differ")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
