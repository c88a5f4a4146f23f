"""The FP8 linear layer of step_bench.py's "te-fp8-current" recipe: Transformer Engine's FP8 GEMMs rebuilt on
torch._scaled_mm (issue 32, item 5). No torch at import: step_bench.py --list and the CPU test import this file.

Which GEMMs: every linear layer of attention, the MLP and the experts (qkv, attn-out, mlp-up, mlp-down, expert-up,
expert-down: forward, dgrad and wgrad), as the planner's fp8Gemm (models/src/workload/lowering.cpp) and Megatron-LM
with Transformer Engine; the LM head and the MoE router stay in bf16.

Per GEMM, current scaling (TE's Float8CurrentScaling): amax of the tensor now, scale = fmax / amax (e4m3: 448 for
activations and weights, e5m2: 57344 for output gradients), the GEMM gets the inverse scales as fp32 scalars.
  forward  y  = x W^T      x cast to e4m3 per micro-batch, W8 from the step's weight cast
  dgrad    dx = dy W       dy cast to e5m2 per micro-batch, W8's transpose from the step's weight cast
  wgrad    dW = dy^T x     the transposes of x8 (saved by the forward) and of dy8, from the same casts
bf16 outputs; fast accumulation in the forward only (TE splits the accumulator in dgrad and wgrad). The weights are
cast once per step, on the first micro-batch, and reused by the others (TE's is_first_microbatch); the forward saves
the FP8 transpose of x for the backward (one byte per element, not two).

Every cast is TE's pair of kernels, those kernel_bench.py measures and the planner prices (fp8_kernels.py): the
amax, then the fused cast-transpose, which reads the bf16 tensor once and writes the FP8 tensor and its transpose
(_scaled_mm wants its first operand row-major and its second column-major), the scales computed in the kernel. No
strided one-byte copy and no unfused cast remain. Row counts that are not a multiple of 16 (an expert's share of the
tokens) are zero-padded in the transposes, as the wgrad's reduction dimension must be (Megatron pads expert rows for
FP8 the same way); forward and dgrad need no padding.
"""

import fp8_kernels  # imports no torch

# Lowering names of the GEMMs that run in FP8 (lowering.cpp's fp8Gemm: all but lm-head and router).
FP8_DENSE = ("qkv", "attn-out", "mlp-up", "mlp-down")
FP8_MOE = ("qkv", "attn-out", "expert-up", "expert-down")
# Self-check bounds, relative Frobenius error against float32 on Gaussian operands. Round-to-nearest with m mantissa
# bits has an RMS relative error of about 2^-m / sqrt(12) * 0.72 per element: 2.6e-2 for e4m3 (m = 3), 5.2e-2 for
# e5m2 (m = 2). A product of two independently rounded operands errs by about the root-sum-square of theirs (the K
# terms' errors add like the terms themselves): 0.037 for e4m3 x e4m3 (forward), 0.058 for e5m2 x e4m3 (dgrad,
# wgrad); Hopper's fast accumulation adds little at K <= 16k. The bounds leave about 2x, far below what a wrong
# scale, layout or transpose gives (errors of order 1).
CHECK_TOL = {"forward": 0.1, "dgrad": 0.1, "wgrad": 0.15}


def fp8_gemms(p):
    """The lowering names of the model's FP8 GEMMs (dense or MoE, p: a step_bench MODELS entry)."""
    return FP8_MOE if "experts" in p else FP8_DENSE


def fp8_params(p):
    """Parameters whose GEMMs run in FP8 (the planner's fp8DenseParams plus the experts, one layer set)."""
    h, d = p["hidden"], p["hidden"] // p["heads"]
    attn = h * (p["heads"] + 2 * p["kv"]) * d + p["heads"] * d * h
    mlp = p["experts"] * 3 * h * p["ffn"] if "experts" in p else 3 * h * p["ffn"]
    return p["layers"] * (attn + mlp)


class Fp8State:
    """Shared by a model's FP8 linears: whether FP8 is on, and the step number (weights are cast once per step)."""

    def __init__(self):
        self.enabled = False
        self.step = 0


_CLASSES = {}


def classes(torch):
    """Fp8Linear built on this torch, once."""
    if _CLASSES:
        return _CLASSES["linear"]
    import torch.nn as nn
    import torch.nn.functional as F
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2

    def cast(x, dtype, rows_to=None):
        """(x8, x8 transposed, inverse scale) of a contiguous bf16 [r, c] tensor: TE's amax then cast-transpose."""
        x8, x8t, inv, _ = fp8_kernels.cast_transpose(torch, x, fp8_kernels.amax(torch, x), dtype, rows_to=rows_to)
        return x8, x8t, inv

    def mm(a, b, sa, sb, fast):
        r = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)
        return r[0] if isinstance(r, tuple) else r

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, w8, w8t, w_inv):
            shape = x.shape
            x8, x8t, x_inv = cast(x.reshape(-1, shape[-1]).contiguous(), e4m3)
            y = mm(x8, w8.t(), x_inv, w_inv, True)  # [T, K] x [K, N] column-major (W8 is [N, K] row-major)
            ctx.save_for_backward(x8t, x_inv, w8t, w_inv)  # x8t [K, Tp]: the wgrad's operand, one byte an element
            ctx.shape = shape
            return y.view(*shape[:-1], y.shape[-1])

        @staticmethod
        def backward(ctx, dy):
            x8t, x_inv, w8t, w_inv = ctx.saved_tensors
            dy8, dy8t, dy_inv = cast(dy.reshape(-1, dy.shape[-1]).contiguous(), e5m2)
            dx = mm(dy8, w8t.t(), dy_inv, w_inv, False)  # [T, N] x [N, K] column-major (W8t is [K, N])
            # [N, Tp] x [Tp, K] column-major: the transposed dy8 and x8, zero-padded to Tp rows of reduction.
            dw = mm(dy8t, x8t.t(), dy_inv, x_inv, False)
            return dx.view(ctx.shape), dw, None, None, None

    class Fp8Linear(nn.Module):
        """A bias-free linear layer holding the bf16 weight of the nn.Linear it replaces: FP8 while state.enabled,
        F.linear (the bf16 nn.Linear's own kernel) otherwise."""

        def __init__(self, linear, state):
            super().__init__()
            self.weight = linear.weight
            self.state = state
            self.cast_step, self.w8, self.w8t, self.w_inv = None, None, None, None

        def forward(self, x):
            if not self.state.enabled or x.numel() == 0:
                self.cast_step, self.w8, self.w8t, self.w_inv = None, None, None, None
                return F.linear(x, self.weight)
            if self.cast_step != self.state.step:
                with torch.no_grad():  # the step's weight cast and its transpose (for dgrad), on the first use
                    w = self.weight.detach()
                    self.w8, self.w8t, self.w_inv = cast(w, e4m3, rows_to=w.shape[0])
                self.cast_step = self.state.step
            return Fn.apply(x, self.weight, self.w8, self.w8t, self.w_inv)

    _CLASSES["linear"] = Fp8Linear
    return Fp8Linear


def wrap_model(torch, model, state):
    """Replace the nn.Linear of every FP8 GEMM (fp8_gemms) of step_bench's model by an Fp8Linear sharing its weight;
    returns the wrapped modules by lowering name."""
    Fp8Linear = classes(torch)
    done = {}
    for layer in model.layers:
        layer.attn.qkv = Fp8Linear(layer.attn.qkv, state)
        layer.attn.out = Fp8Linear(layer.attn.out, state)
        done.setdefault("qkv", []).append(layer.attn.qkv)
        done.setdefault("attn-out", []).append(layer.attn.out)
        moe = hasattr(layer.mlp, "experts")
        for mlp in layer.mlp.experts if moe else [layer.mlp]:
            mlp.up = Fp8Linear(mlp.up, state)
            mlp.down = Fp8Linear(mlp.down, state)
            done.setdefault("expert-up" if moe else "mlp-up", []).append(mlp.up)
            done.setdefault("expert-down" if moe else "mlp-down", []).append(mlp.down)
    return done


def self_check(torch, shapes, dev):
    """The cast-transpose kernel element-wise against the torch cast (fp8_kernels.self_check), then forward, dgrad
    and wgrad of the FP8 linear against float32 on fresh Gaussian operands, for each (n, k) weight shape at 1024 rows
    and at 1000 (the padded wgrad path). Returns (ok, summary text, worst errors by GEMM)."""
    Fp8Linear = classes(torch)
    if torch.cuda.get_device_capability(dev) < (8, 9):
        return False, "no FP8 tensor cores (compute capability %d.%d < 8.9)" % torch.cuda.get_device_capability(dev), {}
    ok, kernel_text = fp8_kernels.self_check(torch, dev)
    if not ok:
        return False, kernel_text, {}
    g = torch.Generator(device=dev)
    g.manual_seed(4321)
    worst = {"forward": 0.0, "dgrad": 0.0, "wgrad": 0.0}
    worst_bf16 = dict(worst)
    bad = []

    def rel(a, b):
        a = a.float()
        if not bool(torch.isfinite(a).all()):
            return float("inf")
        return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))

    for n, k in shapes:
        for t in (1024, 1000):
            lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=torch.bfloat16)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(n, k, device=dev, generator=g) * 0.02)
            state = Fp8State()
            state.enabled, state.step = True, 1
            mod = Fp8Linear(lin, state)
            x = torch.randn(t, k, device=dev, generator=g).to(torch.bfloat16).requires_grad_(True)
            dy = torch.randn(t, n, device=dev, generator=g).to(torch.bfloat16)
            y = mod(x)
            y.backward(dy)
            xf, wf, dyf = x.detach().float(), lin.weight.detach().float(), dy.float()
            ref = {"forward": xf @ wf.t(), "dgrad": dyf @ wf, "wgrad": dyf.t() @ xf}
            got = {"forward": y.detach(), "dgrad": x.grad, "wgrad": lin.weight.grad}
            xb, wb = x.detach(), lin.weight.detach()
            b16 = {"forward": xb @ wb.t(), "dgrad": dy @ wb, "wgrad": dy.t() @ xb}
            for name in worst:
                e, eb = rel(got[name], ref[name]), rel(b16[name], ref[name])
                worst[name] = max(worst[name], e)
                worst_bf16[name] = max(worst_bf16[name], eb)
                if not e <= CHECK_TOL[name]:
                    bad.append("%s n=%d k=%d rows=%d: %.3g > %.3g" % (name, n, k, t, e, CHECK_TOL[name]))
            del lin, mod, x, dy, y, ref, got, b16
    text = ", ".join("%s %.3f (bf16 %.4f, bound %.2f)" % (nm, worst[nm], worst_bf16[nm], CHECK_TOL[nm])
                     for nm in worst) + "; " + kernel_text
    torch.cuda.empty_cache()
    if bad:
        return False, "FP8 linear self-check failed: " + "; ".join(bad)[:240], worst
    return True, text, worst
