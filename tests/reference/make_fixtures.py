#!/usr/bin/python3
"""Writes the PyTorch reference fixtures that tests/test_reference.c compares gpipe against.

Run with Debian's python3-torch:  /usr/bin/python3 tests/reference/make_fixtures.py
(--check-f32 also reruns everything in float32 and prints how far it lands from the float64
reference under the C test's tolerance, to show the tolerance is reachable in float32.)
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")

# The C test's comparison: |a - b| <= RTOL * max(|a|, |b|) + ATOL.
RTOL = 1e-4
ATOL = 1e-6
NSTEPS = 5
LABEL_SMOOTHING = 0.1

TRANSFORMER = dict(vocab=64, dim=32, heads=4, d_ff=64, layers=2, seq_len=16, batch=4)
# AdamW eps 1e-5 rather than torch's 1e-8: the key bias has an exactly-zero gradient in exact
# arithmetic (softmax ignores a constant added to one query's scores), so in float32 its gradient
# is rounding noise of ~3e-9, and AdamW turns noise into a step of lr * noise / eps: with eps 1e-8
# that moves the key bias by ~lr/4 per step in any float32 code, a value no two implementations
# share. eps 1e-5 bounds it at ~3e-4 lr while every real gradient here (~1e-4..1e-2) still
# dominates eps. Both sides read eps from the fixture.
ADAMW = dict(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.999, eps=1e-5)

CONVNET = dict(in_ch=1, height=28, width=28, classes=10, ch1=4, ch2=8, hidden=16, batch=8)
# A small ResNet: a stem, one identity block, one block with a projection shortcut (stride 2 and
# more channels), global average pooling, a linear head; written out as gpipe's JSON layer list.
RESNET = dict(in_ch=1, height=12, width=12, classes=5, ch1=4, ch2=8, batch=8)
SGD = dict(lr=0.05, momentum=0.9, weight_decay=5e-4)


# ------------------------------------------------------------------ safetensors, by hand

def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, np.ndarray float32 or int32), written in that order."""
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    blobs = []
    offset = 0
    for name, arr in tensors:
        if arr.dtype == np.float32:
            dtype = "F32"
        elif arr.dtype == np.int32:
            dtype = "I32"
        else:
            raise TypeError(f"{name}: unsupported dtype {arr.dtype}")
        raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# ------------------------------------------------------------------ deterministic values

class Filler:
    """Values away from zero (magnitude in [lo, hi], random sign), so that relative errors mean
    something and no parameter sits near zero where only the absolute floor would apply."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def signed(self, shape, lo, hi):
        mag = self.rng.uniform(lo, hi, size=shape)
        sign = np.where(self.rng.uniform(size=shape) < 0.5, -1.0, 1.0)
        return (mag * sign).astype(np.float32)

    def around_one(self, shape, spread):
        return (1.0 + self.rng.uniform(-spread, spread, size=shape)).astype(np.float32)

    def ints(self, shape, hi):
        return self.rng.integers(0, hi, size=shape).astype(np.int32)


def init_param(fill, cname, shape, embedding):
    """Initial value of a parameter or buffer from its C-side (layer-local) name."""
    leaf = cname.split(".")[-1]
    if leaf == "running_mean":
        return fill.signed(shape, 0.05, 0.5)
    if leaf == "running_var":
        return fill.around_one(shape, 0.5)
    if leaf == "weight" and len(shape) == 1:  # LayerNorm / BatchNorm gamma
        return fill.around_one(shape, 0.3)
    if leaf == "bias":
        return fill.signed(shape, 0.05, 0.5)
    if embedding:
        return fill.signed(shape, 0.1, 1.0)
    fan_in = int(np.prod(shape[1:]))
    s = 1.0 / np.sqrt(fan_in)
    return fill.signed(shape, 0.25 * s, 1.5 * s)


# ------------------------------------------------------------------ the transformer family

def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


class Transformer(nn.Module):
    """gp_model_transformer: [0] embedding, [1] pos_embedding, [2..L+1] pre-LN blocks,
    [L+2] layernorm, [L+3] linear without bias."""

    def __init__(self, c):
        super().__init__()
        C = c["dim"]
        self.embedding = nn.Embedding(c["vocab"], C)
        self.pos = nn.Parameter(torch.zeros(c["seq_len"], C))
        self.blocks = nn.ModuleList([
            nn.TransformerEncoderLayer(C, c["heads"], dim_feedforward=c["d_ff"], dropout=0.0,
                                       activation=gelu_tanh, layer_norm_eps=1e-5,
                                       batch_first=True, norm_first=True)
            for _ in range(c["layers"])])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.head = nn.Linear(C, c["vocab"], bias=False)

    def forward(self, idx):  # (B, T) -> (B, T, vocab)
        T = idx.shape[1]
        x = self.embedding(idx.long()) + self.pos[:T]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # True: not attended
        for b in self.blocks:
            x = b(x, src_mask=mask)
        return self.head(self.ln_f(x))

    def c_names(self, c):
        """(fixture name "layers.<i>.<param>", torch tensor) in C's layer/param order."""
        L = c["layers"]
        out = [("layers.0.weight", self.embedding.weight), ("layers.1.weight", self.pos)]
        for i, b in enumerate(self.blocks):
            p = f"layers.{i + 2}."
            out += [(p + "ln1.weight", b.norm1.weight), (p + "ln1.bias", b.norm1.bias),
                    (p + "attn.qkv.weight", b.self_attn.in_proj_weight),
                    (p + "attn.qkv.bias", b.self_attn.in_proj_bias),
                    (p + "attn.proj.weight", b.self_attn.out_proj.weight),
                    (p + "attn.proj.bias", b.self_attn.out_proj.bias),
                    (p + "ln2.weight", b.norm2.weight), (p + "ln2.bias", b.norm2.bias),
                    (p + "mlp.fc.weight", b.linear1.weight), (p + "mlp.fc.bias", b.linear1.bias),
                    (p + "mlp.proj.weight", b.linear2.weight),
                    (p + "mlp.proj.bias", b.linear2.bias)]
        out += [(f"layers.{L + 2}.weight", self.ln_f.weight), (f"layers.{L + 2}.bias", self.ln_f.bias),
                (f"layers.{L + 3}.weight", self.head.weight)]
        return out


def manual_block(b, x, heads):
    """The block written out op by op, as gpipe's C layer computes it; used only to check that
    nn.TransformerEncoderLayer means what the brief says (qkv row order, head split, tanh GELU)."""
    B, T, C = x.shape
    hd = C // heads
    h = F.layer_norm(x, (C,), b.norm1.weight, b.norm1.bias, 1e-5)
    qkv = h @ b.self_attn.in_proj_weight.t() + b.self_attn.in_proj_bias  # (B, T, 3C)
    q, k, v = qkv.split(C, dim=-1)
    q = q.view(B, T, heads, hd).transpose(1, 2)  # (B, H, T, hd)
    k = k.view(B, T, heads, hd).transpose(1, 2)
    v = v.view(B, T, heads, hd).transpose(1, 2)
    s = q @ k.transpose(-1, -2) / np.sqrt(hd)  # (B, H, T, T)
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    x = x + a @ b.self_attn.out_proj.weight.t() + b.self_attn.out_proj.bias
    h = F.layer_norm(x, (C,), b.norm2.weight, b.norm2.bias, 1e-5)
    h = gelu_tanh(h @ b.linear1.weight.t() + b.linear1.bias)
    return x + h @ b.linear2.weight.t() + b.linear2.bias


# ------------------------------------------------------------------ the convnet family

def make_convnet(c):
    """gp_model_convnet, layers 0..17, Sequential index == gpipe layer index."""
    ch1, ch2, hid = c["ch1"], c["ch2"], c["hidden"]
    flat = ch2 * (c["height"] // 4) * (c["width"] // 4)
    return nn.Sequential(
        nn.Conv2d(c["in_ch"], ch1, 3, padding=1, bias=False), nn.BatchNorm2d(ch1), nn.ReLU(),
        nn.Conv2d(ch1, ch1, 3, padding=1, bias=False), nn.BatchNorm2d(ch1), nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(ch1, ch2, 3, padding=1, bias=False), nn.BatchNorm2d(ch2), nn.ReLU(),
        nn.Conv2d(ch2, ch2, 3, padding=1, bias=False), nn.BatchNorm2d(ch2), nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(flat, hid), nn.ReLU(), nn.Linear(hid, c["classes"]))


def convnet_c_names(net):
    out = []
    for i, mod in enumerate(net):
        for pname, t in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            if pname == "num_batches_tracked":
                continue
            out.append((f"layers.{i}.{pname}", t))
    return out


# ------------------------------------------------------------------ the residual network

class BasicBlock(nn.Module):
    """gp_residual_block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.ModuleDict({"conv": nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                           "bn": nn.BatchNorm2d(cout)})

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        s = x if self.shortcut is None else self.shortcut["bn"](self.shortcut["conv"](x))
        return F.relu(h + s)


class Pool(nn.Module):
    def forward(self, x):
        return x.mean(dim=(2, 3))


def make_resnet(c):
    """Layer i of the Sequential is gpipe's layer i of resnet_json(c)."""
    return nn.Sequential(
        nn.Conv2d(c["in_ch"], c["ch1"], 3, padding=1, bias=False), nn.BatchNorm2d(c["ch1"]), nn.ReLU(),
        BasicBlock(c["ch1"], c["ch1"], 1), BasicBlock(c["ch1"], c["ch2"], 2),
        Pool(), nn.Linear(c["ch2"], c["classes"]))


def resnet_json(c):
    layers = [
        {"kind": "conv2d", "in": c["in_ch"], "out": c["ch1"], "kernel": 3, "stride": 1, "pad": 1, "bias": False},
        {"kind": "batchnorm2d", "channels": c["ch1"]},
        {"kind": "relu"},
        {"kind": "residual_block", "in": c["ch1"], "out": c["ch1"]},
        {"kind": "residual_block", "in": c["ch1"], "out": c["ch2"], "stride": 2},
        {"kind": "global_avgpool"},
        {"kind": "linear", "in": c["ch2"], "out": c["classes"]}]
    return json.dumps({"input": {"shape": [c["in_ch"], c["height"], c["width"]], "dtype": "float32"},
                       "layers": layers})


def module_c_names(net):
    """gpipe's names: layers.<i>.<the module's own parameter and buffer names>."""
    out = []
    for i, mod in enumerate(net):
        for pname, t in list(mod.named_parameters()) + list(mod.named_buffers()):
            if pname.endswith("num_batches_tracked"):
                continue
            out.append((f"layers.{i}.{pname}", t))
    return out


# ------------------------------------------------------------------ one run of either family

def set_initial(named, fill, embedding_layers):
    init = {}
    with torch.no_grad():
        for name, t in named:
            _, layer, cname = name.split(".", 2)
            v = init_param(fill, cname, tuple(t.shape), int(layer) in embedding_layers)
            t.copy_(torch.from_numpy(v).to(t.dtype))
            init[name] = v
    return init


def param_groups(named):
    """Weight decay only on tensors with >= 2 dims; buffers are not optimized."""
    decay = [t for n, t in named if t.requires_grad and t.dim() >= 2]
    other = [t for n, t in named if t.requires_grad and t.dim() < 2]
    return decay, other


def run_family(family, dtype, fill_seed=2024):
    fill = Filler(fill_seed)
    if family == "transformer":
        c = TRANSFORMER
        model = Transformer(c)
        named = model.c_names(c)
        B, T, V = c["batch"], c["seq_len"], c["vocab"]
        seq = fill.ints((B, T + 1), V)
        x_np, y_np = seq[:, :T].copy(), seq[:, 1:].copy()
        init = set_initial(named, fill, (0, 1))
    else:
        c = CONVNET if family == "convnet" else RESNET
        model = make_convnet(c) if family == "convnet" else make_resnet(c)
        named = convnet_c_names(model) if family == "convnet" else module_c_names(model)
        init = set_initial(named, fill, ())
        B = c["batch"]
        x_np = fill.signed((B, c["in_ch"], c["height"], c["width"]), 0.0, 2.0)
        y_np = fill.ints((B,), c["classes"])

    model = model.to(dtype)
    model.train()
    named = (model.c_names(c) if family == "transformer" else
             convnet_c_names(model) if family == "convnet" else module_c_names(model))
    x = torch.from_numpy(x_np) if family == "transformer" else torch.from_numpy(x_np).to(dtype)
    y = torch.from_numpy(y_np).long()

    def loss_of(logits, smoothing=0.0):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                               label_smoothing=smoothing)

    if family == "transformer":
        # The block as written out by hand must agree with torch's module.
        with torch.no_grad():
            h = model.embedding(x.long()) + model.pos[:x.shape[1]]
            T = x.shape[1]
            mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            got = model.blocks[0](h, src_mask=mask)
            want = manual_block(model.blocks[0], h, c["heads"])
            err = (got - want).abs().max().item()
            lim = 1e-12 if dtype == torch.float64 else 1e-5
            if not err <= lim:
                sys.exit(f"transformer block: module vs manual max |diff| {err} > {lim}")

    out = {}
    # Gradients at the initial point (this forward also moves batch-norm running statistics; the
    # C test reloads the initial buffers before the optimizer steps, and so do we).
    logits = model(x)
    loss = loss_of(logits)
    loss.backward()
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(1)
    for name, t in named:
        if t.requires_grad:
            out["grad." + name] = t.grad.detach().clone()
    def reset():
        with torch.no_grad():
            for name, t in named:
                t.copy_(torch.from_numpy(init[name]).to(t.dtype))
                if t.requires_grad:
                    t.grad = None

    # The same point with label-smoothed targets (gpipe train --label-smoothing).
    reset()
    loss = loss_of(model(x), LABEL_SMOOTHING)
    loss.backward()
    out["smoothed.loss"] = loss.detach().reshape(1)
    for name, t in named:
        if t.requires_grad:
            out["smoothed.grad." + name] = t.grad.detach().clone()
    reset()

    decay, other = param_groups(named)
    if family == "transformer":
        o = ADAMW
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                                 {"params": other, "weight_decay": 0.0}],
                                lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    else:
        o = SGD
        opt = torch.optim.SGD([{"params": decay, "weight_decay": o["weight_decay"]},
                               {"params": other, "weight_decay": 0.0}],
                              lr=o["lr"], momentum=o["momentum"], dampening=0.0, nesterov=False)
    losses = []
    for _ in range(NSTEPS):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model(x))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out["step_losses"] = torch.tensor(losses, dtype=torch.float64)
    for name, t in named:
        out["final." + name] = t.detach().clone()
    model.eval()  # batch norm on running statistics
    with torch.no_grad():
        out["final.logits"] = model(x)

    tensors = [("input", x_np), ("labels", y_np)]
    tensors += [(n, init[n]) for n, _ in named]
    for k, v in out.items():
        tensors.append((k, v.to(torch.float64).numpy().astype(np.float32)))
    meta = {"family": family, "steps": NSTEPS, "label_smoothing": repr(LABEL_SMOOTHING)}
    meta.update(c)
    meta.update({("opt." + k): repr(v) for k, v in o.items()})
    meta["opt.kind"] = "adamw" if family == "transformer" else "sgd"
    if family == "resnet":
        meta["model_json"] = resnet_json(c)
    meta["generator"] = f"tests/reference/make_fixtures.py, torch {torch.__version__}, float64"
    return tensors, meta, {k: v.to(torch.float64).numpy() for k, v in out.items()}


def worst_rel(a, b):
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    excess = np.abs(a - b) / (RTOL * np.maximum(np.abs(a), np.abs(b)) + ATOL)
    i = int(np.argmax(excess))
    return excess[i], i, a[i], b[i]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check-f32", action="store_true",
                    help="also run in float32 and report the worst element against float64")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(FIXTURES, exist_ok=True)
    total = 0
    for family in ("transformer", "convnet", "resnet"):
        torch.manual_seed(0)  # modules draw their own init first; every value is then overwritten
        tensors, meta, ref = run_family(family, torch.float64)
        path = os.path.join(FIXTURES, family + ".safetensors")
        write_safetensors(path, tensors, meta)
        nbytes = os.path.getsize(path)
        total += nbytes
        print(f"{path}: {len(tensors)} tensors, {nbytes} bytes; loss {ref['loss'][0]:.6f}, "
              f"step losses {', '.join(f'{v:.6f}' for v in ref['step_losses'])}")
        if args.check_f32:
            torch.manual_seed(0)
            _, _, r32 = run_family(family, torch.float32)
            bad = 0
            for k in ref:
                ex, i, a, b = worst_rel(ref[k], r32[k])
                flag = "FAIL" if ex > 1 else "ok"
                bad += ex > 1
                print(f"  f32 {flag} {k:40s} worst at [{i}]: {a:.9g} vs {b:.9g} "
                      f"({ex:.3f} of tolerance)")
            print(f"  float32 run: {bad} tensor(s) over tolerance")
    print(f"total fixture bytes: {total}")


if __name__ == "__main__":
    main()
