#!/usr/bin/env python3
"""mk-plan's report: index.html and PNG plots from plan.json (schema mkernel.plan.v1).

    /usr/bin/python3 plan_report.py --json plan.json --out DIR

mk-plan --report DIR runs it (in a temporary directory it then renames). Writes DIR/index.html and
step-time.png, breakdown.png, comm.png, throughput.png, what-ifs.png (with what-ifs) and goodput.png (with a
noise or straggler what-if), drawn by plan_plots.py. Every number of the page is explained in docs/planner.md. Needs matplotlib (Debian's
python3-matplotlib: /usr/bin/python3, not pyenv's). Exit codes: 0 done, 2 bad input, 3 no matplotlib.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_common import esc, fmt, import_pyplot, page, table  # noqa: E402
from report_common import fail as _fail  # noqa: E402
from plan_plots import (feasible, plot_breakdown, plot_comm, plot_goodput, plot_step_time,  # noqa: E402
                        plot_throughput, plot_what_ifs, relative, step_shown)

TOOL = "plan_report.py"
STATUS_CLASS = {"validated": "ok", "extrapolated": "ex", "not validated": "nv", "not available": "na"}


def fail(msg, code=2):
    _fail(TOOL, msg, code)


def g3(x):
    """3 significant digits, never an exponent: "74.9", "1,234" (docs/planner.md: plain numbers)."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def dur(us):
    """A duration with 3 significant digits and a readable unit ("-" for none or zero)."""
    if not us:
        return "-"
    if us >= 1e6:
        return f"{g3(us / 1e6)} s"
    if us >= 1e3:
        return f"{g3(us / 1e3)} ms"
    return f"{g3(us)} us"


def gib(b):
    return "-" if b is None else f"{b / 2**30:.1f} GiB"


def shares(s):
    """Fractions of the step by status of the classes that make it up."""
    total = sum(c["us"] for c in s["confidence"]["classes"].values()) or 1
    out = {}
    for c in s["confidence"]["classes"].values():
        out[c["status"]] = out.get(c["status"], 0) + c["us"] / total
    return out


def confidence_text(s):
    """Shares of the step that are validated / extrapolated / not validated, e.g. "45/20/35 %"."""
    sh = shares(s)
    return "/".join(f"{100 * sh.get(k, 0):.0f}" for k in ("validated", "extrapolated", "not validated")) + " %"


# ---- tables ---------------------------------------------------------------------------------------------------

def unmeasured_cell(s, b):
    """The compute time, marked with the share priced by unmeasured kernel classes (the roofline)."""
    share = s.get("unmeasured_compute_share", 0)
    if not share:
        return dur(b["compute_us"])
    return (f"{dur(b['compute_us'])} ({100 * share:.0f} % unmeasured)", "nv")


def count(v):
    """A count for people: thousands separators, no exponent ("1,751,234")."""
    return f"{v:,.0f}"


def memory_cell(mem):
    """ "0.9 GB of 141 GB" (decimal GB, the datasheet's unit of the capacity), marked where it does not fit."""
    if mem["capacity_bytes"] is None:
        return f"{mem['total_bytes'] / 1e9:.1f} GB"
    text = f"{mem['total_bytes'] / 1e9:.1f} GB of {mem['capacity_bytes'] / 1e9:.4g} GB"
    return text if mem["fits"] else ("does not fit: " + text, "nv")


def step_cell(s):
    """The step (the mean step under noise, as the plot shows it) with its confidence band: "74.9 ms ±18 %" coloured
    by the step's status; "NOT VALIDATED" only where no part of the step was measured."""
    status = s["confidence"]["status"]
    band = s.get("band")
    text = dur(step_shown(s)) + ("" if band is None else (" " + band["text"] if band["measured_share"] > 0
                                                          else " NOT VALIDATED"))
    if "noise" in s:
        text += " (mean with noise)"
    return text, STATUS_CLASS[status]


def scale_rows(v, budget):
    rows, classes = [], []
    for s in v["scales"]:
        if not s["feasible"]:
            rows.append([s["gpus"], s["nodes"], "-", "not feasible: " + s["reason"]] + [""] * 12)
            classes.append("na")
            continue
        lay, b = s["layout"], s["layered"]
        status = s["confidence"]["status"]
        hidden = sum(b[k]["hidden_us"] for k in ("tp", "ep", "pp", "dp"))
        bn = s.get("bottleneck")
        rows.append([s["gpus"], s["nodes"], f"{lay['tp']}/{lay['pp']}/{lay['dp']}/{lay['ep']}", lay["micro_batches"],
                     step_cell(s), unmeasured_cell(s, b),
                     dur(b["tp"]["exposed_us"]), dur(b["ep"]["exposed_us"]), dur(b["pp"]["exposed_us"]),
                     dur(b["dp"]["exposed_us"]), dur(hidden), dur(b["bubble_us"]), count(s["tokens_per_s"]),
                     f"{100 * s['mfu']:.1f} %", f"{100 * s['scaling_efficiency']:.0f} %",
                     count(s["gpu_hours"]), f"{bn['part']} ({100 * bn['share']:.0f} %)" if bn else "-",
                     memory_cell(s["memory"]), (confidence_text(s), STATUS_CLASS[status])])
        classes.append("")
    head = ["GPUs", "nodes", "tp/pp/dp/ep", "micro-batches", "step ± band", "compute", "TP exposed", "EP exposed",
            "PP exposed", "DP exposed", "hidden comm", "bubble", "tokens/s", "MFU", "scaling",
            f"GPU-hours for {budget / 1e9:,.0f} billion tokens", "bound by", "memory / GPU",
            "share of the step validated / extrapolated / not validated"]
    # Infeasible rows: one wide text cell, padded to the header's width.
    rows = [r if len(r) == len(head) else (r + [""] * len(head))[:len(head)] for r in rows]
    return head, rows, classes


def class_share_rows(v):
    """Per GPU count: each class of operation's share of the step and its confidence in that use."""
    ids = sorted({cid for s in feasible(v["scales"]) for cid in s["confidence"]["classes"]})
    rows, head = [], ["GPUs", "status"] + ids
    for s in feasible(v["scales"]):
        cls = s["confidence"]["classes"]
        row = [s["gpus"], (s["confidence"]["status"], STATUS_CLASS[s["confidence"]["status"]])]
        for cid in ids:
            c = cls.get(cid)
            row.append((f"{100 * c['us'] / s['layered']['step_us']:.0f} %", STATUS_CLASS[c["status"]]) if c else "-")
        rows.append(row)
    return head, rows


def fused_status(doc):
    """Blue (extrapolated) when the fused variant is priced and its class carries the error measured in a regime of
    its own, orange (not validated) when priced without one, red when it cannot be priced."""
    if doc["fused"]["status"] == "available":
        c = doc["confidence"]["classes"].get("fused") or {}
        e = c.get("error")
        if e and c.get("status") == "extrapolated":
            return (f"<span class='ex'>fused: available, extrapolated</span> (median |error| "
                    f"{fmt(e['median_abs_err_pct'])} % on {e['n']} records: {esc(c['method'])})")
        return ("<span class='nv'>fused: available, not validated</span> (priced by the fused schedules' own "
                "model; the fused operators have run only with ranks sharing one GPU: docs/results.md)")
    return f"<span class='bad'>fused: {esc(doc['fused']['status'])}</span>"


def fused_rows(doc):
    """Per GPU count and variant: the layered step, the fused step and the speedup (or "not available")."""
    variants = doc["variants"]
    head = ["GPUs"]
    for v in variants:
        head += [f"{v['name']}: layered", "fused", "speedup"]
    rows = []
    for i, b in enumerate(variants[0]["scales"]):
        row = [b["gpus"]]
        for v in variants:
            s = v["scales"][i]
            if not s["feasible"]:
                row += ["-", "-", "-"]
                continue
            f = s["fused"]
            row += [dur(s["layered"]["step_us"]), dur(f["step_us"]) if f["available"] else ("n/a", "na"),
                    f"{s['fused_speedup']:.3f}x" if s["fused_speedup"] else ("n/a", "na")]
        rows.append(row)
    return head, rows


def fused_op_rows(doc):
    """The (GEMM, collective) pairs of the critical stage that the fused variant runs as one operator."""
    base = feasible(doc["variants"][0]["scales"])
    s = base[-1]
    rows = [[f["kind"], f["gemm"], f["comm"], f["m"], f["n"], f["k"], f["times_per_step"], dur(f["gemm_us"]),
             dur(f["comm_us"]), f["collective"]] for f in s["fused_ops"]]
    return s["gpus"], ["fused operator", "GEMM", "collective", "m", "n", "k", "per step", "GEMM alone",
                       "collective alone", "id"], rows


def fused_block_rows(doc):
    """The fused blocks of the critical stage (moe-ffn, ring-attention): their price, or why they stay layered."""
    base = feasible(doc["variants"][0]["scales"])
    s = base[-1]
    rows = []
    for b in s.get("fused_blocks", []):
        name = b["kind"] + (" (backward, modelled)" if b["mirror"] else "")
        price = dur(b["fused_us"]) if b["fused"] else ("not fused: " + b["note"], "na")
        rows.append([name, ", ".join(b["replaces"]), b["ranks"], b["times_per_step"], dur(b["layered_compute_us"]),
                     dur(b["layered_comm_us"]), price])
    return s["gpus"], ["fused operator", "replaces", "ranks", "per step", "kernels alone", "exchanges alone",
                       "fused"], rows


def what_if_rows(doc):
    base = doc["variants"][0]["scales"]
    head = ["GPUs"] + [v["name"] for v in doc["variants"]]
    rows = []
    for i, b in enumerate(base):
        row = [b["gpus"]]
        for v in doc["variants"]:
            s = v["scales"][i]
            if not s["feasible"]:
                row.append("-")
                continue
            r = relative(b, s)
            row.append(dur(step_shown(s)) + (f" ({r:.2f}x)" if r is not None else ""))
        rows.append(row)
    return head, rows


def hours(s):
    """A duration given in seconds, "unknown" for null (a missing what-if input: docs/planner.md)."""
    if s is None:
        return "unknown"
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{g3(s / n)} {unit}"
    return f"{g3(s)} s"


def failure_rows(doc):
    """Goodput under failures: one row per variant and scale that has them (plan.json "failures")."""
    rows = []
    for v in doc["variants"]:
        for s in feasible(v["scales"]):
            g = s.get("failures")
            if g is None:
                continue
            ettr = "unknown" if g["ettr"] is None else f"{100 * g['ettr']:.1f} %"
            good = "unknown" if g["goodput_tokens_per_s"] is None else f"{g['goodput_tokens_per_s']:,.0f}"
            rows.append([v["name"], s["gpus"], f"{24 * g['failures_per_hour']:.3g}", hours(g["job_mtbf_s"]),
                         gib(g["checkpoint_bytes_per_gpu"]), hours(g["write_s"]),
                         hours(g["interval_s"]) + (" (Young-Daly)" if g["interval_young_daly"] else ""),
                         hours(g["lost_per_failure_s"]), ettr, good,
                         hours(g["train_s"]) if g["ettr"] is not None else "unknown",
                         "; ".join(x for x in (g["unknown"] and "unknown: " + g["unknown"], g["note"]) if x)])
    return ["variant", "GPUs", "failures/day", "job MTBF", "checkpoint/GPU", "write", "interval", "lost/failure",
            "ETTR", "goodput tokens/s", "time to train", "note"], rows


def bound_rows(doc):
    rows = []
    for s in feasible(doc["variants"][0]["scales"]):
        for phase, what in s["bounds"].items():
            rows.append([s["gpus"], phase, what])
    return ["GPUs", "phase", "what bounds it"], rows


def link_rows(doc):
    rows = []
    colls = doc["collectives"]
    for v in doc["variants"]:
        ss = feasible(v["scales"])
        if not ss:
            continue
        s = ss[-1]
        seen = set()
        for c in s["comm"]:
            if c["collective"] in seen:
                continue
            seen.add(c["collective"])
            col = colls[c["collective"]]
            links = "; ".join(f"{l['name']} {100 * l['utilization']:.0f} % of {l['bandwidth_gbs']:.0f} GB/s"
                              for l in col["busiest_links"]) or "-"
            rows.append([v["name"], s["gpus"], c["name"], c["collective"], (links, "w"), (col["bound"], "w")])
    return ["variant", "GPUs", "collective (first use)", "id", "busiest links (average utilization)", "bound"], rows


def collective_rows(doc):
    rows, classes = [], []
    for cid in sorted(doc["collectives"], key=lambda k: int(k[1:])):
        c = doc["collectives"][cid]
        rows.append([cid, c["op"], c["algo"], c["domain"], c["group_size"], c["group_nodes"], c["concurrent"],
                     c["bytes"], dur(c["time_us"]), dur(c["closed_form_us"]), c["source"], (c["note"] or "-", "w")])
        classes.append("nv" if c["domain"] == "network" else "")
    return ["id", "op", "algorithm", "domain", "ranks", "nodes", "instances simulated", "bytes (nccl-tests size)", "time",
            "closed form", "source", "note"], rows, classes


def class_rows(doc):
    rows, classes = [], []
    for cid, c in doc["confidence"]["classes"].items():
        e = c["error"]
        rows.append([cid, (c["what"], "w"), c["status"], e["n"] if e else "-", fmt(e and e["median_abs_err_pct"]),
                     fmt(e and e["p90_abs_err_pct"]), fmt(e and e["max_abs_err_pct"]),
                     c["measured_gpu"] or "-", ", ".join(str(r) for r in c["measured_ranks"]) or "-",
                     (c["method"], "w")])
        classes.append(("ex" if c["status"] == "extrapolated" else "ok") if e else
                       ("na" if c["status"] == "not available" else "nv"))
    return ["class", "what", "status", "n", "median |err| %", "p90", "max", "measured on", "ranks", "how"], rows, classes


def gemm_rows(doc):
    base = feasible(doc["variants"][0]["scales"])
    if not base:
        return None, None
    s = base[-1]
    # Plans written before the census had no class or source: GEMMs and attention, priced by the GEMM model.
    rows = [[c["name"], c.get("class", c["kind"]), c["m"], c["n"], c["k"], c["batch"], c["times_per_step"],
             dur(c["time_us"]), f"{c['tflops']:.0f}", "memory" if c["memory_bound"] else "compute",
             ("UNMEASURED (roofline)", "nv") if c.get("unmeasured") else c.get("source", "gemm-model")]
            for c in s["compute"]]
    return s["gpus"], rows



def checked_rows(v):
    """Per GPU count: the critical stage's compute by what checked its prices (plan.json compute_checked)."""
    rows = []
    for s in feasible(v["scales"]):
        c = s.get("compute_checked")
        if c:
            rows.append([s["gpus"], f"{100 * c['by_step_records']:.0f} %", f"{100 * c['by_kernel_records']:.0f} %",
                         (f"{100 * c['unchecked']:.0f} %", "nv" if c["unchecked"] >= 0.05 else "")])
    return ["GPUs", "in kernels whole-step records covered", "kernel records only", "neither"], rows


def step_rows(doc):
    """The measured training steps this planner predicted (plan.json confidence.steps), or None."""
    st = doc["confidence"].get("steps")
    if not st:
        return None, None
    rows = [[r["workload"], r["dtype"], r["gpu"], r["seq"], f"{r['micro_batch']} x {r['micro_batches']}",
             dur(r["measured_us"]), dur(r["predicted_us"]), f"{r['error_pct']:+.1f} %"] for r in st["records"]]
    e = st["error"]
    summary = (f"{e['n']} steps: median |error| {e['median_abs_err_pct']:.1f} %, max {e['max_abs_err_pct']:.1f} % "
               "(" + "; ".join(f"{g}: n={x['n']}, median {x['median_abs_err_pct']:.1f} %, max "
                               f"{x['max_abs_err_pct']:.1f} %" for g, x in st["error_by_gpu"].items()) + ")")
    return summary, rows


def kernel_model_rows(doc):
    """The kernel models per GPU, class, kernel, dtype and pass with their leave-one-shape-out error."""
    km = doc.get("kernel_models") or {}
    rows = []
    for m in km.get("models", []):
        if m["pass"] == "*":
            continue
        lo = m["leave_one_shape_out"]
        rows.append([m["gpu"], m["class"], m["kernel"] or "-", m["dtype"] or "-", m["pass"], m["records"],
                     fmt(m["overhead_us"]), fmt(m["tflops"]), fmt(m["bandwidth_gbs"]), fmt(lo["median_abs_err_pct"]),
                     fmt(lo["max_abs_err_pct"])])
    return km.get("note", ""), rows


def nic_text(node):
    """'8 NICs of 50 GB/s' from a topology node: the NIC list (the form files are written in) or the old count."""
    nics = node.get("nics", 0)
    if isinstance(nics, list):
        rates = sorted({n["bwGBs"] for n in nics})
        kinds = sorted({n.get("transport", "ib") for n in nics})
        rate = "/".join(f"{r:.4g}" for r in rates) if rates else "0"
        return f"{len(nics)} NICs of {rate} GB/s ({', '.join(kinds) or 'none'})"
    return f"{nics} NICs of {node.get('nic', {}).get('bwGBs', 0):.0f} GB/s"

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="mk-plan's plan.json (mkernel.plan.v1)")
    ap.add_argument("--out", required=True, help="directory to write index.html and the PNGs into (must exist)")
    a = ap.parse_args()
    plt = import_pyplot(TOOL, "mk-plan --python")
    try:
        with open(a.json) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{a.json}: {e}")
    if doc.get("schema") != "mkernel.plan.v1":
        fail(f'{a.json}: expected schema "mkernel.plan.v1" (got {doc.get("schema")!r})')
    if not os.path.isdir(a.out):
        fail(f"--out {a.out} is not a directory")
    if not feasible(doc["variants"][0]["scales"]):
        fail("no GPU count of the sweep is feasible for this layout: nothing to plot (see the reasons in plan.json)")

    inp = doc["inputs"]
    w = inp["workload"]
    m, t, l = w["model"], w["training"], w["layout"]
    node = inp["cluster"]["topology"]["node"]
    cm = doc["compute_model"]
    noise = any("noise" in s for v in doc["variants"] for s in v["scales"])
    imgs = [plot_step_time(plt, doc, a.out), plot_breakdown(plt, doc, a.out), plot_comm(plt, doc, a.out),
            plot_throughput(plt, doc, a.out)]
    what_if_png = plot_what_ifs(plt, doc, a.out) if len(doc["variants"]) > 1 else None
    goodput_png = plot_goodput(plt, doc, a.out) if noise else None

    p = [f"<h1>mk-plan: {esc(w['name'])} on {esc(inp['cluster']['spec'])}, {inp['gpus'][0]} to {inp['gpus'][-1]} "
         "GPUs</h1>"]
    moe = f", {m['moe']['experts']} experts top-{m['moe']['topK']}" if "moe" in m else ""
    if doc.get("headline"):
        p.append(f"<p class='headline'><b>{esc(doc['headline'])}</b></p>")
    p.append("<div class='box'>")
    p.append(f"<p><b>Workload.</b> {m['layers']} layers, hidden {m['hidden']}, FFN {m['ffn']}, {m['heads']} heads "
             f"({m['kvHeads']} key/value), vocabulary {m['vocab']}{moe}; sequence {t['seq']}, global batch "
             f"{t['globalBatch']} sequences of micro-batch {t['microBatch']}, {t['dtype']}, recompute {t['recompute']}. "
             f"{esc(inp['workload_source'] or '')}</p>")
    p.append(f"<p><b>Layout.</b> TP {l['tp']}, PP {l['pp']} ({l['ppSchedule']}, {l['virtualStages']} chunk(s) per "
             f"GPU), DP {l['dp']}, EP {l['ep']}, sequence parallelism {'on' if l['sp'] else 'off'}, ZeRO {l['zero']}, "
             f"gradient buckets of {l['bucketMiB']:.4g} MiB in {l['gradDtype']} "
             f"({'overlapped with the backward pass' if l['overlapGradReduce'] else 'after the backward pass'}).</p>")
    p.append(f"<p><b>Cluster.</b> {esc(inp['cluster']['spec'])}: {node['gpus']} x {esc(node['gpu'])} per node "
             f"({node['bf16Tflops']:.0f} TFLOP/s dense bf16, {node['hbmGBs']:.0f} GB/s HBM), NVLink "
             f"{node['nvlink']['bwGBs']:.0f} GB/s per GPU, {nic_text(node)}, "
             f"PCIe {node['pcie']['bwGBs']:.0f} GB/s; rail leaves of {inp['cluster']['topology']['fabric']['nodesPerLeaf']}"
             f" nodes, oversubscription {inp['cluster']['topology']['fabric']['oversubscription']:g}.</p>")
    p.append(f"<p><b>Profile.</b> {esc(inp['profile_note'])}</p>")
    lo = cm["leave_one_shape_out"]
    p.append(f"<p><b>Compute.</b> t = {cm['overhead_us']:.2f} us + max(FLOPs / {cm['tflops']:.0f} TFLOP/s, bytes / "
             f"{cm['hbm_gbs']:.0f} GB/s), fitted on {cm['samples']} cuBLAS records of {cm['shapes']} shapes on "
             f"{esc(cm['gpu'])} (our measurements, validation/data/measured); leave-one-shape-out |error|: median "
             f"{fmt(lo['median_abs_err_pct'], 1)} %, p90 {fmt(lo['p90_abs_err_pct'], 1)} %, max "
             f"{fmt(lo['max_abs_err_pct'], 1)} %.</p>")
    p.append(f"<p><b>Communication.</b> Each distinct collective simulated once by SimGrid at the cluster's scale "
             f"({len(doc['collectives'])} distinct); validation of the simulator on the committed measurements: "
             f"{esc(doc['confidence']['validation'])}.</p>")
    p.append(f"<p><b>Fused operators.</b> {fused_status(doc)}</p>")
    p.append("<p class='note'>Confidence: each step carries a band, ± the median |error| of each class of operation "
             "that makes it up, weighted by that class's share of the step (classes nothing measured add nothing: "
             "the last column gives their share). Cells in <span class='ok'>green</span> are built only from "
             "classes measured in this regime, <span class='ex'>blue</span> extrapolated from measurements "
             "elsewhere (another GPU model or rank count), <span class='nv'>orange</span> include a class nothing "
             "measured (e.g. inter-node collectives, attention); NOT VALIDATED where no part of the step was "
             "measured. Every number is explained in docs/planner.md.</p></div>")

    p.append("<h2>Step time at every scale</h2>")
    p.append(f"<p><img src='{imgs[0]}' alt='step time vs GPUs'></p>")
    for v in doc["variants"]:
        head, rows, classes = scale_rows(v, inp["token_budget"])
        p.append(f"<h3>{esc(v['name'])}</h3>")
        p.append(table(head, rows, row_classes=classes))
    p.append("<h3>Confidence of each number (baseline)</h3>")
    p.append("<p class='note'>The share of each step that comes from each class of operation, coloured by how well "
             "that class is measured in this use (the errors of each class are in \"Confidence by class of "
             "operation\" below). A step is validated when every class making up at least 5 % of it is.</p>")
    head, rows = class_share_rows(doc["variants"][0])
    p.append(table(head, rows))
    head, rows = checked_rows(doc["variants"][0])
    if rows:
        p.append("<p class='note'>How the critical stage's compute was checked: the share of its time in kernels "
                 "that measured whole training steps on this GPU ran (predicted as a whole, below), in kernels with "
                 "only a kernel model of this GPU, and in neither (another GPU's model scaled by the datasheets, "
                 "the GEMM model or the roofline).</p>")
        p.append(table(head, rows))
    p.append("<h2>Where the time goes</h2>")
    p.append(f"<p><img src='{imgs[1]}' alt='step breakdown'></p><p><img src='{imgs[2]}' alt='communication'></p>")
    p.append("<h2>Throughput, scaling efficiency, MFU</h2>")
    p.append(f"<p><img src='{imgs[3]}' alt='throughput'></p>")
    p.append("<h2>Layered vs fused</h2>")
    p.append(f"<p>{fused_status(doc)}. The layered variant runs every GEMM "
             "and then its collective (what a framework on a collective library does); the fused variant runs each "
             "pair below as one of this project's fused operators. No fused number is shown until the fused "
             "operators' model prices them.</p>")
    head, rows = fused_rows(doc)
    p.append(table(head, rows))
    g, head, rows = fused_op_rows(doc)
    if rows:
        p.append(f"<p>The pairs the fused variant replaces on the critical stage at {g} GPUs (baseline):</p>")
        p.append(table(head, rows, left=3))
    g, head, rows = fused_block_rows(doc)
    if rows:
        p.append(f"<p>The groups the fused variant runs as one operator on the critical stage at {g} GPUs "
                 "(baseline; a backward is modelled from the forward operator, docs/planner.md):</p>")
        p.append(table(head, rows, left=2))
    if what_if_png:
        p.append("<h2>What-ifs side by side</h2>")
        p.append(f"<p><img src='{what_if_png}' alt='what-ifs'></p>")
        head, rows = what_if_rows(doc)
        p.append(table(head, rows))
    if goodput_png:
        p.append("<h2>Stragglers and noise</h2>")
        p.append(f"<p><img src='{goodput_png}' alt='goodput'></p>")
    head, rows = failure_rows(doc)
    if rows:
        p.append("<h2>Goodput under failures</h2>")
        p.append("<p>First-order model (docs/planner.md, \"Goodput under failures\"): "
                 "ETTR = 1 - W/T - (T/2 + R + Q)/M; unknown where an input is missing.</p>")
        p.append(table(head, rows, left=1))
    p.append("<h2>What bounds each phase (baseline)</h2>")
    head, rows = bound_rows(doc)
    p.append(table(head, rows, left=3))
    p.append("<h2>Busiest links (largest scale of each variant, from SimGrid's link loads)</h2>")
    head, rows = link_rows(doc)
    p.append(table(head, rows, left=6))
    p.append("<h2>Confidence by class of operation</h2>")
    head, rows, classes = class_rows(doc)
    p.append(table(head, rows, left=3, row_classes=classes))
    summary, rows = step_rows(doc)
    if rows:
        p.append("<h2>Measured training steps against this planner</h2>")
        p.append(f"<p>{esc(summary)}. Each is a real step (forward, backward, optimizer) of a few layers on one GPU "
                 "(validation/tools/step_bench.py), priced as this plan prices its own (mk-plan --check-steps).</p>")
        p.append(table(["workload", "dtype", "GPU", "seq", "micro-batch x count", "measured", "predicted", "error"],
                       rows, left=3))
    note, rows = kernel_model_rows(doc)
    if rows:
        p.append("<h2>Kernel models (t = c0 + flops / R + bytes / B)</h2>")
        p.append(f"<p>{esc(note)}; the error is each shape predicted by the fit on the other shapes.</p>")
        p.append(table(["GPU", "class", "kernel", "dtype", "pass", "records", "c0 us", "R TFLOP/s", "B GB/s",
                        "leave-one-shape-out median |err| %", "max"], rows, left=5))
    p.append("<h2>Collectives simulated</h2>")
    head, rows, classes = collective_rows(doc)
    p.append(table(head, rows, left=4, row_classes=classes))
    g, rows = gemm_rows(doc)
    if rows:
        p.append(f"<h2>Kernels of the critical stage at {g} GPUs (baseline)</h2>")
        p.append(table(["kernel", "class", "m", "n", "k", "batch", "per step", "time", "TFLOP/s", "bound", "price"],
                       rows, left=2))
        p.append("<p>price: the kernel model of this GPU (kernel-model), another GPU's scaled by the datasheets "
                 "(extrapolated), the GEMM model, or UNMEASURED: a kernel no record of its class covers, priced by "
                 "the HBM roofline c0 + bytes / B (the step table gives its share of the compute time).</p>")
    p.append(f"<p><small>mk-plan commit {esc(doc['tool']['commit'])}; inputs and every number in plan.json; run "
             "statistics in run-stats.json.</small></p>")
    with open(os.path.join(a.out, "index.html"), "w") as f:
        f.write(page(f"mk-plan: {w['name']}", p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
