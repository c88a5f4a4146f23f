#!/usr/bin/env python3
"""mk-validate's report: index.html and PNG plots from mk-validate's JSON (schema mkernel.validation.v1).

    /usr/bin/python3 validation_report.py --json validation.json --out DIR

mk-validate --report DIR runs it (in a temporary directory it then renames), so it is rarely called by hand.
Writes DIR/index.html, DIR/time-<op>.png (measured and predicted time over size, one panel per algorithm,
log-log) and DIR/error-<op>.png (error % over size, per algorithm). Needs matplotlib (Debian's
python3-matplotlib: use /usr/bin/python3, not pyenv's). Exit codes: 0 done, 2 bad input, 3 no matplotlib.
"""
import argparse
import json
import math
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_common import esc, fmt, import_pyplot, page, table  # noqa: E402
from report_common import fail as _fail  # noqa: E402


def fail(msg, code=2):
    _fail("validation_report.py", msg, code)


def abs_stats(errs):
    """n, median, p90 (linear interpolation between order statistics), max of |errs|: as mk::errorStats."""
    a = sorted(abs(e) for e in errs)
    n = len(a)
    if n == 0:
        return 0, 0.0, 0.0, 0.0
    med = a[n // 2] if n % 2 else 0.5 * (a[n // 2 - 1] + a[n // 2])
    pos = 0.9 * (n - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return n, med, a[lo] + (pos - lo) * (a[hi] - a[lo]), a[-1]


def size_label(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


def plot_op(plt, op, algos, out):
    """time-<op>.png and error-<op>.png; returns their file names."""
    names = list(algos)
    ncols = min(3, len(names))
    nrows = (len(names) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.0 * nrows), squeeze=False)
    for k, algo in enumerate(names):
        ax = axes[k // ncols][k % ncols]
        rows = sorted(algos[algo], key=lambda r: r["bytes"])
        xs = [r["bytes"] for r in rows]
        ax.loglog(xs, [r["measured_us"] for r in rows], "o", color="black", ms=4, label="measured")
        ax.loglog(xs, [r["sim_us"] for r in rows], "-", color="tab:blue", label="simulated")
        cf = [(r["bytes"], r["closed_us"]) for r in rows if r["closed_us"] is not None]
        if cf:
            ax.loglog([c[0] for c in cf], [c[1] for c in cf], "--", color="tab:orange", label="closed form")
        ax.set_title(f"{op} {algo}")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("time (us)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for k in range(len(names), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    fig.tight_layout()
    time_png = f"time-{op}.png"
    fig.savefig(os.path.join(out, time_png), dpi=100)
    plt.close(fig)

    fig, (ax_sim, ax_cf) = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for algo in names:
        rows = sorted(algos[algo], key=lambda r: r["bytes"])
        xs = [r["bytes"] for r in rows]
        ax_sim.semilogx(xs, [r["sim_err_pct"] for r in rows], "o-", ms=3, label=algo)
        cf = [(r["bytes"], r["closed_err_pct"]) for r in rows if r["closed_err_pct"] is not None]
        if cf:
            ax_cf.semilogx([c[0] for c in cf], [c[1] for c in cf], "o--", ms=3, label=algo)
    for ax, what in ((ax_sim, "simulator"), (ax_cf, "closed form")):
        ax.axhline(0, color="black", lw=0.8)
        ax.axhspan(-5, 5, color="tab:green", alpha=0.12, label="+-5 %")
        ax.set_title(f"{op}: {what} error vs size")
        ax.set_xlabel("size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_sim.set_ylabel("(predicted - measured) / measured (%)")
    fig.tight_layout()
    err_png = f"error-{op}.png"
    fig.savefig(os.path.join(out, err_png), dpi=100)
    plt.close(fig)
    return time_png, err_png


def row_cells(r):
    return [r["op"], r["algo"], r["bytes"], f'{r["chunks"]}x{r["channels"]}' + (" in place" if r["inplace"] else ""),
            fmt(r["measured_us"]), fmt(r["sim_us"]), fmt(r["closed_us"]), fmt(r["sim_err_pct"], 1),
            fmt(r["closed_err_pct"], 1), f'{r["file"]} [{r["index"]}]']


ROW_HEAD = ["op", "algo", "bytes", "chunks x channels", "measured (us)", "simulated (us)", "closed form (us)",
            "sim err %", "closed err %", "record"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="mk-validate --json output (mkernel.validation.v1)")
    ap.add_argument("--out", required=True, help="directory to write index.html and the PNGs into (must exist)")
    a = ap.parse_args()
    plt = import_pyplot("validation_report.py", "mk-validate --python")
    try:
        with open(a.json) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{a.json}: {e}")
    if doc.get("schema") != "mkernel.validation.v1":
        fail(f'{a.json}: expected schema "mkernel.validation.v1" (got {doc.get("schema")!r})')
    if not os.path.isdir(a.out):
        fail(f"--out {a.out} is not a directory")
    try:
        rows, summary, profile = doc["rows"], doc["summary"], doc["profile"]
    except KeyError as e:
        fail(f"{a.json}: missing {e}")

    by_op = OrderedDict()
    for r in rows:
        by_op.setdefault(r["op"], OrderedDict()).setdefault(r["algo"], []).append(r)
    plots = [(op, *plot_op(plt, op, algos, a.out)) for op, algos in by_op.items()]

    sim, cf = summary["sim"], summary["closed_form"]
    parts = [f"<h1>mk-validate: measured vs predicted on {esc(doc.get('cluster', '?'))}</h1>",
             "<h2>Summary</h2>",
             f"<pre>validation: n={sim['n']} median_abs_err_pct={sim['median_abs_err_pct']:.2f} "
             f"p90_abs_err_pct={sim['p90_abs_err_pct']:.2f} max_abs_err_pct={sim['max_abs_err_pct']:.2f}   (simulator, gated)\n"
             f"closed form: n={cf['n']} median_abs_err_pct={cf['median_abs_err_pct']:.2f} "
             f"p90_abs_err_pct={cf['p90_abs_err_pct']:.2f} max_abs_err_pct={cf['max_abs_err_pct']:.2f}</pre>"]
    if "nccl" in summary:
        nc = summary["nccl"]
        parts.append(f"<pre>nccl: n={nc['n']} median_abs_err_pct={nc['median_abs_err_pct']:.2f} "
                     f"p90_abs_err_pct={nc['p90_abs_err_pct']:.2f} max_abs_err_pct={nc['max_abs_err_pct']:.2f}"
                     "   (impl nccl records, the layered baseline: docs/algorithms-nccl.md)</pre>")
    if summary.get("max_median_err_pct") is not None:
        ok = summary.get("gate_passed")
        parts.append(f"<p class='{'' if ok else 'bad'}'>Gate: the simulator's median absolute error must not exceed "
                     f"{summary['max_median_err_pct']} %: <b>{'passed' if ok else 'FAILED'}</b>.</p>")
    parts.append("<p>Error = (predicted - measured) / measured x 100. Predictions replay the schedule regenerated "
                 "from each record's own fields (op, algorithm, dtype, ranks, count, chunks, channels) in the "
                 "SimGrid simulator (exact mode) and evaluate the closed form; measured numbers are shown as "
                 "recorded, with no per-size or per-algorithm correction.</p>")
    parts.append(f"<p><b>How the profile was obtained.</b> {esc(doc.get('honesty', ''))}</p>")
    parts.append(f"<p>{summary.get('ignored', 0)} records of other kinds (NCCL baselines, calib-* micro-benchmarks, "
                 f"enqueue-to-first-step) were ignored, {summary.get('filtered', 0)} left out by --op/--algo, "
                 f"{summary.get('skipped', 0)} skipped as not regenerable.</p>")

    parts.append("<h2>Profile</h2>")
    prov = profile.get("provenance", {})
    parts.append(f"<p>{esc(profile.get('path') or 'datasheet defaults (no file)')}: {esc(profile.get('source', ''))}</p>")
    values = []

    def flatten(prefix, obj):  # nested objects (protocols.ll.latencyUs, transport.kind) become dotted names
        for k, v in obj.items():
            name = f"{prefix}{k}"
            if isinstance(v, dict):
                flatten(name + ".", v)
            elif isinstance(v, list) or (isinstance(v, (int, float)) and not isinstance(v, bool)):
                values.append((name, v))
            elif isinstance(v, str) and prefix:
                values.append((name, v))

    def shown(v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f"{v:.6g}"
        if isinstance(v, list):  # a ramp or efficiency curve: bytes -> fraction
            return ", ".join(f"{p.get('bytes', 0):.6g} B: {p.get('fraction', 0):.4g}" if isinstance(p, dict) else str(p)
                             for p in v) or "none"
        return str(v)

    flatten("", {k: v for k, v in profile.items() if k != "provenance"})
    parts.append(table(["parameter", "value"], [(k, shown(v)) for k, v in values]))
    if prov:
        parts.append(table(["provenance", ""], [(k, "; ".join(v) if isinstance(v, list) else v) for k, v in prov.items()]))

    parts.append("<h2>Files</h2>")
    parts.append(table(["file", "system", "run commit", "records", "validated", "ignored", "left out", "skipped"],
                       [(f["path"], f["system"], f["run_commit"], f["records"], f["validated"], f["ignored"],
                         f["filtered"], f["skipped"]) for f in doc.get("files", [])]))

    parts.append("<h2>Error by op and algorithm</h2>")
    stat_rows = []
    for op, algos in by_op.items():
        for algo, rs in algos.items():
            n, med, p90, mx = abs_stats([r["sim_err_pct"] for r in rs])
            cfe = [r["closed_err_pct"] for r in rs if r["closed_err_pct"] is not None]
            _, cmed, _, cmx = abs_stats(cfe)
            worst = max(rs, key=lambda r: abs(r["sim_err_pct"]))
            stat_rows.append((op, algo, n, fmt(med), fmt(p90), fmt(mx), size_label(worst["bytes"]),
                              fmt(cmed) if cfe else "-", fmt(cmx) if cfe else "-"))
    parts.append(table(["op", "algo", "n", "sim median |err| %", "sim p90", "sim max", "worst size",
                        "closed median |err| %", "closed max"], stat_rows))

    parts.append("<h2>Plots</h2>")
    for op, time_png, err_png in plots:
        parts.append(f"<h3>{esc(op)}</h3><p><img src=\"{esc(time_png)}\" alt=\"{esc(op)}: time vs size\"></p>"
                     f"<p><img src=\"{esc(err_png)}\" alt=\"{esc(op)}: error vs size\"></p>")

    tr = doc.get("trace")
    if tr:
        rec = tr["record"]
        parts.append("<h2>Per-step trace</h2>")
        parts.append(f"<p><a href=\"{esc(tr['file'])}\">{esc(tr['file'])}</a> (open in ui.perfetto.dev or "
                     f"chrome://tracing): {esc(rec['op'])} {esc(rec['algo'])} {rec['bytes']} B, "
                     f"{esc(rec['file'])} records[{rec['index']}], measured {fmt(rec['measured_us'])} us, "
                     f"simulated {fmt(rec['sim_us'])} us ({fmt(rec['sim_err_pct'], 1)} %).</p>")
        parts.append(f"<p>{esc(tr['note'])}.</p>")
        steps = tr.get("steps", [])
        if tr.get("measured_trace"):
            measured = [s for s in steps if s["meas_dur_us"] is not None]
            measured.sort(key=lambda s: -abs(s["meas_dur_us"] - s["sim_dur_us"]))
            parts.append("<p>The steps whose measured and predicted durations disagree most:</p>")
            parts.append(table(["rank", "lane", "step", "kind", "measured start", "measured dur", "sim start",
                                "sim dur", "dur diff (us)"],
                               [(s["rank"], s["lane"], s["step"], s["kind"], fmt(s["meas_start_us"], 3),
                                 fmt(s["meas_dur_us"], 3), fmt(s["sim_start_us"], 3), fmt(s["sim_dur_us"], 3),
                                 fmt(s["meas_dur_us"] - s["sim_dur_us"], 3)) for s in measured[:15]]))
        else:
            parts.append("<p>No measured trace was given (mk-bench --trace, then mk-validate --measured-trace): "
                         "the trace holds the predicted timeline only. Its longest steps:</p>")
            longest = sorted(steps, key=lambda s: -s["sim_dur_us"])[:15]
            parts.append(table(["rank", "lane", "step", "kind", "sim start", "sim dur"],
                               [(s["rank"], s["lane"], s["step"], s["kind"], fmt(s["sim_start_us"], 3),
                                 fmt(s["sim_dur_us"], 3)) for s in longest]))

    parts.append("<h2>Worst records</h2>")
    worst = sorted(rows, key=lambda r: -abs(r["sim_err_pct"]))[:20]
    parts.append(table(ROW_HEAD, [row_cells(r) for r in worst]))
    if doc.get("skipped"):
        parts.append("<h2>Skipped records</h2>")
        parts.append(table(["file", "record", "reason"], [(s["file"], s["index"], s["reason"]) for s in doc["skipped"]]))
    parts.append(f"<h2>All {len(rows)} records</h2><details><summary>table</summary>")
    parts.append(table(ROW_HEAD, [row_cells(r) for r in rows]))
    parts.append("</details>")
    tool = doc.get("tool", {})
    parts.append(f"<p><small>{esc(tool.get('command', ''))} (mk-validate commit {esc(tool.get('commit', '?'))})"
                 "</small></p>")
    with open(os.path.join(a.out, "index.html"), "w") as f:
        f.write(page("mk-validate report", parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
