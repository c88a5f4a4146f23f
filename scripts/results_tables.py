#!/usr/bin/env python3
"""Markdown tables of committed measurement files (mkernel.measurement.v1) for docs/results.md, run by
scripts/regen-docs from the page's generated blocks.

  scripts/results_tables.py gemm FILE.json ...    our GEMM against cuBLAS, per shape
  scripts/results_tables.py fused FILE.json ...   the fused operators against cuBLAS + our collective, per shape
  scripts/results_tables.py gemm-model PLAN.json  the planner's GEMM model as a plan.json states it
  scripts/results_tables.py grouped-gemm OURS.json TORCH.json ...
                                                  our grouped GEMM against cuBLASLt (one matmul per expert, same
                                                  run) and torch._grouped_mm (same device call): pairs of files
  scripts/results_tables.py ring-attention FILE.json ...
                                                  ring attention on the resident kernel against the layered
                                                  program (transfer, then attention kernel and merge) of the same run
  scripts/results_tables.py moe-ffn FILE.json ...
                                                  the MoE expert FFN on the resident kernel against the layered
                                                  program (dispatch op, grouped GEMMs, combine op) of the same run
  scripts/results_tables.py attention OURS.json SDPA.json ...
                                                  our attention forward against PyTorch SDPA (cuDNN, flash) of the
                                                  same device call, per shape: pairs of files

Numbers are printed as stored (the median over a run's iterations); nothing is fitted or averaged. Each table
names its file, the run's commit and command. Exit 2 with one line on a file that is not a measurement file.
(The collective sweeps against NCCL are validation/report/measured_tables.py's.)
"""
import argparse
import json
import os
import sys


class Parser(argparse.ArgumentParser):
    """Bad options: one line on stderr and exit 2 (argparse would print its usage too)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message}; see --help\n")


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"results_tables.py: {path}: cannot read a measurement file: {e}")
    if d.get("schema") != "mkernel.measurement.v1" or not isinstance(d.get("records"), list):
        raise SystemExit(f"results_tables.py: {path}: expected schema mkernel.measurement.v1 with records, "
                         f"saw schema {d.get('schema')!r}")
    return d


def source(path, d):
    system = d.get("system", {})
    ranks = ", ranks sharing it" if system.get("ranks_share_gpu") else ""
    command = d["run"]["command"]
    if len(command) > 160:
        command = command[:157] + "..."
    return (f"`{os.path.basename(path)}`: {system.get('gpus')} x {system.get('gpu')}{ranks}, commit "
            f"`{d['run']['commit'][:10]}`, {d['run'].get('date', '')}, `{command}`")


def medians(d, op):
    return [r for r in d["records"] if r.get("op") == op and r.get("stat") == "median"]


def gemm(paths):
    for path in paths:
        d = load(path)
        recs = medians(d, "gemm")
        shapes = []
        for r in recs:
            key = (r["m"], r["n"], r["k"], r["dtype"])
            if key not in shapes:
                shapes.append(key)
        print(f"\n{source(path, d)}\n")
        print("| m x n x k | dtype | ours µs | ours TFLOP/s | our kernel | cuBLAS µs | cuBLAS TFLOP/s | ours / cuBLAS time |")
        print("|---|---|---:|---:|---|---:|---:|---:|")
        for key in shapes:
            same = [r for r in recs if (r["m"], r["n"], r["k"], r["dtype"]) == key]
            ours = [r for r in same if r["impl"] == "mkernel"]
            theirs = [r for r in same if r["impl"] == "cublas"]
            if not ours or not theirs:
                continue
            o = min(ours, key=lambda r: r["time_us"])
            c = min(theirs, key=lambda r: r["time_us"])
            kernel = " ".join(str(o[f]) for f in ("tile", "schedule", "epilogue") if o.get(f))
            if o.get("split_k", 1) != 1:
                kernel += f" split-k {o['split_k']}"
            print(f"| {key[0]} x {key[1]} x {key[2]} | {key[3]} | {o['time_us']:.1f} | {o['tflops']:.0f} | {kernel} | "
                  f"{c['time_us']:.1f} | {c['tflops']:.0f} | {o['time_us'] / c['time_us']:.2f} |")


def per_file_table(paths, header, rows):
    """A markdown table of `header` (its lines) with rows(path, d) of every file, then the files' sources."""
    print("\n".join(header))
    sources = []
    for path in paths:
        d = load(path)
        sources.append(source(path, d))
        for row in rows(os.path.basename(path), d):
            print(row)
    print("\nFiles:\n")
    for s in sources:
        print(f"- {s}")


def fused(paths):
    def rows(name, d):
        for r in d["records"]:
            if r.get("impl") != "mkernel" or r.get("stat") != "median" or "baseline_us" not in r:
                continue
            predicted = r.get("predicted_us")
            pred = f"{predicted:.1f} | {predicted / r['time_us']:.2f}" if predicted else "– | –"
            yield (f"| `{name}` | {r['op']} | {r['ranks']} | {r['m']} x {r['n']} x {r['k']} | "
                   f"{r.get('order', '')} | {r['time_us']:.1f} | {r['baseline_us']:.1f} | {r['speedup']:.2f} | {pred} |")
    per_file_table(paths, ["| file | op | ranks | m x n x k | order | fused µs | GEMM then collective µs | speedup | "
                           "predicted µs | predicted / measured |", "|---|---|---:|---|---|---:|---:|---:|---:|---:|"],
                   rows)


def file_pairs(paths, table, which):
    """(ours, baseline) measurement files of one device call each, in the order given; prints both sources."""
    if len(paths) % 2:
        raise SystemExit(f"results_tables.py: {table} takes pairs of files: {which}")
    for ours_path, base_path in zip(paths[::2], paths[1::2]):
        d, t = load(ours_path), load(base_path)
        print(f"\n{source(ours_path, d)}\n\n{source(base_path, t)}\n")
        yield d, t


def pipeline(r):
    """What of our attention engine a record timed: the consumer pipeline (records of engines that had several) and
    the unit split (records that say)."""
    units = f"{r['units']} units" if r.get("units") else ""
    tail = r["algo"].rsplit("-", 1)[-1]
    if tail == "ws":  # one pipeline
        return units or "–"
    return tail + (f", {units}" if units else "")


def attention(paths):
    """Pairs (mk-bench attention file, attention_bench.py file of the same call): the fastest of our pipelines
    per shape against cuDNN and flash."""
    for d, t in file_pairs(paths, "attention", "mk-bench attention's, then SDPA's"):
        print("| S | heads q / kv | causal | ours µs | ours TFLOP/s | variant | cuDNN µs | cuDNN TFLOP/s | "
              "flash TFLOP/s | cuDNN time / ours |")
        print("|---:|---|---|---:|---:|---|---:|---:|---:|---:|")
        def key(r):
            return (r["seq"], r["q_heads"], r["kv_heads"], r["causal"], r["batch"], r["head_dim"])
        theirs = medians(t, "attention-fwd")
        shapes = []
        for r in medians(d, "attention-fwd"):
            if key(r) not in shapes:
                shapes.append(key(r))
        for k in shapes:
            ours = min((r for r in medians(d, "attention-fwd") if key(r) == k), key=lambda r: r["time_us"])
            cud = [r for r in theirs if key(r) == k and r.get("backend") == "cudnn"]
            fl = [r for r in theirs if key(r) == k and r.get("backend") == "flash"]
            c = f"{cud[0]['time_us']:.1f} | {cud[0]['tflops']:.0f}" if cud else "– | –"
            f = f"{fl[0]['tflops']:.0f}" if fl else "–"
            ratio = f"{cud[0]['time_us'] / ours['time_us']:.2f}" if cud else "–"
            print(f"| {k[0]} | {k[1]} / {k[2]} | {'yes' if k[3] else 'no'} | {ours['time_us']:.1f} | "
                  f"{ours['tflops']:.0f} | {pipeline(ours)} | {c} | {f} | {ratio} |")


def ring_attention(paths):
    """mk-bench ring-attention files: the fused op against the layered program of the same run, per shape."""
    def rows(name, d):
        for r in medians(d, "ring-attention"):
            lanes = f"{r['compute_ctas']} / {r['comm_ctas']}" if "compute_ctas" in r else "–"
            check = {True: "ok", False: "FAIL"}.get(r.get("check"), "–")
            yield (f"| `{name}` | {r['ranks']} | {r['nodes']} | {r['seq_per_rank']} | {r['q_heads']} / {r['kv_heads']} | "
                   f"{'yes' if r['causal'] else 'no'} | {lanes} | {r['time_us']:.1f} | {r['layered_us']:.1f} | "
                   f"{r['attn_us']:.1f} | {r['comm_us']:.1f} | {r['speedup']:.2f} | {r['time_us'] / r['bound_us']:.2f} | "
                   f"{r['tflops_per_rank']:.0f} | {check} |")
    per_file_table(paths, ["| file | ranks | nodes | L per rank | heads q / kv | causal | lanes | fused µs | layered µs | "
                           "attention alone µs | transfers alone µs | speedup | fused / max(alone) | TFLOP/s per rank | "
                           "check |", "|---|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"], rows)


def moe_ffn(paths):
    """mk-bench moe-ffn files: Communicator::moeFfn against the layered program of the same run, per shape."""
    def rows(name, d):
        for r in medians(d, "moe-ffn"):
            check = {True: "ok", False: "FAIL"}.get(r.get("check"), "–")
            yield (f"| `{name}` | {r['ranks']} | {r['experts']} / {r['topk']} | {r['tokens']} | {r['hidden']} / {r['ffn']} | "
                   f"{r['routing']} | {r['compute_weight']} | {r['compute_ctas']} / {r['other_ctas']} | "
                   f"{r['time_us']:.1f} | {r['layered_us']:.1f} | {r['dispatch_us']:.1f} | {r['gemm_us']:.1f} | "
                   f"{r['combine_us']:.1f} | {r['speedup']:.2f} | {r['tflops_per_rank']:.0f} | {check} |")
    per_file_table(paths, ["| file | ranks | experts per rank / topk | tokens per rank | H / F | routing | weight | lanes | "
                           "fused µs | layered µs | dispatch alone µs | GEMMs alone µs | combine alone µs | speedup | "
                           "TFLOP/s per rank | check |",
                           "|---|---:|---|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"], rows)


def grouped_gemm(paths):
    """Pairs (mk-bench grouped-gemm file, grouped_gemm_bench.py file of the same call), per shape. Ours computes
    "up" with SwiGLU fused: like for like that is torch's grouped GEMM followed by its SwiGLU; "down" has no
    epilogue, so every baseline produces the same output."""
    for d, t in file_pairs(paths, "grouped-gemm", "mk-bench grouped-gemm's, then torch's"):
        print("| tokens | routing | GEMM | rows per expert | ours µs | ours TFLOP/s | cuBLASLt loop µs | torch µs | "
              "torch + SwiGLU µs | like-for-like best / ours |")
        print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|")
        recs, theirs = medians(d, "grouped-gemm"), medians(t, "grouped-gemm")

        def time_of(rows, tokens, routing, gemm, swiglu=False):
            hit = [r["time_us"] for r in rows
                   if (r["tokens"], r["routing"], r["gemm"], bool(r.get("swiglu"))) == (tokens, routing, gemm, swiglu)]
            return hit[0] if hit else None

        def fmt(x):
            return f"{x:.1f}" if x else "–"

        for o in (r for r in recs if r["impl"] == "mkernel"):
            shape = (o["tokens"], o["routing"])
            lt = time_of([r for r in recs if r["impl"] == "cublaslt"], *shape, o["gemm"])
            alone = time_of(theirs, *shape, o["gemm"])
            fused = time_of(theirs, *shape, o["gemm"], True)
            same = [fused] if o.get("swiglu") else [lt, alone]
            same = [x for x in same if x]
            ratio = f"{min(same) / o['time_us']:.2f}" if same else "–"
            print(f"| {o['tokens']} | {o['routing']} | {o['gemm']}{' + SwiGLU' if o.get('swiglu') else ''} | "
                  f"{o['min_rows']}–{o['max_rows']} | {o['time_us']:.1f} | {o['tflops']:.0f} | {fmt(lt)} | "
                  f"{fmt(alone)} | {fmt(fused)} | {ratio} |")


def gemm_model(paths):
    """The planner's GEMM model as plan.json's compute_model gives it (one line per file)."""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                cm = json.load(f)["compute_model"]
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"results_tables.py: {path}: expected a plan.json with compute_model: {e}")
        loso = cm["leave_one_shape_out"]
        print(f"GEMM model {cm['formula']} on {cm['gpu']}, {cm['note']} of {cm['shapes']} shapes: "
              f"R = {cm['tflops']:.0f} TFLOP/s, c0 = {cm['overhead_us']:.2f} us, B = {cm['hbm_gbs']:.0f} GB/s; "
              f"leave-one-shape-out |error| median {loso['median_abs_err_pct']:.1f} %, "
              f"max {loso['max_abs_err_pct']:.1f} %")


def main():
    ap = Parser(prog="results_tables.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("table", choices=["gemm", "fused", "gemm-model", "attention", "grouped-gemm", "ring-attention",
                                      "moe-ffn"])
    ap.add_argument("files", nargs="+", help="measurement files (mkernel.measurement.v1); gemm-model: plan.json")
    args = ap.parse_args()
    {"gemm": gemm, "fused": fused, "gemm-model": gemm_model, "attention": attention,
     "grouped-gemm": grouped_gemm, "ring-attention": ring_attention,
     "moe-ffn": moe_ffn}[args.table](args.files)


if __name__ == "__main__":
    try:
        main()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            sys.exit(2)
        raise
