#!/usr/bin/env python3
"""Writes the GPT-2 fixtures that tests/test_gpt2.c compares gpipe against: a random tiny
GPT2LMHeadModel saved by transformers' own save_pretrained (config.json + model.safetensors, the
files `gpipe import` reads), and beside it what transformers computes from those weights.

  fixtures/gpt2/config.json, model.safetensors   the model, as Hugging Face writes it
  fixtures/gpt2/expect.safetensors               input and labels (int32, (B, T)), logits
                                                 (B, T, vocab) and loss ([1]): the mean
                                                 cross-entropy of logits against labels
  fixtures/gpt2_grads/config.json, model.safetensors
                                                 d loss / d parameter under the model's own
                                                 names (wte's is both of its uses, as tied)

Every parameter is drawn at random (biases and LayerNorm weights too, so a misplaced one shows),
and the reference runs in float64 from the float32 weights, so float32 rounding in gpipe is the
only difference. Needs torch and transformers 4.44 (make pydeps-hf):
  .pyenv/bin/python tests/reference/make_gpt2_fixture.py
"""
import os
import shutil

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "gpt2")
GRADS = os.path.join(HERE, "fixtures", "gpt2_grads")
BATCH = 2


def main():
    torch.manual_seed(2024)
    torch.set_num_threads(1)
    config = GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or \
                    name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    os.remove(os.path.join(OUT, "generation_config.json"))  # nothing gpipe reads

    T, V = config.n_positions, config.vocab_size
    ids = torch.randint(0, V, (BATCH, T), dtype=torch.int64)
    labels = torch.randint(0, V, (BATCH, T), dtype=torch.int64)
    ref = GPT2LMHeadModel.from_pretrained(OUT, attn_implementation="eager").double()
    ref.eval()
    logits = ref(ids).logits
    loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))
    loss.backward()
    save_file({"input": ids.to(torch.int32).contiguous(),
               "labels": labels.to(torch.int32).contiguous(),
               "logits": logits.detach().to(torch.float32).contiguous(),
               "loss": loss.detach().to(torch.float32).reshape(1)},
              os.path.join(OUT, "expect.safetensors"),
              metadata={"format": "pt", "generator": "tests/reference/make_gpt2_fixture.py, "
                        f"torch {torch.__version__}"})
    grads = {name: p.grad.to(torch.float32).contiguous()
             for name, p in ref.named_parameters() if name != "lm_head.weight"}
    os.makedirs(GRADS, exist_ok=True)
    save_file(grads, os.path.join(GRADS, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(OUT, "config.json"), os.path.join(GRADS, "config.json"))
    print(f"{OUT}: logits {tuple(logits.shape)}, loss {loss.item():.6f}; {len(grads)} gradients")


if __name__ == "__main__":
    main()
