#!/usr/bin/env python3
"""Time every kernel class of a training step on one GPU, as a training framework runs it (issue 32, item 2).

    /opt/torch/.venv/bin/python validation/tools/kernel_bench.py --out FILE.json [--grid quick|full]
        [--classes gemm,attention,...] [--commit SHA]
    python3 validation/tools/kernel_bench.py --list [--grid quick|full] [--classes ...]   (no GPU, no torch)

A measurement tool, like the NCCL / cuBLAS baselines: PyTorch is the reference framework here, the product never
depends on it. Kernels: GEMMs through cuBLASLt (torch.matmul in bf16; FP8 e4m3 with per-tensor scales through
torch._scaled_mm, bf16 output) in the layouts of a step (forward "nt", dgrad "nn", wgrad "tn"; FP8 runs all three
as "nt" on operands transposed beforehand, as Transformer Engine's cast-transpose leaves them); attention through
cuDNN's fused kernel (F.scaled_dot_product_attention under sdpa_kernel(CUDNN_ATTENTION), else FLASH_ATTENTION;
the record's "backend" says which ran); PyTorch's own kernels for the rest (norms, activations, rotary, residual
add, cross-entropy, embedding, fused AdamW, grad-norm clipping, FP8 cast and amax, MoE router and permutation).

Timing: warm-up, then CUDA events around each of N iterations (N >= 10, and enough for >= 20 ms of loop);
median, min and max. Before each iteration a 256 MiB buffer is written when the kernel's working set is under
2x L2 ("l2": "flushed"), then the GPU sleeps long enough for the host to queue the whole iteration (so launch
gaps stay out of the number, as in a step where the host runs ahead). Each forward kernel is checked once
against a float32 reference where cheap; a kernel whose check fails is not recorded.

Records: "mkernel.measurement.v1" (models/include/mk/io/measurement.hpp), "op": "kernel", with class, kernel, pass,
dtype, the class's shape fields, flops and bytes as the issue-32 census contract defines them (docs/calibration.md,
"Kernel measurements").

Exit codes: 0 ok, 1 nothing could be measured, 2 bad input (one line), 3 no GPU / no PyTorch (one line).
"""
import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time

SCHEMA = "mkernel.measurement.v1"
CLASSES = ("gemm", "attention", "norm", "activation", "rotary", "residual", "loss", "embedding", "optimizer",
           "grad-norm", "cast", "router", "permute")
GRIDS = ("quick", "full")

# The planner's presets (models/src/workload/workload.cpp): hidden, ffn, heads, kv heads, vocab; MoE experts/top-k.
PRESETS = [
    dict(name="llama3-8b", hidden=4096, ffn=14336, heads=32, kv=8, vocab=128256),
    dict(name="llama3-70b", hidden=8192, ffn=28672, heads=64, kv=8, vocab=128256),
    dict(name="llama3-405b", hidden=16384, ffn=53248, heads=128, kv=8, vocab=128256),
    dict(name="mixtral-8x22b", hidden=6144, ffn=16384, heads=48, kv=8, vocab=32000, experts=8, topk=2),
]
TPS = (1, 2, 4, 8)

MIB = 1 << 20
FLUSH_BYTES = 256 * MIB
MIN_ITERS = 10
MIN_LOOP_US = 20000.0
MAX_ITERS = 2000
WARMUP = 3


class BadInput(Exception):
    pass


def ceil_div(a, b):
    return -(-a // b)


# ---------------------------------------------------------------------------------------------------------------
# Shapes, flops and bytes (pure Python: --list and the CPU test use them without torch)
# ---------------------------------------------------------------------------------------------------------------

def gemm_entry(kernel, pas, m, n, k, batch, dtype, layout, model, tp, accumulate=False):
    """accumulate: the output is an fp32 buffer the GEMM adds into (read and written: Megatron-LM's
    gradient-accumulation fusion of weight-gradient GEMMs into the fp32 main gradient)."""
    e = dict(cls="gemm", kernel=kernel, pas=pas, dtype=dtype, m=m, n=n, k=k, batch=batch, layout=layout,
             model=model, tp=tp)
    out_b = 2
    if accumulate:
        e["accumulate"] = "float32"
        out_b = 8
    in_b = 1 if dtype == "float8_e4m3" else 2
    e["flops"] = 2 * m * n * k * batch
    e["bytes"] = batch * (in_b * (m * k + k * n) + out_b * m * n)
    return e


def gemm_census(p, tp, tokens, ep=1):
    """The lowering's forward GEMMs of one layer (models/src/workload/lowering.cpp), as (name, m, n, k, batch)."""
    h, d = p["hidden"], p["hidden"] // p["heads"]
    qkv_n = (p["heads"] // tp + 2 * max(1, p["kv"] // tp)) * d
    out = [("qkv", tokens, qkv_n, h, 1), ("attn-out", tokens, h, (p["heads"] // tp) * d, 1)]
    if "experts" in p:
        local = tokens // tp
        rows = ceil_div(local * p["topk"] * ep, p["experts"])
        out += [("router", local, p["experts"], h, 1),
                ("expert-up", rows, 2 * p["ffn"], h, p["experts"] // ep),
                ("expert-down", rows, h, p["ffn"], p["experts"] // ep)]
    else:
        out += [("mlp-up", tokens, 2 * (p["ffn"] // tp), h, 1), ("mlp-down", tokens, h, p["ffn"] // tp, 1)]
    out.append(("lm-head", tokens, ceil_div(p["vocab"], tp), h, 1))
    return out


def gemm_passes(name, m, n, k, batch, dtype, model, tp):
    """Forward, dgrad and wgrad of one forward GEMM (the lowering's addBackward)."""
    res = [gemm_entry(name, "forward", m, n, k, batch, dtype, "nt", model, tp),
           gemm_entry(name + ".dgrad", "backward", m, k, n, batch, dtype, "nn", model, tp),
           gemm_entry(name + ".wgrad", "backward", k, n, m, batch, dtype, "tn", model, tp)]
    if dtype == "float8_e4m3":
        for e in res:
            e["layout"] = "nt"  # operands transposed beforehand (Transformer Engine's cast-transpose)
    elif name != "router":  # the wgrad as gradient-accumulation fusion runs it (not the router's: F.linear)
        res.append(gemm_entry(name + ".wgrad", "backward", k, n, m, batch, dtype, "tn", model, tp, accumulate=True))
    return res


def fp8_ok(e):
    return e["m"] % 16 == 0 and e["n"] % 16 == 0 and e["k"] % 16 == 0


def attention_entries(batch, seq, heads, kv, d, causal, model, tp):
    base = dict(cls="attention", dtype="bfloat16", batch=batch, seq=seq, heads=heads, kv_heads=kv, head_dim=d,
                causal=causal, model=model, tp=tp)
    frac = 0.5 if causal else 1.0
    fwd_flops = int(4 * batch * heads * seq * seq * d * frac)
    qo = batch * seq * heads * d * 2
    kvb = batch * seq * kv * d * 2
    lse = batch * heads * seq * 4
    f = dict(base, kernel="attention", pas="forward", flops=fwd_flops, bytes=2 * qo + 2 * kvb + lse)
    # backward: reads q, k, v, o, do, lse; writes dq, dk, dv. FLOPs: 5 products against the forward's 2.
    b = dict(base, kernel="attention.bwd", pas="backward", flops=int(2.5 * fwd_flops),
             bytes=3 * qo + 2 * kvb + lse + qo + 2 * kvb)
    return [f, b]


def ew(cls, kernel, pas, dtype, flops, nbytes, **shape):
    e = dict(cls=cls, kernel=kernel, pas=pas, dtype=dtype, flops=int(flops), bytes=int(nbytes))
    e.update(shape)
    return e


def norm_entries(kernel, t, h):
    aff = 2 if kernel == "layernorm" else 1  # weight (and bias)
    stats = t * 4 * (2 if kernel == "layernorm" else 1)  # saved rstd (and mean), fp32
    return [ew("norm", kernel, "forward", "bfloat16", 5 * t * h, 4 * t * h + 2 * aff * h + stats, tokens=t, hidden=h),
            ew("norm", kernel, "backward", "bfloat16", 8 * t * h, 6 * t * h + 4 * aff * h + stats,
               tokens=t, hidden=h)]


def activation_entries(kernel, t, width):
    """width: the activation's input width (2 x ffn/tp for swiglu's gate+up, ffn/tp for gelu)."""
    if kernel == "swiglu":
        f = width // 2
        return [ew("activation", kernel, "forward", "bfloat16", 5 * t * f, 2 * t * width + 2 * t * f,
                   tokens=t, hidden=width),
                ew("activation", kernel, "backward", "bfloat16", 10 * t * f, 2 * t * f + 4 * t * width,
                   tokens=t, hidden=width)]
    return [ew("activation", kernel, "forward", "bfloat16", 8 * t * width, 4 * t * width, tokens=t, hidden=width),
            ew("activation", kernel, "backward", "bfloat16", 12 * t * width, 6 * t * width, tokens=t, hidden=width)]


def rope_entries(t, heads, kv, d):
    """heads: every head rotated (q heads + k heads, per GPU); kv_heads says how many of them are k's."""
    hh = heads + kv
    nb = 4 * t * hh * d + 2 * 2 * t * d  # x in, out; cos and sin (bf16, one row per token)
    return [ew("rotary", "rope", p, "bfloat16", 3 * t * hh * d, nb, tokens=t, heads=hh, head_dim=d, kv_heads=kv)
            for p in ("forward", "backward")]


def residual_entry(t, h):
    return ew("residual", "add", "forward", "bfloat16", t * h, 6 * t * h, tokens=t, hidden=h)


def loss_entries(t, v):
    return [ew("loss", "cross-entropy", "forward", "bfloat16", 4 * t * v, 2 * t * v + 8 * t + 4 * t + 4 * t,
               tokens=t, vocab=v),
            ew("loss", "cross-entropy", "backward", "bfloat16", 3 * t * v, 4 * t * v + 8 * t + 4 * t,
               tokens=t, vocab=v)]


def embedding_entries(t, h, v):
    return [ew("embedding", "embedding", "forward", "bfloat16", 0, 8 * t + 4 * t * h, tokens=t, hidden=h, vocab=v),
            ew("embedding", "embedding", "backward", "bfloat16", t * h, 8 * t + 2 * t * h + 2 * v * h,
               tokens=t, hidden=h, vocab=v)]


def adam_entry(n):
    # fp32 param, grad, m, v read; param, m, v written.
    return ew("optimizer", "adam", "step", "float32", 12 * n, 28 * n, params=n)


def master_entries(n):
    """The mixed-precision bookkeeping around the optimizer (Megatron-LM's DDP buffer and float16 optimizer): the
    per-micro-batch add of bf16 gradients into the fp32 main gradient, the fp32 masters copied into the bf16
    parameters, the main-gradient buffer zeroed."""
    return [ew("optimizer", "grad-accum", "backward", "float32", n, 10 * n, params=n),
            ew("optimizer", "param-copy", "step", "float32", n, 6 * n, params=n),
            ew("optimizer", "zero-grad", "step", "float32", 0, 4 * n, params=n)]


def gradnorm_entry(n):
    # clip_grad_norm_: the norm reads every fp32 gradient once, the clipping multiply reads and writes them.
    return ew("grad-norm", "grad-norm", "step", "float32", 3 * n, 12 * n, params=n)


def cast_entries(rows, cols):
    """TE's amax and fused cast-transpose of a bf16 [rows, cols] tensor (fp8_kernels.py): cast-fp8 reads 2 bytes
    and writes the fp8 tensor and its transpose, 4 per element (the transpose's zero padding to 16 rows uncounted);
    amax reads 2."""
    n = rows * cols
    return [ew("cast", "cast-fp8", "forward", "float8_e4m3", n, 4 * n, elements=n, rows=rows, cols=cols),
            ew("cast", "amax", "forward", "bfloat16", n, 2 * n, elements=n, rows=rows, cols=cols)]


def router_entries(t, experts, topk):
    nb_f = 2 * t * experts + 12 * t * topk
    return [ew("router", "topk-softmax", "forward", "bfloat16", 5 * t * experts, nb_f, tokens=t, experts=experts,
               topk=topk),
            ew("router", "topk-softmax", "backward", "bfloat16", 4 * t * experts,
               4 * t * experts + 2 * t * experts + 12 * t * topk, tokens=t, experts=experts, topk=topk)]


def permute_entries(t, h, topk, experts):
    rows = t * topk
    return [ew("permute", "permute", "forward", "bfloat16", 0, 2 * t * h + 2 * rows * h + 16 * rows,
               tokens=t, hidden=h, topk=topk, experts=experts),
            ew("permute", "unpermute", "forward", "bfloat16", 2 * rows * h,
               2 * rows * h + 2 * t * h + 12 * rows, tokens=t, hidden=h, topk=topk, experts=experts)]


def build_grid(grid, classes):
    """Every planned kernel, in run order. Entries sharing tensors (forward and backward) are adjacent."""
    out = []
    want = set(classes)
    quick = grid == "quick"
    p8b, p70b, p405b, pmx = PRESETS

    if "gemm" in want:
        g = []
        if quick:  # every GEMM path: bf16 nt / nn / tn, FP8 forward and pre-transposed backward, batched experts
            for dt in ("bfloat16", "float8_e4m3"):
                g.append(gemm_entry("square", "forward", 8192, 8192, 8192, 1, dt, "nt", "square", 1))
            for name, m, n, k, b in gemm_census(p8b, 8, 8192):
                if name == "mlp-up":
                    g += gemm_passes(name, m, n, k, b, "bfloat16", p8b["name"], 8)
                    g.append(gemm_passes(name, m, n, k, b, "float8_e4m3", p8b["name"], 8)[2])
            for name, m, n, k, b in gemm_census(pmx, 2, 4096):
                if name == "expert-up":
                    for dt in ("bfloat16", "float8_e4m3"):
                        e = gemm_passes(name, m, n, k, b, dt, pmx["name"], 2)[0]
                        e["ep"] = 1
                        g.append(e)
        else:
            plan = {  # model -> {tp: token counts}; tp = 1 covers one-GPU steps of a few layers
                "llama3-8b": {1: (2048, 8192, 16384), 2: (4096, 8192), 4: (8192, 16384), 8: (2048, 8192, 16384, 32768)},
                "llama3-70b": {1: (2048, 8192), 2: (8192,), 4: (8192,), 8: (2048, 8192, 16384)},
                "llama3-405b": {1: (2048,), 8: (2048, 8192, 16384)},
                "mixtral-8x22b": {1: (2048, 4096, 8192), 2: (4096, 8192, 16384), 8: (4096,)},
            }
            for p in PRESETS:
                for tp, toks in plan[p["name"]].items():
                    for t in toks:
                        eps = (1, 8) if "experts" in p else (1,)
                        seen = set()
                        for ep in eps:
                            for name, m, n, k, b in gemm_census(p, tp, t, ep):
                                if (name, m, n, k, b) in seen:
                                    continue
                                seen.add((name, m, n, k, b))
                                for dt in ("bfloat16", "float8_e4m3"):
                                    if dt == "float8_e4m3" and name == "router":
                                        continue  # the router stays in bf16 in FP8 recipes
                                    for e in gemm_passes(name, m, n, k, b, dt, p["name"], tp):
                                        e["ep"] = ep if "experts" in p else 1
                                        g.append(e)
            # Odd sizes and square references, both dtypes where FP8 allows (multiples of 16).
            odd = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048), (1024, 1024, 1024), (16384, 16384, 8192),
                   (4000, 5120, 5120), (8192, 13824, 5120), (2500, 3072, 1000), (8192, 1000, 4096),
                   (7168, 7168, 7168), (3000, 3000, 3000), (12288, 4608, 12288), (8192, 50304, 2048),
                   (6144, 2304, 6144), (256, 4096, 4096), (512, 8192, 8192), (127, 4096, 4096), (8192, 4096, 127),
                   (8192, 1536, 7168), (8192, 7168, 2048)]
            for m, n, k in odd:
                for dt in ("bfloat16", "float8_e4m3"):
                    for layout, pas, kern in (("nt", "forward", "gemm"),):
                        e = gemm_entry(kern, pas, m, n, k, 1, dt, layout, "odd", 1)
                        g.append(e)
                g.append(gemm_entry("gemm.dgrad", "backward", m, n, k, 1, "bfloat16", "nn", "odd", 1))
                g.append(gemm_entry("gemm.wgrad", "backward", m, n, k, 1, "bfloat16", "tn", "odd", 1))
        out += [e for e in g if e["dtype"] != "float8_e4m3" or fp8_ok(e)]

    if "attention" in want:
        cfgs = []  # (batch, seq, heads, kv, d, causal, model, tp)
        if quick:
            cfgs = [(1, 4096, 32, 8, 128, True, "llama3-8b", 1), (1, 2048, 16, 16, 192, True, "odd", 1),
                    (2, 2048, 16, 4, 64, False, "odd", 1)]
        else:
            for p in PRESETS:
                d = p["hidden"] // p["heads"]
                for tp in TPS:
                    hh, kv = p["heads"] // tp, max(1, p["kv"] // tp)
                    seqs = (4096,) if p is pmx else (2048, 8192)
                    for s in seqs:
                        cfgs.append((1, s, hh, kv, d, True, p["name"], tp))
            cfgs += [(1, 4096, 32, 8, 128, True, "llama3-8b", 1), (2, 4096, 32, 8, 128, True, "llama3-8b", 1),
                     (4, 2048, 32, 8, 128, True, "llama3-8b", 1), (2, 8192, 8, 2, 128, True, "llama3-70b", 8),
                     (4, 8192, 4, 1, 128, True, "llama3-8b", 8), (1, 8192, 32, 8, 128, False, "llama3-8b", 1),
                     (1, 2048, 32, 8, 128, False, "llama3-8b", 1), (1, 4096, 48, 8, 128, False, "mixtral-8x22b", 1),
                     (1, 3000, 20, 4, 128, True, "odd", 1)]
            for s in (2048, 4096, 8192):  # head dim 64 (GPT-style small models) and 192 (DeepSeek-V3's q/k)
                cfgs.append((1, s, 32, 32, 64, True, "odd", 1))
                cfgs.append((1, s, 16, 4, 64, True, "odd", 1))
                cfgs.append((1, s, 16, 16, 192, True, "odd", 1))
                cfgs.append((1, s, 32, 8, 192, True, "odd", 1))
            cfgs.append((1, 4096, 16, 16, 192, False, "odd", 1))
            cfgs.append((1, 4096, 32, 32, 64, False, "odd", 1))
        seen = set()
        for c in cfgs:
            if c[:6] in seen:
                continue
            seen.add(c[:6])
            out += attention_entries(*c)

    if "norm" in want:
        shapes = [(8192, 4096)] if quick else \
            [(t, h) for t in (1024, 2048, 4096, 8192, 16384, 32768) for h in (4096, 6144, 8192, 16384)] + \
            [(3000, 5120), (8192, 2560), (16384, 1000)]
        for kernel in ("rmsnorm", "layernorm"):
            for t, h in shapes:
                out += norm_entries(kernel, t, h)

    if "activation" in want:
        if quick:
            out += activation_entries("swiglu", 8192, 2 * 14336 // 8)
            out += activation_entries("gelu", 8192, 4096)
        else:
            ffns = sorted({p["ffn"] // tp for p in PRESETS for tp in TPS})
            for t in (2048, 8192, 16384):
                for f in ffns:
                    if t * f * 2 > (1 << 31):  # keep each tensor under 4 GiB of bf16 ... and the grid short
                        continue
                    out += activation_entries("swiglu", t, 2 * f)
            for t in (2048, 8192, 16384):
                for f in (3072, 4096, 8192, 12288, 16384):
                    out += activation_entries("gelu", t, f)
            out += activation_entries("swiglu", 3000, 2 * 5000)

    if "rotary" in want:
        if quick:
            out += rope_entries(8192, 32, 8, 128)
        else:
            for t in (2048, 8192, 16384, 32768):
                for hh, kv in ((32, 8), (16, 4), (8, 2), (4, 1), (64, 8), (48, 8), (128, 8), (16, 1)):
                    out += rope_entries(t, hh, kv, 128)
            for t in (2048, 8192):
                out += rope_entries(t, 32, 32, 64)
                out += rope_entries(t, 16, 16, 192)

    if "residual" in want:
        shapes = [(8192, 4096)] if quick else \
            [(t, h) for t in (1024, 2048, 4096, 8192, 16384, 32768) for h in (4096, 6144, 8192, 16384)] + [(3000, 5120)]
        out += [residual_entry(t, h) for t, h in shapes]

    if "loss" in want:
        if quick:
            out += loss_entries(8192, 16032)
        else:
            for t in (2048, 8192, 16384):
                for v in (128256, 64128, 32064, 16032, 32000, 16000, 8000, 50304):
                    out += loss_entries(t, v)
            out += loss_entries(3000, 151936)

    if "embedding" in want:
        if quick:
            out += embedding_entries(8192, 4096, 128256)
        else:
            for t in (2048, 8192, 16384):
                for h, v in ((4096, 128256), (4096, 16032), (8192, 16032), (8192, 128256), (16384, 16032),
                             (6144, 32000), (6144, 16000)):
                    out += embedding_entries(t, h, v)

    if "optimizer" in want:
        ns = [64 * MIB] if quick else [MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB, 1000 * 1000 * 100 + 7]
        out += [adam_entry(n) for n in ns]
        for n in ns:
            out += master_entries(n)

    if "grad-norm" in want:
        ns = [64 * MIB] if quick else [MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB, 1000 * 1000 * 100 + 7]
        out += [gradnorm_entry(n) for n in ns]

    if "cast" in want:
        # [tokens, width] of 1-1024 Mi elements, and an expert's odd row count (padded transpose) with odd columns.
        rcs = [(16384, 4096)] if quick else [(256 * 2 ** i, 4096) for i in range(0, 11, 2)] + [(1001, 2997)]
        for r, c in rcs:
            out += cast_entries(r, c)

    if "router" in want:
        if quick:
            out += router_entries(8192, 8, 2)
        else:
            for t in (2048, 8192, 16384, 32768):
                for e, k in ((8, 2), (64, 8), (128, 8), (256, 8), (16, 4)):
                    out += router_entries(t, e, k)

    if "permute" in want:
        if quick:
            out += permute_entries(8192, 6144, 2, 8)
        else:
            for t in (2048, 8192, 16384):
                for h, k, e in ((4096, 2, 8), (6144, 2, 8), (4096, 8, 64), (7168, 8, 256), (2048, 4, 16)):
                    out += permute_entries(t, h, k, e)
    return out


# Rough H100 rates for the time prediction only (never recorded): bf16 / fp8 matrix rate, attention, HBM.
PRED = dict(bf16=620e12, fp8=1000e12, attn_f=420e12, attn_b=330e12, hbm=2.6e12, overhead_s=0.035, launch_us=6.0,
            flush_us=95.0, sleep_us=25.0)


def predict_kernel_us(e):
    c = e["cls"]
    if c == "gemm":
        rate = PRED["fp8"] if e["dtype"] == "float8_e4m3" else PRED["bf16"]
        small = min(1.0, (e["m"] * e["n"]) / (8192.0 * 2048))  # small outputs leave SMs idle
        t = e["flops"] / (rate * max(0.25, small)) * 1e6
        return max(t, e["bytes"] / PRED["hbm"] * 1e6) + PRED["launch_us"]
    if c == "attention":
        rate = PRED["attn_f"] if e["pas"] == "forward" else PRED["attn_b"]
        return max(e["flops"] / rate * 1e6, e["bytes"] / PRED["hbm"] * 1e6) + 10
    kernels = {"rotary": 5, "activation": 3, "loss": 3, "router": 4, "permute": 3}.get(c, 1)
    return e["bytes"] / PRED["hbm"] * 1e6 + kernels * PRED["launch_us"]


def predict_record_s(e, l2_bytes=50 * MIB):
    t = predict_kernel_us(e)
    flush = e["bytes"] < 2 * l2_bytes
    per = t + (PRED["flush_us"] if flush else 0) + PRED["sleep_us"]
    iters = min(MAX_ITERS, max(MIN_ITERS, math.ceil(MIN_LOOP_US / per)))
    setup = 3 * e["bytes"] / PRED["hbm"]  # random inputs, the reference check
    return PRED["overhead_s"] + setup + (WARMUP + 2) * t * 1e-6 + iters * per * 1e-6


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------

class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line, "<prog>: <message>", and exit 2 (both harnesses)."""
    def error(self, message):
        sys.stderr.write(self.prog + ": " + message.replace("\n", " ") + "\n")
        sys.exit(2)


def parse_args(argv):
    ap = OneLineParser(prog="kernel_bench.py", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="Classes: " + ", ".join(CLASSES) + ". Details: docs/calibration.md, "
                              "'Kernel measurements'.")
    ap.add_argument("--out", help="measurement file to write (mkernel.measurement.v1)")
    ap.add_argument("--grid", default="quick", help="quick (about 20 shapes, a smoke test) or full (the presets "
                    "and odd sizes; about 4 minutes on an H100)")
    ap.add_argument("--classes", default=",".join(CLASSES), help="comma-separated kernel classes (default: all)")
    ap.add_argument("--commit", help="the commit measured, when the tree copy has no git history")
    ap.add_argument("--list", action="store_true", help="print the planned kernels (one JSON object a line) and "
                    "the predicted run time, then exit; needs no GPU")
    a = ap.parse_args(argv)
    if a.grid not in GRIDS:
        raise BadInput("--grid: unknown grid '%s' (quick or full)" % a.grid)
    classes = [c.strip() for c in a.classes.split(",") if c.strip()]
    if not classes:
        raise BadInput("--classes: empty (choose from %s)" % ",".join(CLASSES))
    for c in classes:
        if c not in CLASSES:
            raise BadInput("--classes: unknown class '%s' (choose from %s)" % (c, ",".join(CLASSES)))
    a.class_list = classes
    check_out_and_commit(a)
    return a


def check_out_and_commit(a):
    """The --out and --commit checks both harnesses share (BadInput naming the option): --out is required unless
    --list, and must name a file in a writable folder; --commit is 7 to 40 hex digits."""
    if not a.list:
        if not a.out:
            raise BadInput("--out FILE.json is required (or --list)")
        if os.path.isdir(a.out):
            raise BadInput("--out: '%s' is a directory" % a.out)
        parent = os.path.dirname(os.path.abspath(a.out))
        if not os.path.isdir(parent):
            raise BadInput("--out: folder '%s' does not exist" % parent)
        if not os.access(parent, os.W_OK):
            raise BadInput("--out: folder '%s' is not writable" % parent)
    if a.commit is not None and (len(a.commit) < 7 or any(ch not in "0123456789abcdefABCDEF" for ch in a.commit)):
        raise BadInput("--commit: '%s' is not a git commit id (7 to 40 hex digits)" % a.commit)


def open_gpu(tool, commit_arg):
    """(torch, commit, 0) for a GPU run of `tool`, or (None, None, exit code): 2 without a commit to name, 3 without
    PyTorch or a GPU. TF32 is switched off: every kernel runs in the precision its record names. Shared by
    kernel_bench.py and step_bench.py."""
    commit = commit_arg or git_commit()
    if not commit:
        sys.stderr.write("%s: no git history here: give --commit SHA (the commit of this tree)\n" % tool)
        return None, None, 2
    try:
        import torch
    except ImportError as ex:
        sys.stderr.write("%s: needs PyTorch with CUDA (%s)\n" % (tool, str(ex).splitlines()[0]))
        return None, None, 3
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        sys.stderr.write("%s: no CUDA GPU visible to PyTorch\n" % tool)
        return None, None, 3
    import warnings
    warnings.filterwarnings("ignore")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch, commit, 0


def git_commit():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and len(r.stdout.strip()) >= 7:
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def shape_text(e):
    keys = {"gemm": ("m", "n", "k", "batch", "layout"), "attention": ("batch", "seq", "heads", "kv_heads", "head_dim",
                                                                    "causal"),
            "norm": ("tokens", "hidden"), "activation": ("tokens", "hidden"), "rotary": ("tokens", "heads", "head_dim"),
            "residual": ("tokens", "hidden"), "loss": ("tokens", "vocab"), "embedding": ("tokens", "hidden", "vocab"),
            "optimizer": ("params",), "grad-norm": ("params",), "cast": ("elements",),
            "router": ("tokens", "experts", "topk"), "permute": ("tokens", "hidden", "topk")}[e["cls"]]
    return " ".join("%s=%s" % (k, e[k]) for k in keys)


def public(e):
    """The contract's fields of a planned entry (names as records carry them)."""
    r = {"class": e["cls"], "kernel": e["kernel"], "pass": e["pas"]}
    for k, v in e.items():
        if k not in ("cls", "pas"):
            r[k] = v
    return r


# ---------------------------------------------------------------------------------------------------------------
# On the GPU
# ---------------------------------------------------------------------------------------------------------------

class CheckFailed(Exception):
    pass


class Skip(Exception):
    pass


class Bench:
    def __init__(self, torch):
        self.torch = torch
        self.dev = torch.device("cuda", 0)
        props = torch.cuda.get_device_properties(0)
        self.l2 = getattr(props, "L2_cache_size", 50 * MIB) or 50 * MIB
        self.flush_buf = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=self.dev)
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(1234)
        self.sleep_ok = hasattr(torch.cuda, "_sleep")

    def randn(self, *shape, dtype=None, scale=1.0):
        t = self.torch.randn(*shape, device=self.dev, dtype=dtype or self.torch.bfloat16, generator=self.gen)
        if scale != 1.0:
            t.mul_(scale)
        return t

    def time(self, fn, nbytes):
        """Median / min / max microseconds of fn over N iterations; the L2 flush when the working set is small."""
        torch = self.torch
        flush = nbytes < 2 * self.l2
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        host = []
        for _ in range(WARMUP):
            torch.cuda.synchronize()
            h0 = time.perf_counter()
            ev[0].record()
            fn()
            ev[1].record()
            host.append((time.perf_counter() - h0) * 1e6)
        torch.cuda.synchronize()
        t_est = max(ev[0].elapsed_time(ev[1]) * 1000.0, 1.0)
        host_us = min(host)
        sleep_us = min(5000.0, max(20.0, 2.0 * host_us)) if self.sleep_ok else 0.0
        per = t_est + sleep_us + (95.0 if flush else 0.0)
        n = min(MAX_ITERS, max(MIN_ITERS, math.ceil(MIN_LOOP_US / per)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            if flush:
                self.flush_buf.zero_()
            if sleep_us:
                torch.cuda._sleep(int(sleep_us * 2000))  # cycles: ~2 GHz, so at least sleep_us at lower clocks
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        ts = [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]
        return dict(time_us=statistics.median(ts), min_us=min(ts), max_us=max(ts), iters=n,
                    l2="flushed" if flush else "not-flushed", host_us=host_us)


def rel_err(torch, out, ref):
    out = out.float()
    ref = ref.float()
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    den = float(torch.linalg.vector_norm(ref))
    num = float(torch.linalg.vector_norm(out - ref))
    return num / den if den > 0 else num


def check(name, err, tol):
    if not (err <= tol):
        raise CheckFailed("%s: relative error %.3g > %.3g against the float32 reference" % (name, err, tol))
    return err


# ---- GEMM ------------------------------------------------------------------------------------------------------

def to_fp8(torch, x):
    """Per-tensor scaled e4m3 (the delayed/current scaling recipes' result): (fp8 tensor, dequant scale)."""
    amax = float(x.abs().amax().float())
    scale = 448.0 / amax if amax > 0 else 1.0
    x8 = (x.float() * scale).to(torch.float8_e4m3fn)
    return x8, torch.tensor(1.0 / scale, dtype=torch.float32, device=x.device)


def run_gemm(B, e):
    torch = B.torch
    m, n, k, b = e["m"], e["n"], e["k"], e["batch"]
    lay = e["layout"]
    extra = {}
    # Operands as the step holds them (census m, n, k; see gemm_passes): nt: A[m,k] B[n,k]; nn: A[m,k] B[k,n];
    # tn: A[k,m] B[k,n] (Megatron's wgrad dW = dY^T X: dY = B, X = A).
    bs = (b,) if b > 1 else ()
    sc = 1.0 / math.sqrt(k)
    if e["dtype"] == "bfloat16":
        if lay == "nt":
            A, W = B.randn(*bs, m, k), B.randn(*bs, n, k, scale=sc)
            fn = lambda: torch.matmul(A, W.transpose(-1, -2))
            ref = lambda: torch.matmul(A[..., :256, :].float(), W.float().transpose(-1, -2))
            sub = lambda out: out[..., :256, :]
        elif lay == "nn":
            A, W = B.randn(*bs, m, k), B.randn(*bs, k, n, scale=sc)
            fn = lambda: torch.matmul(A, W)
            ref = lambda: torch.matmul(A[..., :256, :].float(), W.float())
            sub = lambda out: out[..., :256, :]
        elif e.get("accumulate"):
            # dW += dY^T X into an fp32 buffer (cuBLASLt with beta = 1 and an fp32 C/D, as Transformer Engine's
            # wgrad GEMM under Megatron-LM's gradient-accumulation fusion).
            X, DY = B.randn(*bs, k, m), B.randn(*bs, k, n, scale=sc)
            C = B.randn(*bs, n, m, dtype=torch.float32)
            if b > 1:
                fn = lambda: torch.baddbmm(C, DY.transpose(-1, -2), X, out_dtype=torch.float32)
            else:
                fn = lambda: torch.addmm(C, DY.transpose(-1, -2), X, out_dtype=torch.float32)
            ref = lambda: C[..., :256, :] + torch.matmul(DY[..., :, :256].float().transpose(-1, -2), X.float())
            sub = lambda out: out[..., :256, :]
        else:
            X, DY = B.randn(*bs, k, m), B.randn(*bs, k, n, scale=sc)
            fn = lambda: torch.matmul(DY.transpose(-1, -2), X)  # [n, m]
            ref = lambda: torch.matmul(DY[..., :, :256].float().transpose(-1, -2), X.float())
            sub = lambda out: out[..., :256, :]
        extra["algo"] = "addmm-out-fp32" if e.get("accumulate") else "matmul"
        extra["batched"] = "strided" if b > 1 else "no"
        out = fn()
        torch.cuda.synchronize()
        r = ref()
        o = sub(out)
        if b > 1:
            o, r = o[0], r[0]
        extra["rel_err"] = check("gemm", rel_err(torch, o, r), 2e-2)
        del out
    else:
        # e4m3 operands with per-tensor scales, bf16 output; _scaled_mm wants A row-major [m,k], B column-major
        # [k,n]: B = W8.t() with W8 [n,k] contiguous (the transposed copy for dgrad / wgrad is made here, untimed).
        fast = e["pas"] == "forward"  # TE: fast accumulation in fprop, split accumulator in dgrad / wgrad
        As, Ws, sa, sw = [], [], [], []
        for _ in range(b):
            a8, s1 = to_fp8(torch, B.randn(m, k))
            w8, s2 = to_fp8(torch, B.randn(n, k, scale=sc))
            As.append(a8), Ws.append(w8), sa.append(s1), sw.append(s2)

        def one(i):
            r = torch._scaled_mm(As[i], Ws[i].t(), scale_a=sa[i], scale_b=sw[i], out_dtype=torch.bfloat16,
                                 use_fast_accum=fast)
            return r[0] if isinstance(r, tuple) else r

        if b == 1:
            fn = lambda: one(0)
        else:
            fn = lambda: [one(i) for i in range(b)]
        out = one(0)
        torch.cuda.synchronize()
        ref = torch.matmul(As[0][:256].float() * sa[0], (Ws[0].float() * sw[0]).t())
        extra["rel_err"] = check("gemm fp8", rel_err(torch, out[:256], ref), 2e-2)
        extra["algo"] = "scaled_mm"
        extra["batched"] = "loop" if b > 1 else "no"
        extra["fast_accum"] = fast
        extra["scaling"] = "per-tensor"
        extra["operands"] = "pre-transposed" if e["pas"] == "backward" else "as-is"
        del out
    extra["out_dtype"] = "float32" if e.get("accumulate") else "bfloat16"
    t = B.time(fn, e["bytes"])
    t.update(extra)
    t["impl"] = "cublaslt"
    t["check"] = True
    return t


# ---- attention -------------------------------------------------------------------------------------------------

def attention_pair(B, ef, eb):
    """Forward and backward of one attention shape; the backend that ran is recorded."""
    torch = B.torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    bsz, s, H, kv, d, causal = ef["batch"], ef["seq"], ef["heads"], ef["kv_heads"], ef["head_dim"], ef["causal"]
    # [b, s, h, d] storage viewed as [b, h, s, d], as frameworks reshape the QKV projection's output.
    q = B.randn(bsz, s, H, d).transpose(1, 2).detach().requires_grad_(True)
    k0 = B.randn(bsz, s, kv, d).transpose(1, 2)
    v0 = B.randn(bsz, s, kv, d).transpose(1, 2)
    tries = [("cudnn", SDPBackend.CUDNN_ATTENTION, "native"), ("flash", SDPBackend.FLASH_ATTENTION, "native")]
    if kv != H:
        tries += [("cudnn", SDPBackend.CUDNN_ATTENTION, "expanded"), ("flash", SDPBackend.FLASH_ATTENTION, "expanded")]
    why = []
    for name, backend, gqa in tries:
        if gqa == "expanded":
            k = k0.repeat_interleave(H // kv, dim=1).detach().requires_grad_(True)
            v = v0.repeat_interleave(H // kv, dim=1).detach().requires_grad_(True)
        else:
            k = k0.detach().requires_grad_(True)
            v = v0.detach().requires_grad_(True)
        kw = dict(is_causal=causal)
        if gqa == "native" and kv != H:
            kw["enable_gqa"] = True

        def fwd():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, **kw)

        try:
            out = fwd()
            dout = torch.randn_like(out)
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            torch.cuda.synchronize()
        except (RuntimeError, TypeError, ValueError) as ex:
            why.append("%s/%s: %s" % (name, gqa, str(ex).strip().splitlines()[0][:160] if str(ex).strip() else
                                      type(ex).__name__))
            continue
        # Check: batch 0, the first and last head, the last 256 query rows, against float32.
        rows = min(256, s)
        errs = []
        for h in (0, H - 1):
            g = h // (H // kv) if gqa == "native" else h
            qs = q[0, h, s - rows:].float()
            ks, vs = k[0, g].float(), v[0, g].float()
            sc = (qs @ ks.t()) / math.sqrt(d)
            if causal:
                pos_q = torch.arange(s - rows, s, device=B.dev).unsqueeze(1)
                pos_k = torch.arange(s, device=B.dev).unsqueeze(0)
                sc = sc.masked_fill(pos_k > pos_q, float("-inf"))
            ref = torch.softmax(sc, dim=-1) @ vs
            errs.append(rel_err(torch, out[0, h, s - rows:], ref))
        err = check("attention %s" % name, max(errs), 2e-2)
        common = dict(impl="cudnn" if name == "cudnn" else "torch", backend=name, gqa=gqa if kv != H else "none",
                      algo="sdpa-" + name)
        if why:
            common["fallback_reason"] = "; ".join(why)[:300]
        tf = B.time(fwd, ef["bytes"])
        tf.update(common, check=True, rel_err=err)
        tb = B.time(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), eb["bytes"])
        tb.update(common, check=False)
        return [(ef, tf), (eb, tb)]
    raise Skip("no attention backend runs this shape: " + "; ".join(why)[:400])


# ---- elementwise / reductions --------------------------------------------------------------------------------

def fwd_bwd(B, ef, eb, fn_fwd, inputs, ref_check, impl_extra=None):
    """Time fn_fwd (forward) and autograd of its output w.r.t. inputs (backward)."""
    torch = B.torch
    out = fn_fwd()
    torch.cuda.synchronize()
    with torch.no_grad():
        err = ref_check(out)
    tf = B.time(fn_fwd, ef["bytes"])
    tf.update(impl="torch", check=True, rel_err=err, **(impl_extra or {}))
    res = [(ef, tf)]
    if eb is not None:
        dout = torch.randn_like(out)
        out = fn_fwd()
        tb = B.time(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True), eb["bytes"])
        tb.update(impl="torch", check=False, **(impl_extra or {}))
        res.append((eb, tb))
    return res


def run_norm(B, ef, eb):
    torch = B.torch
    import torch.nn.functional as F
    t, h = ef["tokens"], ef["hidden"]
    x = B.randn(t, h).requires_grad_(True)
    w = (1 + 0.1 * B.randn(h)).requires_grad_(True)
    if ef["kernel"] == "rmsnorm":
        fn = lambda: F.rms_norm(x, (h,), w, 1e-5)
        inputs = (x, w)

        def ref(out):
            xs = x[:256].float()
            r = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()
            return check("rmsnorm", rel_err(torch, out[:256], r), 1e-2)
    else:
        bias = (0.1 * B.randn(h)).requires_grad_(True)
        fn = lambda: F.layer_norm(x, (h,), w, bias, 1e-5)
        inputs = (x, w, bias)

        def ref(out):
            xs = x[:256].float()
            r = (xs - xs.mean(-1, keepdim=True)) * torch.rsqrt(xs.var(-1, unbiased=False, keepdim=True) + 1e-5)
            return check("layernorm", rel_err(torch, out[:256], r * w.float() + bias.float()), 1e-2)
    return fwd_bwd(B, ef, eb, fn, inputs, ref, dict(algo=ef["kernel"]))


def run_activation(B, ef, eb):
    torch = B.torch
    import torch.nn.functional as F
    t, wdt = ef["tokens"], ef["hidden"]
    x = B.randn(t, wdt).requires_grad_(True)
    if ef["kernel"] == "swiglu":
        def fn():
            g, u = torch.chunk(x, 2, dim=-1)  # the fused gate+up projection's output, as Megatron splits it
            return F.silu(g) * u

        def ref(out):
            g, u = torch.chunk(x[:256].float(), 2, dim=-1)
            return check("swiglu", rel_err(torch, out[:256], F.silu(g) * u), 1e-2)
        extra = dict(algo="silu*mul", fused=False)
    else:
        fn = lambda: F.gelu(x, approximate="tanh")
        ref = lambda out: check("gelu", rel_err(torch, out[:256], F.gelu(x[:256].float(), approximate="tanh")), 1e-2)
        extra = dict(algo="gelu-tanh", fused=False)
    return fwd_bwd(B, ef, eb, fn, (x,), ref, extra)


def run_rope(B, ef, eb):
    torch = B.torch
    t, hh, d, kv = ef["tokens"], ef["heads"], ef["head_dim"], ef["kv_heads"]
    q = B.randn(t, 1, hh - kv, d).requires_grad_(True)
    k = B.randn(t, 1, kv, d).requires_grad_(True)
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=B.dev, dtype=torch.float32) / d))
    pos = torch.arange(t, device=B.dev, dtype=torch.float32) % 8192
    freqs = torch.outer(pos, inv)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)

    def rotate_half(x):
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def fn():  # Megatron's unfused _apply_rotary_pos_emb_bshd on q and on k
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)

    def ref(out):
        qs = q[:256].float()
        r = qs * cos[:256].float() + rotate_half(qs) * sin[:256].float()
        return check("rope", rel_err(torch, out[0][:256], r), 1e-2)

    outs = fn()
    torch.cuda.synchronize()
    err = ref(outs)
    tf = B.time(fn, ef["bytes"])
    tf.update(impl="torch", check=True, rel_err=err, algo="rotate-half", fused=False)
    douts = tuple(torch.randn_like(o) for o in outs)
    tb = B.time(lambda: torch.autograd.grad(outs, (q, k), douts, retain_graph=True), eb["bytes"])
    tb.update(impl="torch", check=False, algo="rotate-half", fused=False)
    return [(ef, tf), (eb, tb)]


def run_residual(B, e):
    torch = B.torch
    a, b = B.randn(e["tokens"], e["hidden"]), B.randn(e["tokens"], e["hidden"])
    out = a + b
    err = check("add", rel_err(torch, out[:256], a[:256].float() + b[:256].float()), 1e-2)
    t = B.time(lambda: a + b, e["bytes"])
    t.update(impl="torch", check=True, rel_err=err, algo="add")
    return [(e, t)]


def run_loss(B, ef, eb):
    torch = B.torch
    import torch.nn.functional as F
    t, v = ef["tokens"], ef["vocab"]
    logits = B.randn(t, v, scale=2.0).requires_grad_(True)
    tgt = torch.randint(0, v, (t,), device=B.dev, generator=B.gen)
    fn = lambda: F.cross_entropy(logits, tgt)

    def ref(out):
        rows = min(1024, t)
        r = F.cross_entropy(logits[:rows].float(), tgt[:rows])
        o = F.cross_entropy(logits[:rows], tgt[:rows])
        return check("cross-entropy", rel_err(torch, o.reshape(1), r.reshape(1)), 1e-2)
    return fwd_bwd(B, ef, eb, fn, (logits,), ref, dict(algo="cross_entropy", reduction="mean"))


def run_embedding(B, ef, eb):
    torch = B.torch
    import torch.nn.functional as F
    t, h, v = ef["tokens"], ef["hidden"], ef["vocab"]
    w = B.randn(v, h).requires_grad_(True)
    ids = torch.randint(0, v, (t,), device=B.dev, generator=B.gen)
    fn = lambda: F.embedding(ids, w)

    def ref(out):
        if not torch.equal(out[:256], w[ids[:256]]):
            raise CheckFailed("embedding: gathered rows differ from the table")
        return 0.0
    return fwd_bwd(B, ef, eb, fn, (w,), ref, dict(algo="embedding"))


def split_sizes(n, chunk=64 * MIB):
    sizes = [chunk] * (n // chunk)
    if n % chunk:
        sizes.append(n % chunk)
    return sizes


def run_adam(B, e):
    torch = B.torch
    n = e["params"]
    sizes = split_sizes(n)
    params = [torch.nn.Parameter(B.randn(s, dtype=torch.float32)) for s in sizes]
    for p in params:
        p.grad = B.randn(p.numel(), dtype=torch.float32, scale=1e-3)
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.95, 1e-8, 0.1
    opt = torch.optim.AdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, fused=True)
    # Check the first step on the first 1 M elements against the AdamW formula in float32.
    m0 = min(MIB, sizes[0])
    p0, g0 = params[0].detach()[:m0].clone(), params[0].grad[:m0].clone()
    opt.step()
    torch.cuda.synchronize()
    mh = (1 - b1) * g0 / (1 - b1)
    vh = (1 - b2) * g0 * g0 / (1 - b2)
    ref = p0 * (1 - lr * wd) - lr * mh / (vh.sqrt() + eps)
    err = check("adamw", rel_err(torch, params[0].detach()[:m0] - p0, ref - p0), 1e-3)
    t = B.time(opt.step, e["bytes"])
    t.update(impl="torch", check=True, rel_err=err, algo="adamw-fused", tensors=len(sizes), grad_dtype="float32",
             param_dtype="float32", state_dtype="float32")
    return [(e, t)]


def run_master(B, e):
    """grad-accum, param-copy or zero-grad over n fp32 elements in 64 Mi-element tensors, as the reference step
    runs them (step_bench.py: add_ of each bf16 gradient into its main-gradient view, copy_ of each master into its
    parameter, zero_ of the buffer); checked element-wise on the first tensor."""
    torch = B.torch
    n, kern = e["params"], e["kernel"]
    sizes = split_sizes(n)
    if kern == "zero-grad":
        buf = B.randn(n, dtype=torch.float32)
        buf.zero_()
        err = check("zero-grad", float(buf[:MIB].abs().max()), 0.0)
        fn = buf.zero_
    elif kern == "grad-accum":
        main = [B.randn(s, dtype=torch.float32) for s in sizes]
        grads = [B.randn(s) for s in sizes]
        want = main[0][:MIB] + grads[0][:MIB].float()
        main[0].add_(grads[0])
        err = check("grad-accum", rel_err(torch, main[0][:MIB], want), 1e-6)

        def fn():
            for m, g in zip(main, grads):
                m.add_(g)
    else:
        masters = [B.randn(s, dtype=torch.float32) for s in sizes]
        params = [torch.empty(s, device=B.dev, dtype=torch.bfloat16) for s in sizes]
        params[0].copy_(masters[0])
        err = check("param-copy", rel_err(torch, params[0][:MIB].float(), masters[0][:MIB]), 4e-3)

        def fn():
            for q, m in zip(params, masters):
                q.copy_(m)
    t = B.time(fn, e["bytes"])
    algo = {"zero-grad": "zero_", "grad-accum": "add_"}.get(kern, "copy_")
    t.update(impl="torch", check=True, rel_err=err, algo=algo, tensors=1 if kern == "zero-grad" else len(sizes))
    return [(e, t)]


def run_gradnorm(B, e):
    torch = B.torch
    n = e["params"]
    sizes = split_sizes(n)
    params = [torch.nn.Parameter(torch.empty(s, device=B.dev, dtype=torch.float32)) for s in sizes]
    for p in params:
        p.grad = B.randn(p.numel(), dtype=torch.float32, scale=1e-3)
    ref = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params))
    got = float(torch.nn.utils.clip_grad_norm_(params, max_norm=1e9, foreach=True))
    err = check("grad-norm", abs(got - ref) / ref, 1e-4)
    # max_norm large: the clipping multiply still runs (coefficient clamped to 1) but leaves gradients as they are.
    t = B.time(lambda: torch.nn.utils.clip_grad_norm_(params, max_norm=1e9, foreach=True), e["bytes"])
    t.update(impl="torch", check=True, rel_err=err, algo="clip_grad_norm_-foreach", tensors=len(sizes),
             grad_dtype="float32")
    return [(e, t)]


def run_cast_pair(B, ec, ea):
    """TE's fused cast-transpose and amax (fp8_kernels.py), as step_fp8.py runs them; the cast checked element-wise
    against the torch cast before timing."""
    torch = B.torch
    import fp8_kernels as fk
    x = B.randn(ec["rows"], ec["cols"])
    e4m3 = torch.float8_e4m3fn
    why = fk.compare(torch, x, e4m3)
    if why:
        raise CheckFailed("cast-fp8: " + why)
    a = fk.amax(torch, x)
    y, _, inv, _ = fk.cast_transpose(torch, x, a, e4m3)
    err = check("cast-fp8", rel_err(torch, y[:256].float() * inv, x[:256]), 0.07)
    tc = B.time(lambda: fk.cast_transpose(torch, x, a, e4m3), ec["bytes"])
    tc.update(impl="triton", check=True, rel_err=err, algo="cast-transpose", fused=True, scaling="per-tensor",
              transpose_rows=fk.padded_rows(ec["rows"]))
    got = float(fk.amax(torch, x))
    ref = float(x.float().abs().max())
    err2 = check("amax", abs(got - ref) / ref, 1e-6)
    ta = B.time(lambda: fk.amax(torch, x), ea["bytes"])
    ta.update(impl="torch", check=True, rel_err=err2, algo="vector_norm-inf")
    return [(ec, tc), (ea, ta)]


def run_router(B, ef, eb):
    torch = B.torch
    t, ne, k = ef["tokens"], ef["experts"], ef["topk"]
    logits = B.randn(t, ne).requires_grad_(True)

    def fn():  # Mixtral-style gate: softmax in float32, top-k, renormalise
        probs = torch.softmax(logits.float(), dim=-1)
        w, idx = torch.topk(probs, k, dim=-1)
        return w / w.sum(-1, keepdim=True), idx

    out = fn()
    torch.cuda.synchronize()
    p = torch.softmax(logits[:256].double(), dim=-1)
    wr, ir = torch.topk(p, k, dim=-1)
    err = check("topk-softmax", rel_err(torch, out[0][:256], (wr / wr.sum(-1, keepdim=True)).float()), 1e-4)
    tf = B.time(fn, ef["bytes"])
    tf.update(impl="torch", check=True, rel_err=err, algo="softmax+topk")
    w, _ = fn()
    dw = torch.randn_like(w)
    tb = B.time(lambda: torch.autograd.grad(w, (logits,), dw, retain_graph=True), eb["bytes"])
    tb.update(impl="torch", check=False, algo="softmax+topk")
    return [(ef, tf), (eb, tb)]


def run_permute(B, ep_, eu):
    torch = B.torch
    t, h, k, ne = ep_["tokens"], ep_["hidden"], ep_["topk"], ep_["experts"]
    x = B.randn(t, h)
    idx = torch.topk(torch.rand(t, ne, device=B.dev, generator=B.gen), k, dim=-1).indices
    wts = torch.rand(t, k, device=B.dev, generator=B.gen)

    def permute():  # sort the (token, choice) pairs by expert, gather the rows
        order = torch.argsort(idx.reshape(-1), stable=True)
        src = order // k
        return x.index_select(0, src), order

    y, order = permute()
    torch.cuda.synchronize()
    src = order // k
    if not torch.equal(y[:256], x[src[:256]]):
        raise CheckFailed("permute: rows differ from the reference gather")
    tp = B.time(permute, ep_["bytes"])
    tp.update(impl="torch", check=True, rel_err=0.0, algo="argsort+index_select")
    wsorted = wts.reshape(-1)[order].to(torch.bfloat16).unsqueeze(1)

    def unpermute():  # weighted scatter-add of the expert outputs back to their tokens
        out = torch.zeros(t, h, device=B.dev, dtype=torch.bfloat16)
        return out.index_add_(0, src, y * wsorted)

    u = unpermute()
    ref = torch.zeros(t, h, device=B.dev, dtype=torch.float32).index_add_(0, src, y.float() * wsorted.float())
    err = check("unpermute", rel_err(torch, u[:256], ref[:256]), 1e-2)
    tu = B.time(unpermute, eu["bytes"])
    tu.update(impl="torch", check=True, rel_err=err, algo="mul+index_add")
    return [(ep_, tp), (eu, tu)]


def groups(entries):
    """Run units: a forward entry with its backward partner (adjacent, same class and shape), else alone."""
    i = 0
    while i < len(entries):
        e = entries[i]
        pair_cls = {"attention", "norm", "activation", "rotary", "loss", "embedding", "cast", "router", "permute"}
        if e["cls"] in pair_cls and i + 1 < len(entries) and entries[i + 1]["cls"] == e["cls"]:
            yield [e, entries[i + 1]]
            i += 2
        else:
            yield [e]
            i += 1


def run_unit(B, unit):
    e = unit[0]
    c = e["cls"]
    if c == "gemm":
        return [(e, run_gemm(B, e))]
    if c == "attention":
        return attention_pair(B, *unit)
    if c == "norm":
        return run_norm(B, *unit)
    if c == "activation":
        return run_activation(B, *unit)
    if c == "rotary":
        return run_rope(B, *unit)
    if c == "residual":
        return run_residual(B, e)
    if c == "loss":
        return run_loss(B, *unit)
    if c == "embedding":
        return run_embedding(B, *unit)
    if c == "optimizer":
        return run_adam(B, e) if e["kernel"] == "adam" else run_master(B, e)
    if c == "grad-norm":
        return run_gradnorm(B, e)
    if c == "cast":
        return run_cast_pair(B, *unit)
    if c == "router":
        return run_router(B, *unit)
    if c == "permute":
        return run_permute(B, *unit)
    raise AssertionError(c)


def make_record(e, t):
    r = {"op": "kernel", "impl": t.pop("impl"), "algo": t.pop("algo", ""), "dtype": e["dtype"], "ranks": 1,
         "bytes": int(e["bytes"]), "time_us": t["time_us"], "iters": t["iters"], "stat": "median",
         "class": e["cls"], "kernel": e["kernel"], "pass": e["pas"], "flops": int(e["flops"])}
    for k, v in e.items():
        if k not in ("cls", "kernel", "pas", "dtype", "bytes", "flops"):
            r[k] = v
    t.pop("host_us", None)
    r.update(t)
    r["tflops"] = r["flops"] / r["time_us"] / 1e6
    r["algbw_gbs"] = r["bytes"] / r["time_us"] / 1e3
    r["busbw_gbs"] = 0.0
    return r


def nvidia_smi(query):
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=" + query, "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def cublaslt_version():
    import ctypes
    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
        try:
            lib = ctypes.CDLL(name)
            v = lib.cublasLtGetVersion()
            return "%d.%d.%d" % (v // 10000, (v // 100) % 100, v % 100)
        except (OSError, AttributeError):
            continue
    return None


def system_block(torch):
    props = torch.cuda.get_device_properties(0)
    s = {"gpu": torch.cuda.get_device_name(0), "gpus": 1, "cuda": torch.version.cuda, "torch": torch.__version__,
         "sms": props.multi_processor_count, "clocks": "as found (not changed)"}
    drv = nvidia_smi("driver_version")
    if drv:
        s["driver"] = drv
    cv = torch.backends.cudnn.version()
    if cv:
        s["cudnn"] = "%d.%d.%d" % (cv // 10000, (cv // 100) % 100, cv % 100) if cv >= 90000 else str(cv)
    lt = cublaslt_version()
    if lt:
        s["cublaslt"] = lt
    l2 = getattr(props, "L2_cache_size", 0)
    if l2:
        s["l2_mib"] = l2 / MIB
    s["memory_gib"] = round(props.total_memory / (1 << 30), 1)
    for q, key in (("clocks.max.sm", "sm_clock_max_mhz"), ("power.limit", "power_limit_w")):
        v = nvidia_smi(q)
        if v:
            s[key] = v
    return s


def write_file(path, doc):
    tmp = path + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def main(argv):
    try:
        a = parse_args(argv)
    except BadInput as ex:
        sys.stderr.write("kernel_bench.py: %s\n" % ex)
        return 2
    entries = build_grid(a.grid, a.class_list)
    predicted = sum(predict_record_s(e) for e in entries)
    if a.list:
        for e in entries:
            print(json.dumps(public(e), sort_keys=True))
        print("# %d kernels, predicted %.0f s on an H100" % (len(entries), predicted))
        return 0
    torch, commit, rc = open_gpu("kernel_bench.py", a.commit)
    if rc:
        return rc
    B = Bench(torch)
    sysb = system_block(torch)
    cmd = "kernel_bench.py " + shlex.join(argv)
    doc = {"schema": SCHEMA, "system": sysb,
           "run": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "commit": commit,
                   "command": cmd, "grid": a.grid, "complete": False},
           "records": []}
    print("kernel_bench: %s, %d SMs, L2 %.0f MiB; torch %s, CUDA %s, cuDNN %s; %d kernels (%s grid), predicted "
          "%.0f s" % (sysb["gpu"], sysb["sms"], B.l2 / MIB, sysb["torch"], sysb["cuda"], sysb.get("cudnn"),
                      len(entries), a.grid, predicted), flush=True)
    t0 = time.time()
    done_pred = 0.0
    skipped, refused = [], []
    last_write = t0
    n_done = 0
    for unit in groups(entries):
        label = "%s %s %s" % (unit[0]["cls"], unit[0]["kernel"], shape_text(unit[0]))
        try:
            results = run_unit(B, unit)
        except CheckFailed as ex:
            refused.append("%s: %s" % (label, ex))
            print("  REFUSED %s: %s" % (label, ex), flush=True)
            results = []
        except Skip as ex:
            skipped.append("%s: %s" % (label, ex))
            print("  skip %s: %s" % (label, ex), flush=True)
            results = []
        except (RuntimeError, torch.cuda.OutOfMemoryError) as ex:
            msg = str(ex).strip().splitlines()[0][:200] if str(ex).strip() else type(ex).__name__
            skipped.append("%s: %s" % (label, msg))
            print("  skip %s: %s" % (label, msg), flush=True)
            results = []
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        for e, t in results:
            r = make_record(e, t)
            doc["records"].append(r)
            print("  %-10s %-18s %-8s %-11s %-44s %10.2f us %8.1f TFLOP/s %7.0f GB/s %s%s" % (
                e["cls"], e["kernel"], e["pas"], e["dtype"], shape_text(e), r["time_us"], r["tflops"],
                r["algbw_gbs"], r["l2"], (" " + r["backend"]) if "backend" in r else ""), flush=True)
        n_done += len(unit)
        done_pred += sum(predict_record_s(e) for e in unit)
        el = time.time() - t0
        if n_done % 25 < len(unit) or time.time() - last_write > 20:
            eta = el / done_pred * (predicted - done_pred) if done_pred > 0 else 0
            print("[%d/%d kernels, %.0f s elapsed, about %.0f s left]" % (n_done, len(entries), el, eta), flush=True)
            if doc["records"]:
                write_file(a.out, doc)
                last_write = time.time()
        free, total = torch.cuda.mem_get_info()
        if torch.cuda.memory_reserved() > 0.5 * total:
            torch.cuda.empty_cache()
    el = time.time() - t0
    doc["run"]["complete"] = True
    doc["run"]["seconds"] = round(el, 1)
    if not doc["records"]:
        sys.stderr.write("kernel_bench.py: nothing measured (%d skipped, %d refused)\n" % (len(skipped), len(refused)))
        return 1
    write_file(a.out, doc)
    print("kernel_bench: %d records in %.0f s (predicted %.0f s); %d skipped, %d refused by their check -> %s" % (
        len(doc["records"]), el, predicted, len(skipped), len(refused), a.out))
    for s in skipped + refused:
        print("  not recorded: " + s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
