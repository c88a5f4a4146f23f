#!/usr/bin/env python3
"""The FP8 kernels Transformer Engine runs around its FP8 GEMMs, for the reference step and the kernel bench
(issue 32, item 5): per cast one amax kernel and one fused cast-transpose kernel, the two kernels the planner prices
per cast (models/src/workload/lowering.cpp, addCast: "amax" then "cast-fp8").

    /opt/torch/.venv/bin/python validation/tools/fp8_kernels.py     (GPU: element-wise check, then a timing)

No torch or triton at import: step_bench.py --list and the CPU tests import this file through step_fp8.py and
kernel_bench.py; Triton is imported on the first cast.

  amax            TE's current-scaling amax (nvte_compute_amax): torch.linalg.vector_norm(x, inf), one read of the
                  bf16 tensor (a Triton reduction is no faster: the read is the cost).
  cast_transpose  TE's cast-transpose (nvte_cast_transpose, with the scale computed from the amax as
                  Float8CurrentScaling does): one read of a contiguous bf16 [r, c] tensor, tile by tile, each tile
                  stored twice, as the row-major fp8 [r, c] and as its transpose [c, r_pad] (the Hopper FP8 GEMMs
                  want both: _scaled_mm takes its first operand row-major and its second column-major). r_pad is r
                  rounded up to 16 with zero columns, the alignment _scaled_mm needs in the reduction dimension of
                  the weight-gradient GEMM. Saturating cast as TE's: x * scale clamped to +-fmax, then converted
                  with round-to-nearest-even. The scale (fmax / amax, IEEE division) and its inverse (the GEMM's
                  dequantisation scale) are written by the kernel itself: no scalar kernels between amax and cast.
"""

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
PAD = 16  # _scaled_mm's alignment of the reduction dimension
AMAX_FLOOR = 1e-12  # an all-zero tensor gets a finite scale (a literal in the kernel: Triton takes no globals)
# Tile of the cast-transpose: 64 B of fp8 per row segment in both stores, 16 KiB of bf16 loaded per program.
BLOCK_R, BLOCK_C, WARPS = 64, 128, 4

KERNEL_NAME = "fp8_cast_transpose_kernel"  # the Triton function's name, the one profiles show (step_profile.py)
triton = tl = None  # imported on the first cast (no triton on CPU-only machines)
_KERNEL = {}


def padded_rows(r):
    """r rounded up to PAD."""
    return -(-r // PAD) * PAD


def fmax_of(torch, dtype):
    """The largest finite value of an FP8 dtype (e4m3fn 448, e5m2 57344)."""
    return {torch.float8_e4m3fn: E4M3_MAX, torch.float8_e5m2: E5M2_MAX}[dtype]


def _kernel():
    global triton, tl
    if _KERNEL:
        return _KERNEL["cast_transpose"]
    import triton
    import triton.language as tl

    @triton.jit
    def fp8_cast_transpose_kernel(x_ptr, amax_ptr, out_ptr, out_t_ptr, scale_ptr, inv_ptr, rows, cols, rows_to,
                                  fmax, TRANSPOSE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
        scale = tl.math.div_rn(fmax, tl.maximum(tl.load(amax_ptr).to(tl.float32), 1e-12))  # AMAX_FLOOR
        if (pid_r == 0) & (pid_c == 0):
            tl.store(scale_ptr, scale)
            tl.store(inv_ptr, tl.math.div_rn(1.0, scale))
        r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        inside = (r < rows)[:, None] & (c < cols)[None, :]
        x = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=inside, other=0.0)
        y = tl.clamp(x.to(tl.float32) * scale, -fmax, fmax)
        y = y.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        tl.store(out_ptr + r[:, None] * cols + c[None, :], y, mask=inside)
        if TRANSPOSE:  # rows past `rows` loaded as 0: the zero padding of the transpose
            inside_t = (r < rows_to)[:, None] & (c < cols)[None, :]
            tl.store(out_t_ptr + c[None, :] * rows_to + r[:, None], y, mask=inside_t)

    _KERNEL["cast_transpose"] = fp8_cast_transpose_kernel
    return fp8_cast_transpose_kernel


def amax(torch, x):
    """TE's amax kernel: max |x| of a bf16 tensor as a 0-dim bf16 tensor on the device (no host synchronisation)."""
    return torch.linalg.vector_norm(x, float("inf"))


def cast_transpose(torch, x, amax_t, dtype, transpose=True, rows_to=None):
    """TE's cast-transpose with current scaling: x (contiguous bf16 [r, c]) and its amax (a device scalar) ->
    (x8 [r, c], x8t [c, rows_to] or None, inverse scale, scale), fp8 of `dtype`, the scales 0-dim fp32 tensors.
    rows_to: the transpose's row count, at least r (default: r rounded up to 16, zero columns past r)."""
    r, c = x.shape
    rows_to = padded_rows(r) if rows_to is None else rows_to
    if x.dtype != torch.bfloat16 or not x.is_contiguous() or rows_to < r or c * max(r, rows_to) >= 2 ** 31:
        raise ValueError("cast_transpose: expected a contiguous bf16 [r, c] tensor below 2^31 elements, rows_to >= "
                         "r; got %s %s contiguous=%s rows_to=%d" % (x.dtype, tuple(x.shape), x.is_contiguous(),
                                                                   rows_to))
    x8 = torch.empty(r, c, dtype=dtype, device=x.device)
    x8t = torch.empty(c, rows_to, dtype=dtype, device=x.device) if transpose else None
    scale = torch.empty((), dtype=torch.float32, device=x.device)
    inv = torch.empty((), dtype=torch.float32, device=x.device)
    grid = (-(-(rows_to if transpose else r) // BLOCK_R), -(-c // BLOCK_C))
    _kernel()[grid](x, amax_t, x8, x8t if transpose else x8, scale, inv, r, c, rows_to, fmax_of(torch, dtype),
                    TRANSPOSE=transpose, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, num_warps=WARPS)
    return x8, x8t, inv, scale


def reference_cast(torch, x, scale, dtype):
    """PyTorch's unfused equivalent of the cast for a given scale: fp32 multiply, clamp to +-fmax, conversion."""
    f = fmax_of(torch, dtype)
    return (x.float() * scale).clamp(-f, f).to(dtype)


def compare(torch, x, dtype, rows_to=None):
    """Element-wise check of cast_transpose on x against amax + reference_cast: the scale is fmax / amax (IEEE
    division), the fp8 values bit-exact for that scale, the transpose exactly the transpose with zero padding.
    Returns None when all hold, else what differs (one line)."""
    a = amax(torch, x)
    x8, x8t, inv, scale = cast_transpose(torch, x, a, dtype, rows_to=rows_to)
    r, c = x.shape
    want_scale = torch.full((), fmax_of(torch, dtype), dtype=torch.float32, device=x.device).div(
        a.float().clamp_min(AMAX_FLOOR))
    what = "%s %dx%d -> %s" % (str(dtype).replace("torch.", ""), r, c, tuple(x8t.shape))
    if float(scale) != float(want_scale):
        return "%s: scale %.9g, expected fmax / amax = %.9g" % (what, float(scale), float(want_scale))
    if abs(float(inv) * float(scale) - 1.0) > 2.4e-7:
        return "%s: inverse scale %.9g is not 1 / %.9g" % (what, float(inv), float(scale))
    u, ref = x8.view(torch.uint8), reference_cast(torch, x, scale, dtype).view(torch.uint8)
    bad = int((u != ref).sum())
    if bad:
        return "%s: %d of %d fp8 values differ from the torch cast" % (what, bad, u.numel())
    ut = x8t.view(torch.uint8)
    if not bool(torch.equal(ut[:, :r], u.t())) or bool(ut[:, r:].any()):
        return "%s: the transpose is not x8's transpose with zero padding" % what
    return None


CHECK_SHAPES = ((1000, 1024), (2048, 4096), (24, 3000), (100, 127))


def self_check(torch, dev, shapes=CHECK_SHAPES):
    """compare() on Gaussian tensors (with exact zeros, and values spread over the fp8 range down to subnormals) for
    e4m3 and e5m2 at each shape, and on an all-zero tensor. Returns (ok, one line)."""
    g = torch.Generator(device=dev)
    g.manual_seed(8765)
    n = 0
    for r, c in shapes:
        x = torch.randn(r, c, device=dev, generator=g) * torch.exp2(torch.randint(-12, 4, (r, c), device=dev,
                                                                                   generator=g).float())
        x[::7, ::5] = 0.0
        for x_, dtype in ((x, torch.float8_e4m3fn), (x, torch.float8_e5m2), (x * 0.0, torch.float8_e4m3fn)):
            why = compare(torch, x_.to(torch.bfloat16).contiguous(), dtype)
            if why:
                return False, "FP8 cast-transpose check failed: " + why
            n += 1
    return True, "cast-transpose bit-exact against the torch cast (%d tensors, e4m3 and e5m2, padded)" % n


def main():
    import torch
    dev = torch.device("cuda", 0)
    ok, text = self_check(torch, dev)
    print(text, flush=True)
    if not ok:
        return 1
    # GB/s of the fused kernel and of the unfused torch cast + strided transpose it replaces.
    for r, c in ((8192, 4096), (8192, 14336), (4096, 4096)):
        x = torch.randn(r, c, device=dev).to(torch.bfloat16)
        a = amax(torch, x)
        s = torch.full((), 448.0, device=dev) / a.float()

        def unfused():
            x8 = (x * s).to(torch.float8_e4m3fn)
            return x8.view(torch.uint8).t().contiguous()

        row = []
        for name, fn, nbytes in (("amax", lambda: amax(torch, x), 2), ("cast-transpose", lambda: cast_transpose(
                torch, x, a, torch.float8_e4m3fn), 4), ("torch mul+to+transpose", unfused, 4)):
            for _ in range(3):
                fn()
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ev[0].record()
            for _ in range(20):
                fn()
            ev[1].record()
            torch.cuda.synchronize()
            us = ev[0].elapsed_time(ev[1]) * 1e3 / 20
            row.append("%s %.1f us (%.0f GB/s)" % (name, us, nbytes * r * c / us / 1e3))
        print("  %dx%d: %s" % (r, c, ", ".join(row)), flush=True)
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
