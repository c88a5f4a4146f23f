#!/usr/bin/env python3
"""Time GEMMs while a communication kernel runs beside them on the same GPU (issue 34, item 4).

    /opt/torch/.venv/bin/python validation/tools/overlap_bench.py --out FILE.json [--commit SHA] [--ctas 2,4,8]
    /opt/torch/.venv/bin/python validation/tools/overlap_bench.py --comm engine --mk-bench build/impl/mk-bench \
        --ctas 1,4,8 --out FILE.json       (under CUDA MPS: the GEMM process and the engine's process share the GPU)
    python3 validation/tools/overlap_bench.py --list        (no GPU, no torch: the planned shapes)

When a framework overlaps a tensor-parallel collective with the GEMM next to it (Megatron-LM's userbuffers, NCCL
on a second stream), the collective's kernel holds some SMs and moves bytes through HBM while the GEMM runs: the
GEMM gets slower. This harness measures that slowdown as a function of the SMs the communication holds.

The communication kernel: a Triton copy with `ctas` persistent programs, each copying 64 KiB tiles of a 1 GiB
buffer into another (a ring step's traffic on one GPU: a collective reads its send data from HBM and its peer
writes the received data into HBM; here both sides are local). One launch copies the whole buffer; launches follow
each other on a second stream for longer than the GEMMs run.

With `--comm engine` the communication is our own resident kernel instead: `mk-bench soak --ranks 2 --share-gpus`
(two ranks of one process on this GPU, `--ctas` worker CTAs per rank, so it holds twice that many SMs) running
back-to-back collectives of every kind and algorithm at one size (`--engine-bytes`, default 128M) in another
process. Two processes run kernels at once on one GPU only under CUDA MPS: start its daemon before this tool. The
engine cannot be paused from here, so per `ctas` the shapes are timed in blocks: all shapes beside the running engine,
the engine stopped, all shapes alone, twice (beside, alone, beside, alone); the slowdown is the ratio of the medians.

Per shape and per `ctas` (the copy): the GEMM alone (median over reps of N back-to-back GEMMs, CUDA events), and the same
GEMMs while the copy runs on another stream (the copy started first; the GEMM stream waits 50 us before its first
event so the copy is running), alone and beside reps alternating; the copy's rate alone and while the GEMMs run (its launches that fall inside the
GEMM window). Records: "mkernel.measurement.v1", "op": "kernel-overlap" (docs/calibration.md, "GEMMs beside
communication"): m, n, k, dtype, comm_ctas, time_us (the GEMM beside the copy), alone_us, slowdown, comm_gbs and
comm_alone_gbs (bytes read per second by the copy); with the engine, comm_kernel "mkernel-resident" and
comm_ctas = 2 x the worker CTAs per rank.

Exit codes: 0 ok, 1 nothing measured, 2 bad input (one line), 3 no GPU / PyTorch / Triton (one line).
"""
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_bench as kb  # noqa: E402  (shared conventions: parser, system block, file writing; imports no torch)

# TP-sliced GEMMs of the presets at 8192 tokens (m, n, k), forward layout: Llama 3 70B at TP 8 (qkv, attention
# output, MLP up, MLP down), Llama 3 8B at TP 2 (MLP up, MLP down).
SHAPES = [(8192, 1280, 8192), (8192, 8192, 1024), (8192, 7168, 8192), (8192, 8192, 3584), (8192, 14336, 4096),
          (8192, 4096, 7168)]
DEFAULT_CTAS = (2, 4, 8, 16, 32)
COPY_BYTES = 1 << 30
TILE = 32768  # elements of bf16 per program step: 64 KiB
GEMMS_PER_REP = 20
REPS = 9
LEAD_US = 50.0
ENGINE_BLOCKS = 2  # (beside, alone) blocks per --ctas value with --comm engine
ENGINE_REPS = 5  # reps per shape and block
ENGINE_START_S = 60.0  # the longest the engine may take to start its first collective
ENGINE_RUN_S = 10.0  # how long the engine runs collectives: it then stops by itself (never killed: see Engine)

_COPY = {}


def parse_args(argv):
    ap = kb.OneLineParser(prog="overlap_bench.py", description=__doc__.split("\n\n")[0],
                          formatter_class=kb.argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="measurement file to write (mkernel.measurement.v1)")
    ap.add_argument("--ctas", default=",".join(str(c) for c in DEFAULT_CTAS),
                    help="SMs the communication kernel holds, comma-separated (default %(default)s)")
    ap.add_argument("--commit", help="the commit measured, when the tree copy has no git history")
    ap.add_argument("--list", action="store_true", help="print the planned shapes and exit; needs no GPU")
    ap.add_argument("--comm", choices=("copy", "engine"), default="copy",
                    help="the communication beside the GEMMs: a Triton copy (default) or our resident kernel (mk-bench "
                         "soak, two ranks sharing this GPU; needs CUDA MPS and --mk-bench)")
    ap.add_argument("--mk-bench", help="the mk-bench executable (--comm engine)")
    ap.add_argument("--engine-bytes", default="128M", help="size of every collective the engine runs (default 128M)")
    a = ap.parse_args(argv)
    try:
        a.cta_list = [int(c) for c in a.ctas.split(",") if c.strip()]
    except ValueError:
        raise kb.BadInput("--ctas: '%s' is not a comma-separated list of integers" % a.ctas)
    if not a.cta_list or any(c < 1 or c > 1024 for c in a.cta_list):
        raise kb.BadInput("--ctas: '%s': each value must be 1..1024" % a.ctas)
    if a.comm == "engine" and not (a.mk_bench and os.access(a.mk_bench, os.X_OK)):
        raise kb.BadInput("--comm engine needs --mk-bench, an executable mk-bench (got %s)" % (a.mk_bench or "none"))
    kb.check_out_and_commit(a)
    return a


def copy_kernel(torch):
    """The Triton persistent copy, compiled once."""
    if "k" not in _COPY:
        import triton
        import triton.language as tl

        @triton.jit
        def persistent_copy(src, dst, n_tiles, TILE: tl.constexpr):
            pid = tl.program_id(0)
            step = tl.num_programs(0)
            offs = tl.arange(0, TILE)
            for t in range(pid, n_tiles, step):
                base = t.to(tl.int64) * TILE
                tl.store(dst + base + offs, tl.load(src + base + offs))

        _COPY["k"] = persistent_copy
    return _COPY["k"]


def gemm_rep_us(torch, a, b, out, stream, copies=None):
    """One rep: GEMMS_PER_REP back-to-back GEMMs on `stream` (after a LEAD_US sleep), us per GEMM; with `copies` (a
    function launching the copy on the other stream and returning its (start, end) events) the copy runs beside
    them. Returns (us per GEMM, [us per copy launch that fell inside the GEMM window])."""
    torch.cuda.synchronize()
    launched = copies() if copies else []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(LEAD_US * 2000))
        e0.record(stream)
        for _ in range(GEMMS_PER_REP):
            torch.matmul(a, b, out=out)
        e1.record(stream)
    torch.cuda.synchronize()
    inside = [s.elapsed_time(e) * 1000.0 for s, e in launched
              if e0.elapsed_time(s) >= 0 and e.elapsed_time(e1) >= 0]
    return e0.elapsed_time(e1) * 1000.0 / GEMMS_PER_REP, inside


def paired_us(torch, a, b, out, stream, copies):
    """REPS pairs of (alone rep, beside rep), alternating so that clock and power drift hits both alike. Returns
    (median alone us, median beside us, median of the pairs' ratios, median copy us inside the window or None)."""
    alone, beside, ratios, copy_in = [], [], [], []
    for _ in range(REPS):
        t_a, _ = gemm_rep_us(torch, a, b, out, stream)
        t_b, inside = gemm_rep_us(torch, a, b, out, stream, copies)
        alone.append(t_a)
        beside.append(t_b)
        ratios.append(t_b / t_a)
        copy_in += inside
    med = statistics.median
    return med(alone), med(beside), med(ratios), (med(copy_in) if copy_in else None)


def gemm_operands(torch, dev, m, n, k):
    """Random bf16 operands of one shape, the product checked against float32 once, then 30 GEMMs so that clocks
    and power settle on this shape."""
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    ref = torch.matmul(x.float(), w.float())
    torch.matmul(x, w, out=y)
    err = kb.rel_err(torch, y, ref)
    if not err <= 2e-2:
        raise RuntimeError("GEMM %dx%dx%d relative error %.3g" % (m, n, k, err))
    del ref
    for _ in range(30):
        torch.matmul(x, w, out=y)
    return x, w, y


class Engine:
    """Our resident kernel in a process of its own: mk-bench soak with two ranks sharing this GPU, every collective
    at one size, never checked (no host work between ops), for ENGINE_RUN_S seconds. It stops by itself: under MPS,
    killing a process whose resident kernel is running left the next client's kernels with a fatal GPU error
    (docs/journal/gemm.md), so a kill is only the last resort of a soak that does not end."""

    def __init__(self, a, workers, log_path):
        self.cmd = [a.mk_bench, "soak", "--ranks", "2", "--share-gpus", "--seconds", str(ENGINE_RUN_S), "--sizes", "1",
                    "--max-bytes", a.engine_bytes, "--check-every", "0", "--workers", str(workers)]
        self.log_path = log_path
        self.proc = None

    def __enter__(self):
        # Line-buffered, so that its first line (printed once its communicators are up) shows in the log at once.
        cmd = (["stdbuf", "-oL"] if shutil.which("stdbuf") else []) + self.cmd
        with open(self.log_path, "a") as log:
            log.write("$ %s\n" % shlex.join(cmd))
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError("mk-bench soak exited with %d before running (%s)" % (self.proc.returncode,
                                                                                           self.log_path))
                with open(self.log_path) as log:
                    if "# mk-bench soak" in log.read().split("$ ")[-1]:
                        break
                if time.time() - t0 > ENGINE_START_S:
                    raise RuntimeError("mk-bench soak did not start within %.0f s (%s)" % (ENGINE_START_S,
                                                                                          self.log_path))
                time.sleep(0.2)
        except RuntimeError:
            self.__exit__()
            raise
        time.sleep(2.0)  # its first rounds of collectives are running
        self.started = time.time() - 2.0
        return self

    def check_running(self):
        if self.proc.poll() is not None or time.time() - self.started > ENGINE_RUN_S:
            raise RuntimeError("mk-bench soak stopped (exit %s) before the GEMMs beside it were done (%s)" % (
                self.proc.poll(), self.log_path))

    def __exit__(self, *exc):
        try:
            self.proc.wait(timeout=ENGINE_RUN_S + ENGINE_START_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return False


def measure_beside_engine(torch, a, doc, dev, stream):
    """--comm engine: per --ctas value, ENGINE_BLOCKS x (every shape beside the running engine, then alone)."""
    log_path = a.out + ".engine.log"
    operands = {shape: gemm_operands(torch, dev, *shape) for shape in SHAPES}
    for c in a.cta_list:
        beside = {shape: [] for shape in SHAPES}
        alone = {shape: [] for shape in SHAPES}
        for _ in range(ENGINE_BLOCKS):
            with Engine(a, c, log_path) as engine:
                for shape in SHAPES:
                    beside[shape] += [gemm_rep_us(torch, *operands[shape], stream)[0] for _ in range(ENGINE_REPS)]
                engine.check_running()
            for shape in SHAPES:
                alone[shape] += [gemm_rep_us(torch, *operands[shape], stream)[0] for _ in range(ENGINE_REPS)]
        for m, n, k in SHAPES:
            t_alone = statistics.median(alone[(m, n, k)])
            t_beside = statistics.median(beside[(m, n, k)])
            doc["records"].append({
                "op": "kernel-overlap", "impl": "torch", "class": "gemm", "kernel": "gemm", "pass": "forward",
                "dtype": "bfloat16", "layout": "nt", "m": m, "n": n, "k": k, "batch": 1, "ranks": 1,
                "flops": 2 * m * n * k, "bytes": 2 * (m * k + k * n + m * n), "comm_ctas": 2 * c,
                "comm_kernel": "mkernel-resident", "comm_bytes": a.engine_bytes, "time_us": t_beside,
                "alone_us": t_alone, "slowdown": t_beside / t_alone, "iters": GEMMS_PER_REP * ENGINE_REPS * ENGINE_BLOCKS,
                "stat": "median"})
            print("  gemm m=%-5d n=%-5d k=%-5d alone %8.2f us, beside the engine (%2d CTAs) %8.2f us: x%.3f" % (
                m, n, k, t_alone, 2 * c, t_beside, t_beside / t_alone), flush=True)


def main(argv):
    try:
        a = parse_args(argv)
    except kb.BadInput as ex:
        sys.stderr.write("overlap_bench.py: %s\n" % ex)
        return 2
    if a.list:
        for m, n, k in SHAPES:
            print(json.dumps({"m": m, "n": n, "k": k, "ctas": a.cta_list}))
        return 0
    torch, commit, rc = kb.open_gpu("overlap_bench.py", a.commit)
    if rc:
        return rc
    try:
        kern = copy_kernel(torch) if a.comm == "copy" else None
    except ImportError as ex:
        sys.stderr.write("overlap_bench.py: needs Triton (%s)\n" % str(ex).splitlines()[0])
        return 3
    dev = torch.device("cuda", 0)
    sysb = kb.system_block(torch)
    doc = {"schema": kb.SCHEMA, "system": sysb,
           "run": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "commit": commit,
                   "command": "overlap_bench.py " + shlex.join(argv), "complete": False,
                   "note": ("communication emulated by a Triton persistent copy of a 1 GiB bf16 buffer with "
                            "comm_ctas programs, on a second stream of the same GPU") if a.comm == "copy" else
                           ("communication by our resident kernel: mk-bench soak, two ranks of one process sharing "
                            "this GPU, every collective at %s, in another process under CUDA MPS; comm_ctas = 2 x "
                            "worker CTAs per rank" % a.engine_bytes)},
           "records": []}
    n_elems = COPY_BYTES // 2
    src = torch.randn(n_elems, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    n_tiles = n_elems // TILE
    gemm_stream, copy_stream = torch.cuda.Stream(), torch.cuda.Stream()

    def launch_copy(ctas):
        kern[(ctas,)](src, dst, n_tiles, TILE=TILE)

    def copy_alone_us(ctas):
        launch_copy(ctas)  # compile / warm
        torch.cuda.synchronize()
        ts = []
        for _ in range(3):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            launch_copy(ctas)
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) * 1000.0)
        if not torch.equal(dst[:TILE * 4], src[:TILE * 4]) or not torch.equal(dst[-TILE:], src[-TILE:]):
            raise RuntimeError("the copy kernel's output differs from its input")
        return statistics.median(ts)

    print("overlap_bench: %s, %d SMs; torch %s; %d shapes x ctas %s; beside %s" % (
        sysb["gpu"], sysb["sms"], sysb["torch"], len(SHAPES), a.cta_list, a.comm), flush=True)
    t0 = time.time()
    if a.comm == "engine":
        try:
            measure_beside_engine(torch, a, doc, dev, gemm_stream)
        except RuntimeError as ex:
            sys.stderr.write("overlap_bench.py: %s\n" % ex)
            return 1
        return finish(a, doc, t0)
    alone_copy = {c: copy_alone_us(c) for c in a.cta_list}
    for c in a.cta_list:
        print("  copy alone, %3d CTAs: %9.1f us per GiB, %6.0f GB/s read" % (
            c, alone_copy[c], COPY_BYTES / alone_copy[c] / 1e3), flush=True)
    for m, n, k in SHAPES:
        try:
            x, w, y = gemm_operands(torch, dev, m, n, k)
        except RuntimeError as ex:
            sys.stderr.write("overlap_bench.py: %s\n" % ex)
            return 1
        for c in a.cta_list:
            alone = gemm_rep_us(torch, x, w, y, gemm_stream)[0]
            window = (LEAD_US + alone * GEMMS_PER_REP) * 2.0
            launches = max(2, int(window / alone_copy[c]) + 2)

            def copies():
                evs = []
                with torch.cuda.stream(copy_stream):
                    for _ in range(launches):
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record(copy_stream)
                        launch_copy(c)
                        e.record(copy_stream)
                        evs.append((s, e))
                return evs

            alone, beside, slowdown, copy_us = paired_us(torch, x, w, y, gemm_stream, copies)
            rec = {"op": "kernel-overlap", "impl": "torch", "class": "gemm", "kernel": "gemm", "pass": "forward",
                   "dtype": "bfloat16", "layout": "nt", "m": m, "n": n, "k": k, "batch": 1, "ranks": 1,
                   "flops": 2 * m * n * k, "bytes": 2 * (m * k + k * n + m * n), "comm_ctas": c,
                   "comm_kernel": "triton-persistent-copy", "time_us": beside, "alone_us": alone,
                   "slowdown": slowdown, "iters": GEMMS_PER_REP * REPS, "stat": "median",
                   "comm_alone_gbs": COPY_BYTES / alone_copy[c] / 1e3}
            if copy_us:
                rec["comm_gbs"] = COPY_BYTES / copy_us / 1e3
            doc["records"].append(rec)
            print("  gemm m=%-5d n=%-5d k=%-5d alone %8.2f us, beside a %2d-CTA copy %8.2f us: x%.3f; copy %s" % (
                m, n, k, alone, c, beside, slowdown,
                ("%.0f GB/s (alone %.0f)" % (rec["comm_gbs"], rec["comm_alone_gbs"])) if copy_us else
                "outlived the window (no launch inside it)"), flush=True)
        del x, w, y
        torch.cuda.empty_cache()
    return finish(a, doc, t0)


def finish(a, doc, t0):
    doc["run"]["complete"] = True
    doc["run"]["seconds"] = round(time.time() - t0, 1)
    if not doc["records"]:
        sys.stderr.write("overlap_bench.py: nothing measured\n")
        return 1
    kb.write_file(a.out, doc)
    print("overlap_bench: %d records in %.0f s -> %s" % (len(doc["records"]), time.time() - t0, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
