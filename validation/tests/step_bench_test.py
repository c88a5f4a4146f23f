#!/usr/bin/env python3
"""The pure-Python parts of step_bench.py, step_fp8.py and step_profile.py, without torch or a GPU (issue 32, item 5):
the grid's bf16 and FP8 steps and their workloads, the run-time predictor's budget, the FP8 GEMMs against the
planner's census (mk-plan --emit-kernels, when its path is given) and the profile summary on a synthetic trace.

    step_bench_test.py WORKDIR [MK-PLAN]      prints 'N passed, N failed'; exit 1 on a failure
"""
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tools"))
import step_bench as sb  # noqa: E402
import fp8_kernels  # noqa: E402
import step_fp8  # noqa: E402
import step_profile as sp  # noqa: E402

passed, failed = 0, 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s %s" % (name, detail))


def test_no_torch():
    check("the tools import without torch or triton", "torch" not in sys.modules and "triton" not in sys.modules)


def test_fp8_kernels():
    check("cast-transpose pads the transpose's rows to 16", [fp8_kernels.padded_rows(r) for r in (1, 16, 1000, 1024)]
          == [16, 16, 1008, 1024])


def test_grid():
    full = sb.build_grid("full")
    by = {}
    for e in full:
        by.setdefault(e["dtype"], []).append(e)
    check("full grid: bf16 and fp8 steps", set(by) == {"bfloat16", "fp8"}, sorted(by))
    for dt, es in by.items():
        moe = {"experts" in sb.MODELS[e["model"]] for e in es}
        check("full grid: dense and MoE steps in %s" % dt, moe == {True, False})
    bf = {(e["model"], e["seq"], e["micro_batch"], e["micro_batches"]) for e in by["bfloat16"]}
    for e in by.get("fp8", []):
        check("fp8 step is also a bf16 step", (e["model"], e["seq"], e["micro_batch"], e["micro_batches"]) in bf, e)
    models = [e["model"] for e in full]
    check("one block of steps per model (one build each)", models == sorted(models, key=models.index))
    for e in full + sb.build_grid("quick"):
        t = sb.workload(e)["training"]
        want = "fp8" if e["dtype"] == "fp8" else "bfloat16"
        check("workload dtype of %s" % sb.label(e), t["dtype"] == want, t)
        check("workload gradAccumFusion off (the hook adds)", t.get("gradAccumFusion") is False, t)
    quick = sb.build_grid("quick")
    check("quick grid: bf16 and fp8, dense and MoE", {(e["dtype"], "experts" in sb.MODELS[e["model"]]) for e in
                                                       quick} == {("bfloat16", False), ("bfloat16", True),
                                                                  ("fp8", False), ("fp8", True)})
    check("labels name the recipe", "te-fp8-current" in sb.label(by["fp8"][0]))


def test_predictor():
    full = sb.build_grid("full")
    t, tp = sb.predict_s(full), sb.predict_s(full, True)
    check("full grid predicted within 4 minutes", t <= 240, t)
    check("full grid with --profile predicted within 5 minutes", tp <= 300, tp)
    check("--profile costs time", tp > t)
    e = dict(full[0], dtype="bfloat16")
    f = dict(e, dtype="fp8")
    check("an FP8 step is predicted faster than bf16 (GEMM-bound llama3-8b)", sb.predict_step_s(f) <
          sb.predict_step_s(e), (sb.predict_step_s(f), sb.predict_step_s(e)))
    check("fp8 FLOPs are a part of the step's", 0 < sb.fp8_gemm_flops(f) < sb.step_flops(f))
    check("no fp8 FLOPs in bf16", sb.fp8_gemm_flops(e) == 0)


def test_census(workdir, mkplan):
    """The FP8 GEMMs step_fp8 wraps are the ones the planner prices in FP8, and their weights are the cast ones."""
    for model in ("tiny-dense", "tiny-moe"):
        p = sb.MODELS[model]
        e = dict(model=model, seq=512, micro_batch=1, micro_batches=2, dtype="fp8")
        wl, out = os.path.join(workdir, model + ".fp8.json"), os.path.join(workdir, model + ".census.json")
        json.dump(sb.workload(e), open(wl, "w"))
        r = subprocess.run([mkplan, "--workload", wl, "--cluster", "dgx-h100", "--gpus", "1", "--measured", "none",
                            "--cache", "none", "--emit-kernels", out], capture_output=True, text=True)
        check("mk-plan plans the fp8 workload of %s" % model, r.returncode == 0, r.stderr.strip()[-300:])
        if r.returncode:
            continue
        kernels = [k for s in json.load(open(out))["scales"][0]["stages"] for k in s["kernels"]]
        fp8 = {k["name"].split(".")[0] for k in kernels if k["class"] == "gemm" and k["dtype"] == "float8_e4m3"}
        bf16 = {k["name"].split(".")[0] for k in kernels if k["class"] == "gemm" and k["dtype"] != "float8_e4m3"}
        check("%s: FP8 GEMMs as the census" % model, fp8 == set(step_fp8.fp8_gemms(p)), (fp8, step_fp8.fp8_gemms(p)))
        check("%s: bf16 GEMMs are the head and router" % model, bf16 == ({"lm-head", "router"} if "experts" in p
                                                                        else {"lm-head"}), bf16)
        casts = sum(k["elements"] * k["times"] for k in kernels if k["name"].endswith(".weight.cast"))
        check("%s: FP8 parameters as the census's weight casts" % model, casts == step_fp8.fp8_params(p),
              (casts, step_fp8.fp8_params(p)))


GEMM = "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT"
SDPA = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0"
ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::"
        "ADAM_MODE)1, false>, bool, float*>")
AMAX = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::NormInfOps<float>>>"
CAST = "void at::native::float8_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(c10::Float8_e4m3fn)#1}"
UCOPY = ("void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
         "::{lambda(unsigned char)#1}>")
MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::binary_internal::MulFunctor<float>>"
GATHER = "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)"
AMAX2 = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::AbsMaxOps<c10::"
         "BFloat16, float, c10::BFloat16>, unsigned int, c10::BFloat16, 4, 4> >(at::native::ReduceOp<c10::BFloat16")
DOTDO = "void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*, void const*, void*, void*)"


def test_profile():
    check("classify gemm", sp.classify(GEMM, False) == "gemm")
    check("classify attention before gemm", sp.classify(SDPA, False) == "attention")
    check("classify fused adam before the multi-tensor grad norm", sp.classify(ADAM, False) == "optimizer")
    check("classify amax as cast", sp.classify(AMAX, False) == "cast")
    check("classify amax (AbsMaxOps) as cast", sp.classify(AMAX2, False) == "cast")
    check("classify cuDNN's attention-backward helper as attention", sp.classify(DOTDO, False) == "attention")
    check("classify the fp8 conversion as cast", sp.classify(CAST, False) == "cast")
    src = open(os.path.join(here, "..", "tools", "fp8_kernels.py")).read()
    check("fp8_kernels' cast-transpose kernel carries the name the profile matches",
          "def %s(" % fp8_kernels.KERNEL_NAME in src)
    check("classify the Triton cast-transpose as cast", sp.classify(fp8_kernels.KERNEL_NAME, False) == "cast",
          sp.classify(fp8_kernels.KERNEL_NAME, False))
    check("classify a uint8 transpose as fp8-transpose", sp.classify(UCOPY, False) == "fp8-transpose",
          sp.classify(UCOPY, False))
    check("classify a bf16 copy as copy", sp.classify(UCOPY.replace("unsigned char", "c10::BFloat16"), False) ==
          "copy/other")
    check("classify a multiply as elementwise", sp.classify(MUL, False) == "residual/elementwise")
    check("index_select: embedding in a dense model", sp.classify(GATHER, False) == "embedding")
    check("index_select: permute in a MoE model", sp.classify(GATHER, True) == "permute")
    check("unknown name: no class", sp.classify("my_odd_kernel", False) is None)
    check("every class but fp8-transpose, copy/other and residual/elementwise is a census class",
          set(sp.CLASSES) - {"fp8-transpose", "copy/other", "residual/elementwise"} <= set(sb.kb.CLASSES),
          set(sp.CLASSES) - set(sb.kb.CLASSES))
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": GEMM, "ts": 100.0, "dur": 50.0},
        {"ph": "X", "cat": "kernel", "name": SDPA, "ts": 140.0, "dur": 20.0},  # overlaps the GEMM by 10
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 200.0, "dur": 5.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 90.0, "dur": 300.0},  # host: ignored
        {"ph": "i", "cat": "kernel", "name": GEMM, "ts": 300.0}]}  # not a complete event: ignored
    for i in range(12):
        trace["traceEvents"].append({"ph": "X", "cat": "Kernel", "name": "odd_%d" % i, "ts": 210.0 + 20 * i,
                                     "dur": 1.0 + i})
    ev = sp.gpu_events(trace)
    check("GPU events only", len(ev) == 15, len(ev))
    s = sp.summarize(ev, 400.0, False)
    odd = sum(1.0 + i for i in range(12))
    check("kernel sum", abs(s["kernel_sum_us"] - (75.0 + odd)) < 1e-9, s["kernel_sum_us"])
    check("busy is the union", abs(s["busy_us"] - (65.0 + odd)) < 1e-9, s["busy_us"])
    check("idle is wall - busy", abs(s["idle_us"] - (400.0 - 65.0 - odd)) < 1e-9, s["idle_us"])
    check("span", abs(s["span_us"] - (210.0 + 220 + 12.0 - 100.0)) < 1e-9, s["span_us"])
    check("gemm time", s["classes"]["gemm"]["time_us"] == 50.0)
    check("unmatched counted in copy/other", abs(s["classes"]["copy/other"]["time_us"] - (5.0 + odd)) < 1e-9)
    check("shares sum to 1", abs(sum(v["share"] for v in s["classes"].values()) - 1.0) < 1e-9)
    top = s["unmatched_top"]
    check("top 10 unmatched, largest first", [u["name"] for u in top] == ["odd_%d" % i for i in range(11, 1, -1)],
          [u["name"] for u in top])
    check("unmatched total", abs(s["unmatched_us"] - odd) < 1e-9)
    check("the summary prints", "by class" in sp.format_summary(s))
    check("an empty trace", sp.summarize([], 10.0, True)["busy_us"] == 0.0)


def main():
    workdir = sys.argv[1]
    mkplan = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
    os.makedirs(workdir, exist_ok=True)
    test_no_torch()
    test_fp8_kernels()
    test_grid()
    test_predictor()
    if mkplan:
        test_census(workdir, mkplan)
    test_profile()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
