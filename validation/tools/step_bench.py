#!/usr/bin/env python3
"""Time real training steps of a reference transformer on one GPU, to check the planner against (issue 32, item 5).

    /opt/torch/.venv/bin/python validation/tools/step_bench.py --out FILE.json [--grid quick|full] [--commit SHA]
        [--models M,...] [--dtype all|bfloat16|fp8] [--profile PROFILE.json]
    python3 validation/tools/step_bench.py --list [--grid quick|full]   (no GPU, no torch)

The reference is plain PyTorch built from the kernels kernel_bench.py times: bf16 nn.Linear without bias (cuBLASLt),
F.rms_norm, Megatron's rotate-half rotary, F.scaled_dot_product_attention under cuDNN (else flash), SwiGLU,
residual adds, F.cross_entropy on bf16 logits, F.embedding; MoE layers add the router linear, fp32 softmax + top-k
+ renormalisation, argsort + index_select permutation, a loop of GEMMs over the experts and a weighted index_add_
unpermutation. A few layers of a preset's shapes (the presets of models/src/workload/workload.cpp), one GPU, no
parallelism (tp = pp = dp = ep = 1).

The step, as Megatron-LM keeps mixed precision (recipe "megatron-bf16"): bf16 model parameters; each micro-batch's
bf16 weight gradients are added into fp32 main-gradient buffers (one flat buffer) by a post-accumulate-grad hook;
after the last micro-batch clip_grad_norm_(1.0, foreach) on the fp32 main gradients, AdamW(fused=True) on fp32
master weights, the master weights copied back into the bf16 parameters, the main-gradient buffer zeroed. 18 bytes
of model state per parameter (2 bf16 weight, 4 fp32 main grad, 4 fp32 master, 8 fp32 Adam moments). The workload
says "gradAccumFusion": false: the weight gradients are added into the main grads by a separate kernel.

FP8 (recipe "te-fp8-current", workload "dtype": "fp8", record "dtype": "float8_e4m3"): Transformer Engine's recipe
as the planner prices it, the GEMMs of qkv, attn-out, mlp-up / mlp-down or expert-up / expert-down in FP8 forward
and backward on torch._scaled_mm with current per-tensor scaling, the weights cast once per step; the LM head and
the router in bf16; everything else as the bf16 recipe (validation/tools/step_fp8.py says how: each cast TE's amax
and fused cast-transpose, fp8_kernels.py). Before its first FP8 step a model's cast-transpose is checked against the
torch cast and its FP8 linear against float32 (forward, dgrad, wgrad at each weight shape); a failed check skips
that model's FP8 steps with the reason.

Timing: 3 warm-up steps, then 7 timed steps (torch.cuda.synchronize + perf_counter around each whole step, host
work included, as a training loop sees it); median, min, max; peak memory torch.cuda.max_memory_allocated over the
timed steps. Records: "mkernel.measurement.v1", "op": "step", with the workload object mk-plan --workload accepts.
--profile FILE: one more step per record under torch.profiler, not timed, summarized by kernel class
("mkernel.step-profile.v1", validation/tools/step_profile.py).

Exit codes: 0 ok, 1 nothing could be measured, 2 bad input (one line), 3 no GPU / no PyTorch (one line).
"""
import argparse
import datetime
import gc
import json
import math
import os
import shlex
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_bench as kb  # noqa: E402  (shared conventions: system block, file writing, commit; imports no torch)
import step_fp8  # noqa: E402  (the FP8 linear; imports no torch)
import step_profile  # noqa: E402  (the --profile summary; imports no torch)

GRIDS = ("quick", "full")
RECIPE_TEXT = ("bf16 params and compute; fp32 main grads accumulated over micro-batches; clip_grad_norm_(1.0) on "
               "them; fused AdamW on fp32 master weights (lr 1e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1), "
               "copied back to bf16; 18 bytes of model state per parameter")
# Per step dtype: (recipe, record dtype, workload training.dtype, description).
RECIPES = {
    "bfloat16": ("megatron-bf16", "bfloat16", "bfloat16", RECIPE_TEXT),
    "fp8": ("te-fp8-current", "float8_e4m3", "fp8",
            "as megatron-bf16, but the GEMMs of qkv, attn-out, mlp-up/down or expert-up/down in FP8 forward and "
            "backward (torch._scaled_mm; e4m3 activations and weights, e5m2 output gradients; current per-tensor "
            "scaling: amax then cast per micro-batch; weights cast once per step, FP8 copy and its transpose kept); "
            "lm-head and router bf16"),
}
WARMUP = 3  # the first record of a model also grows the allocator's pools: one more untimed step
TIMED = 7
BYTES_PER_PARAM = 18

# The presets' shapes (models/src/workload/workload.cpp). Layers: as many as fit one 80 GB GPU with the 18 bytes of
# model state per parameter and the activations of the largest micro-batch (mixtral-8x22b: one layer is 2.5 G
# parameters, so one layer; a llama3-70b layer is 0.86 G next to 2.1 G of embedding and head).
MODELS = {
    "llama3-8b": dict(hidden=4096, ffn=14336, heads=32, kv=8, vocab=128256, layers=4),
    "llama3-70b": dict(hidden=8192, ffn=28672, heads=64, kv=8, vocab=128256, layers=1),
    "mixtral-8x22b": dict(hidden=6144, ffn=16384, heads=48, kv=8, vocab=32000, layers=1, experts=8, topk=2),
    "tiny-dense": dict(hidden=1024, ffn=3584, heads=8, kv=2, vocab=32000, layers=2),
    "tiny-moe": dict(hidden=1024, ffn=1024, heads=8, kv=2, vocab=32000, layers=2, experts=4, topk=2),
}


BadInput = kb.BadInput  # one bad-input error for both harnesses (kb.check_out_and_commit raises it)


# ---------------------------------------------------------------------------------------------------------------
# The grid, the workload objects and the predicted time (pure Python: --list and the CPU test use them)
# ---------------------------------------------------------------------------------------------------------------

# FP8 steps of the full grid, (seq, micro_batch, micro_batches): points of the bf16 grid, to compare the recipes.
FP8_POINTS = {"llama3-8b": ((2048, 1, 1), (2048, 1, 4), (4096, 1, 1), (4096, 2, 2)),
              "mixtral-8x22b": ((2048, 1, 1), (2048, 2, 2), (4096, 1, 4), (4096, 2, 1)),
              "llama3-70b": ((2048, 1, 1), (4096, 2, 2))}


def build_grid(grid):
    """The steps, each model's bf16 steps then its FP8 ones (one model build per model)."""
    if grid == "quick":
        return [dict(model=m, seq=512, micro_batch=1, micro_batches=2, dtype=dt)
                for m in ("tiny-dense", "tiny-moe") for dt in ("bfloat16", "fp8")]
    out = []
    for model in ("llama3-8b", "mixtral-8x22b", "llama3-70b"):
        for seq in (2048, 4096):
            for mb, m in ((1, 1), (1, 4), (2, 1), (2, 2)) if model != "llama3-70b" else ((1, 1), (2, 2)):
                out.append(dict(model=model, seq=seq, micro_batch=mb, micro_batches=m, dtype="bfloat16"))
        for seq, mb, m in FP8_POINTS[model]:
            out.append(dict(model=model, seq=seq, micro_batch=mb, micro_batches=m, dtype="fp8"))
    return out


def workload(e):
    """The workload object (mkernel.workload.v1, models/src/workload/workload_io.cpp) of the model actually run."""
    p = MODELS[e["model"]]
    model = {"layers": p["layers"], "hidden": p["hidden"], "ffn": p["ffn"], "heads": p["heads"], "kvHeads": p["kv"],
             "vocab": p["vocab"], "gatedMlp": True}
    if "experts" in p:
        model["moe"] = {"experts": p["experts"], "topK": p["topk"], "ffn": p["ffn"]}
    return {"schema": "mkernel.workload.v1", "name": "%s-%dl" % (e["model"], p["layers"]), "model": model,
            "training": {"seq": e["seq"], "microBatch": e["micro_batch"],
                         "globalBatch": e["micro_batch"] * e["micro_batches"], "dtype": RECIPES[e["dtype"]][2],
                         "recompute": "none", "gradAccumFusion": False},
            "layout": {"tp": 1, "pp": 1, "dp": 1, "ep": 1, "sp": False, "zero": 0, "gradDtype": "float32"}}


def params_of(p):
    h, d = p["hidden"], p["hidden"] // p["heads"]
    attn = h * (p["heads"] + 2 * p["kv"]) * d + p["heads"] * d * h + 2 * h
    mlp = p["experts"] * 3 * h * p["ffn"] + h * p["experts"] if "experts" in p else 3 * h * p["ffn"]
    return p["layers"] * (attn + mlp) + 2 * p["vocab"] * h + h


def step_flops(e):
    """Model FLOPs of one step: 6 per active parameter and token (GEMMs), causal attention fwd + bwd."""
    p = MODELS[e["model"]]
    h, d = p["hidden"], p["hidden"] // p["heads"]
    tokens = e["seq"] * e["micro_batch"] * e["micro_batches"]
    attn = h * (p["heads"] + 2 * p["kv"]) * d + p["heads"] * d * h
    mlp = p["topk"] * 3 * h * p["ffn"] + h * p["experts"] if "experts" in p else 3 * h * p["ffn"]
    gemm = 6 * tokens * (p["layers"] * (attn + mlp) + p["vocab"] * h)
    sdpa = 3.5 * 2 * tokens * e["seq"] * p["heads"] * d * p["layers"]  # 4·s²·d·½ per sequence and head, fwd + 2.5x
    return int(gemm + sdpa)


def fp8_gemm_flops(e):
    """The FLOPs of step_flops that run in FP8 under the fp8 recipe (0 in bf16)."""
    if e["dtype"] != "fp8":
        return 0
    p = MODELS[e["model"]]
    h, d = p["hidden"], p["hidden"] // p["heads"]
    tokens = e["seq"] * e["micro_batch"] * e["micro_batches"]
    attn = h * (p["heads"] + 2 * p["kv"]) * d + p["heads"] * d * h
    mlp = p["topk"] * 3 * h * p["ffn"] if "experts" in p else 3 * h * p["ffn"]
    return 6 * tokens * p["layers"] * (attn + mlp)


# The predictor of the run time (a rough H100; the bf16 full grid ran in half its prediction): FP8 GEMMs at 1.6x the
# bf16 rate, each FP8 GEMM's casts about 30 launches and 12 bytes per activation element, the weight cast 8 bytes per
# FP8 parameter per step; a profiled step and its trace export add profile_s.
PRED = dict(tflops=450e12, fp8_speedup=1.6, hbm=2.6e12, record_s=1.5, model_s=4.0, launch_us=8.0, fp8_check_s=3.0,
            profile_s=2.0)


def predict_step_s(e):
    p = MODELS[e["model"]]
    n = params_of(p)
    launches = e["micro_batches"] * p["layers"] * (80 + (60 + 12 * p.get("experts", 0)) if "experts" in p else 80)
    opt = (28 + 12 + 16) * n / PRED["hbm"]  # AdamW, clipping, main-grad adds, master copy-back and zeroing
    f8 = fp8_gemm_flops(e)
    t = (step_flops(e) - f8 + f8 / PRED["fp8_speedup"]) / PRED["tflops"] + opt
    if e["dtype"] == "fp8":
        tokens = e["seq"] * e["micro_batch"] * e["micro_batches"]
        linears = p["layers"] * (2 + 2 * p.get("experts", 1))
        launches += e["micro_batches"] * linears * 30
        width = p["hidden"] * 3 + p["ffn"] * 3 * (p["topk"] if "experts" in p else 1)  # cast inputs per token
        t += (12 * tokens * p["layers"] * width + 8 * step_fp8.fp8_params(p)) / PRED["hbm"]
    return t + launches * PRED["launch_us"] * 1e-6


def predict_record_s(e, profile):
    return PRED["record_s"] + (WARMUP + TIMED + 1 + (1 if profile else 0)) * predict_step_s(e) + (
        PRED["profile_s"] if profile else 0.0)


def predict_s(grid, profile=False):
    models = {e["model"] for e in grid}
    fp8_models = {e["model"] for e in grid if e["dtype"] == "fp8"}
    return sum(predict_record_s(e, profile) for e in grid) + PRED["model_s"] * len(models) + PRED[
        "fp8_check_s"] * len(fp8_models)


def label(e):
    return "%s %s seq=%d micro_batch=%d micro_batches=%d" % (e["model"], RECIPES[e["dtype"]][0], e["seq"],
                                                            e["micro_batch"], e["micro_batches"])


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------

def parse_args(argv):
    ap = kb.OneLineParser(prog="step_bench.py", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="Details: docs/calibration.md, 'Training-step measurements'.")
    ap.add_argument("--out", help="measurement file to write (mkernel.measurement.v1)")
    ap.add_argument("--grid", default="quick", help="quick (4 tiny steps, bf16 and fp8, a smoke test) or full "
                    "(layers of llama3-8b, llama3-70b and mixtral-8x22b, 20 bf16 and 10 fp8 steps; about 2 minutes "
                    "on an H100)")
    ap.add_argument("--commit", help="the commit measured, when the tree copy has no git history")
    ap.add_argument("--list", action="store_true", help="print the planned steps (one JSON object a line, with the "
                    "workload object) and the predicted run time, then exit; needs no GPU")
    ap.add_argument("--dtype", default="all", choices=("all", "bfloat16", "fp8"),
                    help="only the grid's steps of this recipe's dtype (all: both)")
    ap.add_argument("--models", help="comma-separated models: only the grid's steps of these (default: all)")
    ap.add_argument("--profile", help="also run one untimed step per record under torch.profiler and write its "
                    "kernel time by class to this file (mkernel.step-profile.v1)")
    a = ap.parse_args(argv)
    if a.grid not in GRIDS:
        raise BadInput("--grid: unknown grid '%s' (quick or full)" % a.grid)
    if a.models is not None:
        known = sorted({e["model"] for e in build_grid(a.grid)})
        a.models = a.models.split(",")
        for m in a.models:
            if m not in known:
                raise BadInput("--models: '%s' is not a model of the %s grid (choose from %s)" % (
                    m, a.grid, ",".join(known)))
    kb.check_out_and_commit(a)
    if a.profile is not None and not a.list:
        try:  # --out's checks (kernel_bench.py's), named for --profile
            kb.check_out_and_commit(argparse.Namespace(list=False, out=a.profile, commit=None))
        except BadInput as ex:
            raise BadInput(str(ex).replace("--out", "--profile", 1))
        if os.path.abspath(a.profile) == os.path.abspath(a.out):
            raise BadInput("--profile: '%s' is also --out (give two files)" % a.profile)
    return a


# ---------------------------------------------------------------------------------------------------------------
# On the GPU
# ---------------------------------------------------------------------------------------------------------------

def build_model(torch, p, dev):
    """The reference transformer as a torch.nn.Module of bf16 parameters (Megatron's init: normal(0, 0.02))."""
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, H, kv, d = p["hidden"], p["heads"], p["kv"], p["hidden"] // p["heads"]
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}

    def rotate_half(x):
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(h, (H + 2 * kv) * d, bias=False)
            self.out = nn.Linear(H * d, h, bias=False)
            self.attn = None  # (backend, gqa), chosen by probe()

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, H + 2 * kv, d).split((H, kv, kv), dim=2)
            q = (q * cos) + (rotate_half(q) * sin)  # Megatron's unfused rotary, [b, s, heads, d]
            k = (k * cos) + (rotate_half(k) * sin)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            backend, gqa = self.attn
            kw = dict(is_causal=True)
            if kv != H:
                if gqa == "native":
                    kw["enable_gqa"] = True
                else:
                    k = k.repeat_interleave(H // kv, dim=1)
                    v = v.repeat_interleave(H // kv, dim=1)
            with sdpa_kernel([backends[backend]]):
                o = F.scaled_dot_product_attention(q, k, v, **kw)
            return self.out(o.transpose(1, 2).reshape(b, s, H * d))

    class Mlp(nn.Module):
        def __init__(self, f):
            super().__init__()
            self.up = nn.Linear(h, 2 * f, bias=False)  # gate and up in one GEMM, as Megatron fuses them
            self.down = nn.Linear(f, h, bias=False)

        def forward(self, x):
            g, u = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(g) * u)

    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            E, f = p["experts"], p["ffn"]
            self.router = nn.Linear(h, E, bias=False)
            # One module per expert (Megatron's SequentialMLP): slicing one [E, ...] parameter instead would make
            # autograd build a whole-tensor gradient per expert.
            self.experts = nn.ModuleList(Mlp(f) for _ in range(E))

        def forward(self, x):
            shape = x.shape
            x = x.reshape(-1, h)
            t, k, E = x.shape[0], p["topk"], p["experts"]
            probs = torch.softmax(self.router(x).float(), dim=-1)
            w, idx = torch.topk(probs, k, dim=-1)
            w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
            flat = idx.reshape(-1)
            order = torch.argsort(flat, stable=True)
            src = order // k
            xp = x.index_select(0, src)
            counts = torch.bincount(flat, minlength=E).tolist()  # the host needs the split sizes (as Megatron's loop)
            outs = []
            for expert, xe in zip(self.experts, xp.split(counts)):
                outs.append(expert(xe))
            yp = torch.cat(outs) * w.reshape(-1)[order].unsqueeze(1)
            return torch.zeros_like(x).index_add_(0, src, yp).view(shape)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.Parameter(torch.ones(h))
            self.norm2 = nn.Parameter(torch.ones(h))
            self.attn = Attention()
            self.mlp = Moe() if "experts" in p else Mlp(p["ffn"])

        def forward(self, x, cos, sin):
            x = x + self.attn(F.rms_norm(x, (h,), self.norm1, 1e-5), cos, sin)
            return x + self.mlp(F.rms_norm(x, (h,), self.norm2, 1e-5))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(p["vocab"], h)
            self.layers = nn.ModuleList(Layer() for _ in range(p["layers"]))
            self.norm = nn.Parameter(torch.ones(h))
            self.head = nn.Linear(h, p["vocab"], bias=False)  # untied, as the presets

        def forward(self, ids, targets, cos, sin):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, cos, sin)
            logits = self.head(F.rms_norm(x, (h,), self.norm, 1e-5))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    with torch.device(dev):
        model = Model().to(torch.bfloat16)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if prm.dim() >= 2:
                prm.normal_(0.0, 0.02)
    return model


def rope_tables(torch, seq, d, dev):
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(seq, device=dev, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)[None, :, None, :]
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def probe_attention(torch, p, seq, dev):
    """The first of cuDNN / flash, native GQA / K-V expanded, that runs forward and backward at this shape."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    H, kv, d = p["heads"], p["kv"], p["hidden"] // p["heads"]
    tries = [("cudnn", SDPBackend.CUDNN_ATTENTION, "native"), ("flash", SDPBackend.FLASH_ATTENTION, "native")]
    if kv != H:
        tries += [("cudnn", SDPBackend.CUDNN_ATTENTION, "expanded"), ("flash", SDPBackend.FLASH_ATTENTION, "expanded")]
    why = []
    for name, backend, gqa in tries:
        q = torch.randn(1, H, seq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        nk = kv if gqa == "native" else H
        k = torch.randn(1, nk, seq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, nk, seq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        kw = dict(is_causal=True)
        if gqa == "native" and kv != H:
            kw["enable_gqa"] = True
        try:
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(q, k, v, **kw)
            o.sum().backward()
            torch.cuda.synchronize()
            return name, gqa, "; ".join(why)
        except (RuntimeError, TypeError, ValueError) as ex:
            why.append("%s/%s: %s" % (name, gqa, (str(ex).strip().splitlines() or [type(ex).__name__])[0][:160]))
    raise RuntimeError("no attention backend runs seq %d: %s" % (seq, "; ".join(why)[:300]))


class Trainer:
    """Model, fp32 main grads, fp32 master weights and the fused AdamW of one model config."""

    def __init__(self, torch, p, dev):
        self.torch, self.p, self.dev = torch, p, dev
        self.model = build_model(torch, p, dev)
        # The FP8 GEMMs' linears become step_fp8 linears; with fp8.enabled off they run F.linear, as nn.Linear does.
        self.fp8 = step_fp8.Fp8State()
        self.fp8_linears = step_fp8.wrap_model(torch, self.model, self.fp8)
        self.fp8_check = None  # (ok, text, errors) of the FP8 self-check, run before the first FP8 step
        self.params = [q for q in self.model.parameters()]
        n = sum(q.numel() for q in self.params)
        self.n_params = n
        self.main_grad = torch.zeros(n, dtype=torch.float32, device=dev)
        self.master = []
        off = 0
        for q in self.params:
            q.main_grad = self.main_grad[off:off + q.numel()].view_as(q)
            off += q.numel()
            m = q.detach().float().requires_grad_(False)
            m.grad = q.main_grad
            self.master.append(m)
            q.register_post_accumulate_grad_hook(self._accumulate)
        self.opt = torch.optim.AdamW(self.master, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)

    @staticmethod
    def _accumulate(q):
        # Megatron's main-grad accumulation (without TE's fused wgrad-into-main-grad): add, then free the bf16 grad.
        q.main_grad.add_(q.grad)
        q.grad = None

    def step(self, batches, cos, sin):
        torch = self.torch
        M = len(batches)
        self.fp8.step += 1  # the FP8 weights are cast again on this step's first micro-batch
        for ids, tgt in batches:
            loss = self.model(ids, tgt, cos, sin) / M
            loss.backward()
        last = loss.detach() * M  # the last micro-batch's loss, unscaled
        torch.nn.utils.clip_grad_norm_(self.master, 1.0, foreach=True)
        self.opt.step()
        with torch.no_grad():
            for q, m in zip(self.params, self.master):
                q.copy_(m)
        self.main_grad.zero_()
        return last


class Skip(RuntimeError):
    """A step not recorded, with the reason (a failed FP8 self-check)."""


def fp8_shapes(tr):
    """The distinct (n, k) weight shapes of the model's FP8 linears."""
    return sorted({tuple(m.weight.shape) for mods in tr.fp8_linears.values() for m in mods})


def run_step_record(torch, tr, e, dev, profile):
    """The step record of grid entry e, and its profile summary (None unless profile)."""
    p = tr.p
    seq, mb, M = e["seq"], e["micro_batch"], e["micro_batches"]
    fp8 = e["dtype"] == "fp8"
    if fp8 and tr.fp8_check is None:
        tr.fp8_check = step_fp8.self_check(torch, fp8_shapes(tr), dev)
        print("  FP8 linear self-check (relative error vs float32, worst of %d shapes): %s" % (
            len(fp8_shapes(tr)), tr.fp8_check[1]), flush=True)
    if fp8 and not tr.fp8_check[0]:
        raise Skip(tr.fp8_check[1])
    tr.fp8.enabled = fp8
    backend, gqa, why = probe_attention(torch, p, seq, dev)
    for layer in tr.model.layers:
        layer.attn.attn = (backend, gqa)
    cos, sin = rope_tables(torch, seq, p["hidden"] // p["heads"], dev)
    g = torch.Generator(device=dev)
    g.manual_seed(1234)
    batches = [(torch.randint(0, p["vocab"], (mb, seq), device=dev, generator=g),
                torch.randint(0, p["vocab"], (mb, seq), device=dev, generator=g)) for _ in range(M)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    losses = []
    for _ in range(WARMUP):
        losses.append(float(tr.step(batches, cos, sin)))
    ts = []
    for _ in range(TIMED):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = tr.step(batches, cos, sin)
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e6)
        losses.append(float(loss))
    if not all(math.isfinite(x) for x in losses):
        raise RuntimeError("loss not finite: %s" % losses)
    peak = torch.cuda.max_memory_allocated()
    prof = None
    if profile:
        try:
            prof = step_profile.profile_step(torch, lambda: tr.step(batches, cos, sin), "experts" in p)
        except (RuntimeError, OSError, ValueError) as ex:
            prof = {"error": (str(ex).strip().splitlines() or [type(ex).__name__])[0][:200]}
    flops = step_flops(e)
    t = statistics.median(ts)
    wl = workload(e)
    recipe, dtype, _, text = RECIPES[e["dtype"]]
    r = {"op": "step", "impl": "torch", "algo": "eager", "dtype": dtype, "ranks": 1, "bytes": 0,
         "time_us": t, "min_us": min(ts), "max_us": max(ts), "iters": len(ts), "stat": "median",
         "model": e["model"], "workload": wl, "layers": p["layers"], "seq": seq, "micro_batch": mb,
         "micro_batches": M, "tokens": seq * mb * M, "params": tr.n_params, "flops": flops,
         "tflops": flops / t / 1e6, "tokens_per_s": seq * mb * M / (t * 1e-6), "peak_memory_bytes": int(peak),
         "state_bytes": int(BYTES_PER_PARAM * tr.n_params), "recipe": recipe, "recipe_text": text,
         "attention_backend": backend, "gqa": gqa if p["kv"] != p["heads"] else "none", "warmup": WARMUP,
         "loss_first": losses[0], "loss_last": losses[-1], "algbw_gbs": 0.0, "busbw_gbs": 0.0,
         "timer": "synchronize+perf_counter", "tp": 1, "pp": 1, "dp": 1, "ep": 1}
    if "experts" in p:
        r["experts"], r["topk"], r["moe_gemm"] = p["experts"], p["topk"], "loop"
    if fp8:
        n8 = step_fp8.fp8_params(p)
        # The FP8 weight copy and its transpose (TE on Hopper keeps both) on top of the bf16 recipe's state.
        r["state_bytes"] += 2 * n8
        r.update(fp8_gemms=list(step_fp8.fp8_gemms(p)), fp8_params=n8, fp8_scaling="current per-tensor",
                 fp8_weight_cast="once per step", fp8_check=tr.fp8_check[1], fp8_check_errors=tr.fp8_check[2])
    if why:
        r["fallback_reason"] = why[:300]
    return r, prof


def main(argv):
    try:
        a = parse_args(argv)
    except BadInput as ex:
        sys.stderr.write("step_bench.py: %s\n" % ex)
        return 2
    grid = [e for e in build_grid(a.grid) if a.dtype in ("all", e["dtype"])
            and (a.models is None or e["model"] in a.models)]
    predicted = predict_s(grid, a.profile is not None)
    if a.list:
        for e in grid:
            print(json.dumps(dict(e, workload=workload(e), flops=step_flops(e),
                                  params=params_of(MODELS[e["model"]])), sort_keys=True))
        print("# %d steps, predicted %.0f s on an H100" % (len(grid), predicted))
        return 0
    torch, commit, rc = kb.open_gpu("step_bench.py", a.commit)
    if rc:
        return rc
    dev = torch.device("cuda", 0)
    sysb = kb.system_block(torch)
    doc = {"schema": kb.SCHEMA, "system": sysb,
           "run": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "commit": commit,
                   "command": "step_bench.py " + shlex.join(argv), "grid": a.grid, "complete": False},
           "records": []}
    pdoc = {"schema": step_profile.SCHEMA, "system": sysb, "run": doc["run"], "patterns": [
        {"class": c, "pattern": rx} for c, rx in step_profile.CLASS_PATTERNS], "profiles": []}
    print("step_bench: %s, %d SMs; torch %s, CUDA %s, cuDNN %s; %d steps (%s grid), recipes %s, predicted %.0f s" % (
        sysb["gpu"], sysb["sms"], sysb["torch"], sysb["cuda"], sysb.get("cudnn"), len(grid), a.grid,
        "/".join(sorted({RECIPES[e["dtype"]][0] for e in grid})), predicted), flush=True)
    t0 = time.time()
    skipped = []
    done_pred = 0.0
    tr, tr_name = None, None
    for i, e in enumerate(grid):
        try:
            if tr_name != e["model"]:
                tr = None
                gc.collect()
                torch.cuda.empty_cache()
                tr_name = e["model"]
                tr = Trainer(torch, MODELS[e["model"]], dev)
            r, prof = run_step_record(torch, tr, e, dev, a.profile is not None)
            doc["records"].append(r)
            print("  %-64s %10.1f ms (min %.1f, max %.1f) %6.1f TFLOP/s %9.0f tok/s peak %5.1f GiB %s/%s" % (
                label(e), r["time_us"] / 1e3, r["min_us"] / 1e3, r["max_us"] / 1e3, r["tflops"], r["tokens_per_s"],
                r["peak_memory_bytes"] / (1 << 30), r["attention_backend"], r["gqa"]), flush=True)
            if prof is not None:
                pdoc["profiles"].append(dict(prof, model=e["model"], recipe=r["recipe"], dtype=r["dtype"], seq=e["seq"],
                                             micro_batch=e["micro_batch"], micro_batches=e["micro_batches"],
                                             workload=r["workload"], timed_us=r["time_us"]))
                print(step_profile.format_summary(prof) if "error" not in prof else "    profile failed: " +
                      prof["error"], flush=True)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as ex:
            msg = (str(ex).strip().splitlines() or [type(ex).__name__])[0][:200]
            skipped.append("%s: %s" % (label(e), msg))
            print("  skip %s: %s" % (label(e), msg), flush=True)
            torch.cuda.synchronize()
            if isinstance(ex, torch.cuda.OutOfMemoryError):
                tr, tr_name = None, None
                torch.cuda.empty_cache()
        done_pred += predict_record_s(e, a.profile is not None)
        el = time.time() - t0
        print("[%d/%d steps, %.0f s elapsed, about %.0f s left]" % (
            i + 1, len(grid), el, max(0.0, el / done_pred * (predicted - done_pred))), flush=True)
        if doc["records"]:
            kb.write_file(a.out, doc)
        if pdoc["profiles"]:
            kb.write_file(a.profile, pdoc)
    el = time.time() - t0
    doc["run"]["complete"] = True
    doc["run"]["seconds"] = round(el, 1)
    if not doc["records"]:
        sys.stderr.write("step_bench.py: nothing measured (%d skipped)\n" % len(skipped))
        return 1
    kb.write_file(a.out, doc)
    if pdoc["profiles"]:
        kb.write_file(a.profile, pdoc)  # the run block is shared: complete now
    print("step_bench: %d records in %.0f s (predicted %.0f s); %d skipped -> %s%s" % (
        len(doc["records"]), el, predicted, len(skipped), a.out, (", profiles -> " + a.profile) if a.profile else ""))
    for s in skipped:
        print("  not recorded: " + s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
