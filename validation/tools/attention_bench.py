#!/usr/bin/env python3
"""The PyTorch SDPA baselines of `mk-bench attention` (issue 38): forward attention, bf16, D 128, B 4, sequence S per
GPU, 16 / 16 and 32 / 8 (GQA) heads, causal and not, through cuDNN and through flash.

    /opt/torch/.venv/bin/python validation/tools/attention_bench.py --out FILE.json --commit SHA [--seq 768,1024,...]

Inputs as a user calls it: contiguous [B, H, S, D] tensors (K and V with the KV heads; GQA through enable_gqa=True,
else, when the backend refuses that, K and V expanded to H heads beforehand: the record's "gqa" says which).
Backends forced with torch.nn.attention.sdpa_kernel([CUDNN_ATTENTION]) and ([FLASH_ATTENTION]).
Timing as mk-bench attention: `warmup` calls, then `reps` loops of `iters` calls between two CUDA events; time = median
over the loops of (loop time / iters). TFLOP/s counts unmasked pairs only: 4 x B x Hq x D x pairs.
Each backend's output is checked once against float32 on the last 128 query rows of batch 0, heads 0 and H - 1.

Records: "mkernel.measurement.v1", op "attention-fwd", impl "cudnn" or "torch" (flash), as mk-bench attention's.
Exit codes: 0 ok, 1 a check failed, 2 bad input, 3 no GPU / no PyTorch.
"""
import argparse
import math
import sys

from torch_bench_util import median_us, nvidia_driver, write_measurements


def pairs(s, causal):
    return s * (s + 1) // 2 if causal else s * s


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--seq", default="768,1024,2048,4096,8192,16384")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args(argv)
    try:
        seqs = [int(x) for x in a.seq.split(",")]
        assert all(x > 0 for x in seqs) and a.batch > 0 and a.iters > 0 and a.reps > 0
    except (ValueError, AssertionError):
        sys.stderr.write("attention_bench.py: --seq is a comma list of positive lengths; counts > 0\n")
        return 2
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as ex:
        sys.stderr.write("attention_bench.py: needs PyTorch (%s)\n" % ex)
        return 3
    if not torch.cuda.is_available():
        sys.stderr.write("attention_bench.py: no CUDA GPU visible to PyTorch\n")
        return 3
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)
    d, bsz = 128, a.batch
    configs = [(16, 16, False), (16, 16, True), (32, 8, False), (32, 8, True)]
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
    records, ok = [], True
    print("# attention_bench.py: %s (%d SMs), torch %s, cuDNN %s, B %d, D %d, iters %d, reps %d" %
          (props.name, props.multi_processor_count, torch.__version__, torch.backends.cudnn.version(), bsz, d,
           a.iters, a.reps))
    print("%6s %4s %4s %6s %6s %9s %12s %10s %9s" % ("S", "hq", "hkv", "causal", "impl", "gqa", "us", "TFLOPs",
                                                   "rel_err"))
    for s in seqs:
        for hq, hkv, causal in configs:
            q = torch.empty(bsz, hq, s, d, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
            k = torch.empty(bsz, hkv, s, d, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
            v = torch.empty(bsz, hkv, s, d, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
            flops = 4.0 * bsz * hq * d * pairs(s, causal)
            for name, backend in backends:
                modes = ["native"] if hq == hkv else ["native", "expanded"]
                for gqa in modes:
                    kk, vv, kw = k, v, dict(is_causal=causal)
                    if hq != hkv and gqa == "native":
                        kw["enable_gqa"] = True
                    if gqa == "expanded":
                        kk = k.repeat_interleave(hq // hkv, dim=1).contiguous()
                        vv = v.repeat_interleave(hq // hkv, dim=1).contiguous()

                    def fwd():
                        with sdpa_kernel([backend]):
                            return F.scaled_dot_product_attention(q, kk, vv, **kw)

                    try:
                        out = fwd()
                        torch.cuda.synchronize()
                    except (RuntimeError, TypeError, ValueError) as ex:
                        print("# %s %s S %d hq %d hkv %d causal %s refused: %s" %
                              (name, gqa, s, hq, hkv, causal, str(ex).strip().splitlines()[0][:160]))
                        continue
                    rows, errs = min(128, s), []
                    for h in (0, hq - 1):
                        g = h // (hq // hkv)
                        sc = (q[0, h, s - rows:].float() @ k[0, g].float().t()) / math.sqrt(d)
                        if causal:
                            pq = torch.arange(s - rows, s, device=dev).unsqueeze(1)
                            pk = torch.arange(s, device=dev).unsqueeze(0)
                            sc = sc.masked_fill(pk > pq, float("-inf"))
                        ref = torch.softmax(sc, dim=-1) @ v[0, g].float()
                        got = out[0, h, s - rows:].float()
                        errs.append(((got - ref).norm() / ref.norm()).item())
                    err = max(errs)
                    good = err <= 2e-2
                    ok = ok and good
                    us = median_us(torch, fwd, a.warmup, a.reps, a.iters)
                    tflops = flops / us * 1e-6
                    print("%6d %4d %4d %6s %6s %9s %12.2f %10.1f %9.2e%s" %
                          (s, hq, hkv, "yes" if causal else "no", name, gqa if hq != hkv else "none", us, tflops, err,
                           "" if good else " CHECK FAILED"))
                    sys.stdout.flush()
                    nbytes = (q.numel() + k.numel() + v.numel() + out.numel()) * 2
                    records.append(dict(op="attention-fwd", impl="cudnn" if name == "cudnn" else "torch",
                                        algo="sdpa-" + name, dtype="bfloat16", ranks=1, bytes=nbytes, time_us=us,
                                        algbw_gbs=nbytes / us * 1e-3, busbw_gbs=0.0, iters=a.iters, stat="median",
                                        batch=bsz, seq=s, q_heads=hq, kv_heads=hkv, head_dim=d, causal=causal,
                                        sms=props.multi_processor_count, flops=int(flops), tflops=round(tflops, 3),
                                        backend=name, gqa=gqa if hq != hkv else "none", rel_err=err, check=good))
                    break  # native ran: the expanded fallback is not needed
    system = {"gpu": props.name, "gpus": 1, "driver": nvidia_driver(), "torch": torch.__version__,
              "cudnn": str(torch.backends.cudnn.version()), "cuda": torch.version.cuda}
    write_measurements(a.out, system, a.commit, "attention_bench.py " + " ".join(argv), records)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
