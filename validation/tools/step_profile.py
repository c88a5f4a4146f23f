"""step_bench.py --profile: where one training step's GPU time goes, by the planner's kernel classes (issue 32).

One extra step per record, after the timed ones and not counted in them, runs under torch.profiler with CUDA
activities only; its Chrome trace gives every GPU kernel, memcpy and memset with start and duration. The summary:
the step's wall time (synchronize + perf_counter, profiler overhead included), the sum of kernel times, the busy
time (the union of the kernels' intervals), the GPU idle time (wall - busy), and the kernel time grouped into the
classes of the planner's census (mk-plan --emit-kernels) by the kernel-name patterns of CLASS_PATTERNS, first match
wins, with the ten largest unmatched kernel names listed so that nothing hides.

Names cannot separate every kernel: PyTorch's generic elementwise multiply and add serve the residual adds, rotary's
products, SwiGLU's product, the FP8 scaling and the MoE weighting alike ("residual/elementwise"); torch.cat serves
rotary and the MoE's concatenation of expert outputs; index_select and sorting serve the embedding and the MoE
permutation (in a dense model they are the embedding's). Pure Python except profile_step: the CPU test feeds
summarize() a synthetic trace.
"""
import json
import os
import re
import tempfile
import time

SCHEMA = "mkernel.step-profile.v1"
# (class, pattern) in match order. Classes are the census's (validation/tools/kernel_bench.py CLASSES) plus
# "fp8-transpose", "copy/other" (copies, fills, memcpy / memset; the unmatched are counted there too) and
# "residual/elementwise" for the generic elementwise kernels, which names cannot place (copies first: they run as
# elementwise kernels).
CLASS_PATTERNS = (
    ("attention", r"sdpa|fmha|flash_fwd|flash_bwd|flash_attn|attention|cudnn::fusion"),  # + cuDNN's bprop helpers
    ("gemm", r"gemm|nvjet|cutlass|xmma|splitKreduce|gemv"),
    ("optimizer", r"[Aa]dam"),
    ("grad-norm", r"LpNorm|lpnorm|NormTwoOps|multi_tensor_apply"),
    # amax (vector_norm inf), fp8_kernels' cast-transpose (the Triton kernel's name), a torch fp8 conversion
    ("cast", r"NormInfOps|AbsMaxOps|cast_transpose|[Ff]loat8"),
    ("norm", r"rms_?norm|RmsNorm|RMSNorm|layer_?norm|LayerNorm|GammaBeta|RowwiseMoments|ComputeInvStd"),
    ("activation", r"silu|SiLU|Silu|gelu|GeLU|Gelu"),
    ("loss", r"LogSoftMax|log_softmax|SoftMaxForward|SoftMaxBackward|nll_loss|cross_entropy"),
    ("router", r"softmax_warp|[Tt]op[Kk]|Histogram|bincount|MinNanFunctor<long|MaxNanFunctor<long"),  # bincount
    ("embedding", r"[Ee]mbedding|krn_partials|compute_grad_weight|sum_and_scatter|partial_segment"),
    ("permute", r"indexSelect|index_select|gather_kernel|indexFunc|index_add|indexing_backward|[Rr]adix|[Ss]ort"),
    ("rotary", r"CatArray|neg_kernel"),
    # One-byte transposes (strided copies through uint8 views), which TE's cast-transpose fuses and the planner does
    # not price: their own class, so that a reference paying them shows it (step_fp8.py pays none).
    ("fp8-transpose", r"copy_kernel.*unsigned char"),
    ("copy/other", r"copy_kernel|Memcpy|Memset|[Ff]ill"),
    ("residual/elementwise", r"elementwise_kernel|[Ff]unctor_add|[Ff]unctor_mul|AddFunctor|MulFunctor"),
)
CLASSES = tuple(c for c, _ in CLASS_PATTERNS)
_COMPILED = tuple((c, re.compile(p)) for c, p in CLASS_PATTERNS)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
TOP_UNMATCHED = 10


def classify(name, moe):
    """The class of a kernel name, or None. In a dense model the router / permute matches are the embedding's."""
    for cls, rx in _COMPILED:
        if rx.search(name):
            if not moe and cls in ("router", "permute"):
                return "embedding"
            return cls
    return None


def gpu_events(trace):
    """(name, start_us, dur_us) of every GPU kernel, memcpy and memset of a Chrome trace object."""
    evs = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    out = []
    for e in evs:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS and "dur" in e:
            out.append((str(e.get("name", "?")), float(e["ts"]), float(e["dur"])))
    return out


def busy_us(events):
    """The length of the union of the events' intervals."""
    total, end = 0.0, None
    for _, s, d in sorted(events, key=lambda x: x[1]):
        if end is None or s > end:
            total += d
            end = s + d
        elif s + d > end:
            total += s + d - end
            end = s + d
    return total


def summarize(events, wall_us, moe):
    """The profile summary of one step from its GPU events and its wall time."""
    classes = {c: {"time_us": 0.0, "count": 0} for c in CLASSES}
    unmatched = {}
    for name, _, d in events:
        c = classify(name, moe)
        if c is None:
            u = unmatched.setdefault(name[:200], [0.0, 0])
            u[0] += d
            u[1] += 1
            c = "copy/other"
        classes[c]["time_us"] += d
        classes[c]["count"] += 1
    ksum = sum(d for _, _, d in events)
    busy = busy_us(events)
    for v in classes.values():
        v["share"] = v["time_us"] / ksum if ksum > 0 else 0.0
    top = sorted(unmatched.items(), key=lambda kv: -kv[1][0])[:TOP_UNMATCHED]
    span = (max(s + d for _, s, d in events) - min(s for _, s, _ in events)) if events else 0.0
    return {"wall_us": wall_us, "kernel_sum_us": ksum, "busy_us": busy, "idle_us": max(0.0, wall_us - busy),
            "span_us": span, "kernels": len(events), "classes": classes,
            "unmatched_us": sum(v[0] for v in unmatched.values()),
            "unmatched_top": [{"name": n, "time_us": v[0], "count": v[1]} for n, v in top]}


def format_summary(s):
    """Two lines for the log: the totals, then the classes by time."""
    parts = ["%s %.1f" % (c, v["time_us"] / 1e3) for c, v in sorted(s["classes"].items(), key=lambda kv: -kv[1][
        "time_us"]) if v["count"]]
    return ("    profile: wall %.1f ms, kernels %.1f ms (busy %.1f, idle %.1f), %d kernels, unmatched %.2f ms\n"
            "    by class (ms): %s" % (s["wall_us"] / 1e3, s["kernel_sum_us"] / 1e3, s["busy_us"] / 1e3,
                                      s["idle_us"] / 1e3, s["kernels"], s["unmatched_us"] / 1e3, ", ".join(parts)))


def profile_step(torch, step_fn, moe):
    """Run step_fn once under torch.profiler (CUDA activities) and summarize it."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step_fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e6
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    return summarize(gpu_events(trace), wall, moe)
