#!/usr/bin/env python3
"""The PyTorch / cuBLAS baseline of `mk-bench grouped-gemm` (issue 39): a MoE layer's expert GEMMs, bf16, hidden H
7168, intermediate F 2048, 32 local experts (256 over 8 ranks), top-8, T tokens over the ranks (= rows this GPU gets).

    /opt/torch/.venv/bin/python validation/tools/grouped_gemm_bench.py --out FILE.json --commit SHA [--tokens 8192,...]

Same shapes, routings and timing as mk-bench grouped-gemm: GEMM "up" (K = H, N = 2F) and "down" (K = F, N = H);
routing "balanced" (T / E rows per expert, the remainder to the first experts) or "skewed" (expert e's share
proportional to 1 / (e + 1)); rows packed in expert order; weights per expert stored as N x K (nn.Linear's layout),
passed as the [E, K, N] view. The grouped GEMM is torch._grouped_mm (one cuBLAS / CUTLASS grouped kernel, PyTorch
>= 2.8) when this PyTorch has it and accepts the shapes, else a loop of torch.mm per expert (cuBLAS): the record's
"impl" says which ("torch-grouped-mm" or "cublas-loop") and "torch" the version. For "up" a second record times the
unfused SwiGLU after it (silu(x[:, 0::2]) * x[:, 1::2], algo "...+swiglu"), which mkernel fuses into its epilogue.
Timing: `warmup` calls, then `reps` loops of `iters` calls between two CUDA events; time = median over the loops of
(loop time / iters). FLOPs = 2 x T x N x K. Each result is checked once against float32 on the first and last row
of every expert (relative error of the rows <= 2e-2).

Records: "mkernel.measurement.v1", op "grouped-gemm", as mk-bench grouped-gemm's.
Exit codes: 0 ok, 1 a check failed, 2 bad input, 3 no GPU / no PyTorch.
"""
import argparse
import math
import sys

from torch_bench_util import median_us, nvidia_driver, write_measurements


def route_counts(tokens, experts, routing):
    """Rows per expert summing to `tokens`, exactly as mk-bench grouped-gemm's routeCounts."""
    w = [1.0 / (e + 1) if routing == "skewed" else 1.0 for e in range(experts)]
    total = 0.0
    for x in w:
        total += x
    counts = [int(math.floor(float(tokens) * x / total)) for x in w]
    given, e = sum(counts), 0
    while given < tokens:
        counts[e] += 1
        given += 1
        e = (e + 1) % experts
    return counts


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--tokens", default="8192,16384,32768,65536,131072")
    ap.add_argument("--routing", default="balanced,skewed")
    ap.add_argument("--local-experts", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--impl", default="auto", choices=["auto", "grouped-mm", "loop"],
                    help="auto: torch._grouped_mm when it runs, else the torch.mm loop")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args(argv)
    try:
        tokens_list = [int(x) for x in a.tokens.split(",")]
        routings = a.routing.split(",")
        assert all(t > 0 for t in tokens_list) and all(r in ("balanced", "skewed") for r in routings)
        assert a.local_experts > 0 and a.hidden > 0 and a.intermediate > 0
        assert a.iters > 0 and a.reps > 0 and a.warmup >= 0
    except (ValueError, AssertionError):
        sys.stderr.write("grouped_gemm_bench.py: --tokens is a comma list of positive counts, --routing of "
                         "balanced / skewed; sizes and counts > 0\n")
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as ex:
        sys.stderr.write("grouped_gemm_bench.py: needs PyTorch (%s)\n" % ex)
        return 3
    if not torch.cuda.is_available():
        sys.stderr.write("grouped_gemm_bench.py: no CUDA GPU visible to PyTorch\n")
        return 3
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)
    experts, h, f = a.local_experts, a.hidden, a.intermediate
    has_grouped = hasattr(torch, "_grouped_mm")
    print("# grouped_gemm_bench.py: %s (%d SMs), torch %s (CUDA %s), torch._grouped_mm %s, H %d, F %d, %d experts, "
          "iters %d, reps %d" % (props.name, props.multi_processor_count, torch.__version__, torch.version.cuda,
                                 "present" if has_grouped else "absent", h, f, experts, a.iters, a.reps))
    print("%8s %9s %5s %17s %9s %9s %12s %10s %9s" % ("tokens", "routing", "gemm", "impl", "min_rows", "max_rows",
                                                     "us", "TFLOPs", "rel_err"))
    records, ok = [], True
    max_tokens = max(tokens_list)
    for gemm, n, k, swiglu in (("up", 2 * f, h, True), ("down", h, f, False)):
        a_all = torch.empty(max_tokens, k, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
        w = torch.empty(experts, n, k, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)  # nn.Linear: N x K
        wt = w.transpose(1, 2)  # [E, K, N] view, column-major per expert
        for tokens in tokens_list:
            for routing in routings:
                counts = route_counts(tokens, experts, routing)
                ends = []
                acc = 0
                for c in counts:
                    acc += c
                    ends.append(acc)
                x = a_all[:tokens]
                offs = torch.tensor(ends, device=dev, dtype=torch.int32)

                def loop():
                    out = torch.empty(tokens, n, device=dev, dtype=torch.bfloat16)
                    start = 0
                    for e, c in enumerate(counts):
                        if c:
                            torch.mm(x[start:start + c], wt[e], out=out[start:start + c])
                        start += c
                    return out

                def grouped():
                    return torch._grouped_mm(x, wt, offs=offs)

                impl, fn, note = "cublas-loop", loop, ""
                if a.impl != "loop" and has_grouped:
                    try:
                        grouped()
                        torch.cuda.synchronize()
                        impl, fn = "torch-grouped-mm", grouped
                    except (RuntimeError, TypeError, ValueError) as ex:
                        note = str(ex).strip().splitlines()[0][:160]
                        print("# torch._grouped_mm refused %s T %d: %s" % (gemm, tokens, note))
                        if a.impl == "grouped-mm":
                            return 1
                out = fn()
                torch.cuda.synchronize()
                errs, start = [], 0
                for e, c in enumerate(counts):
                    for r in sorted({start, start + c - 1}) if c else []:
                        ref = x[r:r + 1].float() @ wt[e].float()
                        errs.append(((out[r:r + 1].float() - ref).norm() / ref.norm()).item())
                    start += c
                err = max(errs) if errs else 0.0
                good = err <= 2e-2
                ok = ok and good
                flops = 2.0 * tokens * n * k
                variants = [("", fn)]
                if swiglu:
                    variants.append(("+swiglu", lambda: (lambda y: F.silu(y[:, 0::2]) * y[:, 1::2])(fn())))
                for suffix, call in variants:
                    us = median_us(torch, call, a.warmup, a.reps, a.iters)
                    tflops = flops / us * 1e-6
                    print("%8d %9s %5s %17s %9d %9d %12.2f %10.1f %9.2e%s" %
                          (tokens, routing, gemm + suffix, impl, min(counts), max(counts), us, tflops, err,
                           "" if good else " CHECK FAILED"))
                    sys.stdout.flush()
                    out_cols = n // 2 if suffix else n
                    nbytes = (tokens * k + experts * n * k + tokens * out_cols) * 2
                    records.append(dict(op="grouped-gemm", impl=impl, algo=impl + suffix, dtype="bfloat16", ranks=1,
                                        bytes=nbytes, time_us=us, algbw_gbs=nbytes / us * 1e-3, busbw_gbs=0.0,
                                        iters=a.iters, stat="median", gemm=gemm, tokens=tokens, routing=routing,
                                        experts=experts, n=n, k=k, swiglu=bool(suffix), layout_b="col",
                                        row_layout="packed", min_rows=min(counts), max_rows=max(counts),
                                        sms=props.multi_processor_count, flops=int(flops), tflops=round(tflops, 3),
                                        rel_err=err, check=good, grouped_mm_refused=note))
        del a_all, w, wt
        torch.cuda.empty_cache()
    system = {"gpu": props.name, "gpus": 1, "driver": nvidia_driver(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "grouped_mm": has_grouped}
    write_measurements(a.out, system, a.commit, "grouped_gemm_bench.py " + " ".join(argv), records)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
