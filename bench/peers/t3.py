#!/usr/bin/env python3
"""T3 (the GPU Transformer: d_model 2048, 16 heads, d_ff 8192, 24 layers, 1024 positions, batch 8,
AdamW) on one GPU: gpipe bench --device cuda beside PyTorch on the same GPU, tokens/s, achieved
TFLOP/s on each side and the ratio.

PyTorch at its best on the GPU: attention through F.scaled_dot_product_attention (its fused
kernels), the fused AdamW, and in bf16 the forward under torch.autocast with float32 parameters
and update; in fp32 TF32 is off for matmuls and cuDNN, since gpipe's fp32 is true float32.
--compile runs the model under torch.compile. Every round builds the PyTorch model afresh and
frees it and the cached memory after, so that gpipe, another process on the same GPU, has the
memory back. Exit status: 0 when PyTorch ran (gpipe's figures null with --no-gpipe or when gpipe
failed), 3 when PyTorch or CUDA is not available, 1 when PyTorch failed."""
import gc

import common
import models

VOCAB, DIM, HEADS, D_FF, LAYERS, SEQ, BATCH = 256, 2048, 16, 8192, 24, 1024, 8
TOKENS = BATCH * SEQ
MATMUL_PARAMS = LAYERS * (4 * DIM * DIM + 2 * DIM * D_FF) + DIM * VOCAB
FLOP_PER_STEP = 6 * MATMUL_PARAMS * TOKENS + 12 * LAYERS * SEQ * DIM * TOKENS
UNAVAILABLE = 3


def options(p):
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16",
                   help="PyTorch's precision: fp32 (TF32 off) or bf16 autocast with float32 "
                        "parameters (default: %(default)s)")
    p.add_argument("--gpipe-precision", metavar="P",
                   help="pass --precision P to gpipe bench (default: gpipe's own default)")
    p.add_argument("--compile", action="store_true",
                   help="PyTorch's model under torch.compile (default: eager)")
    p.add_argument("--no-gpipe", action="store_true", help="time PyTorch only")
    p.add_argument("--device", choices=["cuda"], default="cuda",
                   help="the GPU both sides run on (default: %(default)s; pick one with "
                        "CUDA_VISIBLE_DEVICES)")


def tflops(tokens_per_s):
    return None if tokens_per_s is None else tokens_per_s / TOKENS * FLOP_PER_STEP / 1e12


def fp32_without_tf32(torch):
    """True float32 matmuls and cuDNN; returns a line saying what was set."""
    b = torch.backends
    if hasattr(b, "fp32_precision"):
        # The newer switches alone: PyTorch refuses a mix of the newer and the older ones.
        b.cuda.matmul.fp32_precision = "ieee"
        b.cudnn.fp32_precision = "ieee"
        return ("TF32 off: torch.backends.cuda.matmul.fp32_precision = "
                "torch.backends.cudnn.fp32_precision = 'ieee'")
    b.cuda.matmul.allow_tf32 = False
    b.cudnn.allow_tf32 = False
    return ("TF32 off: torch.backends.cuda.matmul.allow_tf32 = "
            "torch.backends.cudnn.allow_tf32 = False")


def torch_round(torch, a, seen):
    """One PyTorch timing on a freshly built model: tokens/s; seen gets the peak memory and the
    parameter count."""
    torch.manual_seed(1)
    with torch.device(a.device):
        model = models.transformer(torch, VOCAB, DIM, HEADS, D_FF, LAYERS, SEQ, sdpa=True)
    seen["parameters"] = sum(p.numel() for p in model.parameters())
    if a.compile:
        model = torch.compile(model)
    step = models.lm_step(torch, model, BATCH, SEQ, VOCAB, device=a.device,
                          autocast_dtype=torch.bfloat16 if a.precision == "bf16" else None,
                          fused=True)

    def synced_step():
        step()
        torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    seconds = common.time_steps(synced_step, a.steps, a.warmup)
    seen["peak"] = max(seen.get("peak", 0), torch.cuda.max_memory_allocated())
    return TOKENS / seconds


def main():
    a = common.parse_args(__doc__, default_threads=None, extra=options)
    torch = common.import_torch()
    if torch is None:
        return UNAVAILABLE
    if not torch.cuda.is_available():
        print("PyTorch %s sees no CUDA GPU (built for CUDA %s); nothing to compare"
              % (torch.__version__, torch.version.cuda))
        return UNAVAILABLE
    gpu = torch.cuda.get_device_name()
    print("PyTorch %s on %s, T3 batch %d x %d tokens, %.1f TFLOP per step"
          % (torch.__version__, gpu, BATCH, SEQ, FLOP_PER_STEP / 1e12), flush=True)
    if a.precision == "fp32":
        print("PyTorch fp32, " + fp32_without_tf32(torch), flush=True)
    else:
        print("PyTorch bf16: torch.autocast(bfloat16) forward, float32 parameters and AdamW",
              flush=True)
    print("PyTorch %s, scaled_dot_product_attention(is_causal=True), AdamW(fused=True)"
          % ("torch.compile" if a.compile else "eager"), flush=True)

    gpipe_args = ["--workload", "T3", "--device", "cuda"]
    if a.gpipe_precision:
        gpipe_args += ["--precision", a.gpipe_precision]
    gpipe_error = "not run (--no-gpipe)" if a.no_gpipe else None
    seen = {}

    def gp():
        nonlocal gpipe_error
        if gpipe_error is not None:
            return None
        r, gpipe_error = common.try_gpipe(a.gpipe, gpipe_args, a.steps, a.warmup)
        if r is None:
            print(gpipe_error, flush=True)
            print("(PyTorch is timed alone from here on)", flush=True)
            return None
        return r["throughput"]["tokens_per_s"], r.get("fraction_of_ceiling")

    def pt():
        try:
            return torch_round(torch, a, seen)
        finally:
            gc.collect()
            if a.compile:
                torch._dynamo.reset()
            torch.cuda.empty_cache()
    g, frac, t = common.alternate(a.rounds, gp, pt)

    label = "T3, PyTorch %s%s, gpipe %s" % (a.precision, " compiled" if a.compile else "",
                                            a.gpipe_precision or "default precision")
    extra = {"torch_version": torch.__version__, "gpu": gpu, "precision": a.precision,
             "gpipe_precision": a.gpipe_precision, "compile": a.compile,
             "rounds": a.rounds, "steps": a.steps, "warmup": a.warmup,
             "tokens_per_step": TOKENS, "flop_per_step": FLOP_PER_STEP,
             "torch_parameters": seen.get("parameters"),
             "torch_tokens_per_s": t, "torch_tflops": tflops(t),
             "torch_peak_memory_bytes": seen.get("peak"),
             "gpipe_tokens_per_s": g, "gpipe_tflops": tflops(g),
             "gpipe_fraction_of_ceiling": frac,
             "gpipe_error": None if g is not None else gpipe_error}
    common.compare([(label, g, t, frac)], "tokens/s", a.json, extra, ceiling="cuBLAS GEMM")
    print()
    print("achieved TFLOP/s: gpipe %s, PyTorch %.1f (%d parameters, peak %.1f GiB allocated)"
          % ("%.1f" % tflops(g) if g is not None else "-", tflops(t), seen["parameters"],
             seen["peak"] / 2**30))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
