#!/usr/bin/env python3
"""mk-validate's report: index.html and PNG plots from mk-validate's JSON (schema mkernel.validation.v1).

    /usr/bin/python3 validation_report.py --json validation.json --out DIR

mk-validate --report DIR runs it (in a temporary directory it then renames), so it is rarely called by hand.
Writes DIR/index.html (from templates/validation.html.j2), DIR/time-<op>.png (measured and predicted time over
size, one panel per algorithm, log-log) and DIR/error-<op>.png (error % over size, per algorithm). Needs
matplotlib and jinja2 (Debian's python3-matplotlib and python3-jinja2: use /usr/bin/python3, not pyenv's).
Exit codes: 0 done, 2 bad input, 3 no matplotlib or no jinja2.
"""
import argparse
import json
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_common import abs_stats, fmt, import_jinja, import_pyplot, render  # noqa: E402
from report_common import fail as _fail  # noqa: E402
from validation_plots import plot_op, size_label  # noqa: E402

TOOL = "validation_report.py"

# Units of profile parameters, by the end of their name (mkernel.profile.v1: docs/simulator.md).
UNITS = (("Us", "µs"), ("GBs", "GB/s"), ("Tflops", "TFLOP/s"), ("Fraction", "fraction of peak"),
         ("efficiency", "bytes: fraction of peak"), ("amp", "bytes: fraction of peak"), ("sms", "SMs"),
         ("inFlight", "messages"))


def fail(msg, code=2):
    _fail(TOOL, msg, code)


def unit_of(name):
    """The unit of a dotted profile name: its last part's, or an enclosing part's (nccl.baseUs.ll is in µs)."""
    for part in reversed(name.split(".")):
        for suffix, unit in UNITS:
            if part.endswith(suffix):
                return unit
    return ""


def profile_rows(profile):
    """(parameter, value, unit) for every number, list and nested string of the profile."""
    rows = []

    def shown(v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f"{v:.4g}" if isinstance(v, float) else str(v)
        if isinstance(v, list):  # a ramp or efficiency curve: bytes -> fraction
            pts = [f"{size_label(p.get('bytes', 0))}: {p.get('fraction', 0):.3f}" if isinstance(p, dict) else str(p)
                   for p in v]
            return (", ".join(pts) or "none", "w")
        return (str(v), "w")

    def flatten(prefix, obj):  # nested objects (protocols.ll.latencyUs, transport.kind) become dotted names
        for k, v in obj.items():
            name = f"{prefix}{k}"
            if isinstance(v, dict):
                flatten(name + ".", v)
            elif isinstance(v, list) or (isinstance(v, (int, float)) and not isinstance(v, bool)):
                rows.append((name, shown(v), unit_of(name)))
            elif isinstance(v, str) and prefix:
                rows.append((name, shown(v), ""))

    flatten("", {k: v for k, v in profile.items() if k not in ("provenance", "path", "source", "schema")})
    return rows


ROW_COLUMNS = [("op", "t"), ("algo", "t"), ("size", "n"), ("bytes", "n"), ("chunks × channels", "t"),
               ("measured (µs)", "n"), ("simulated (µs)", "n"), ("closed form (µs)", "n"), ("sim error (%)", "n"),
               ("closed-form error (%)", "n"), ("record", "t")]


def row_cells(r):
    return [r["op"], r["algo"], size_label(r["bytes"]), r["bytes"],
            f'{r["chunks"]} × {r["channels"]}' + (", in place" if r["inplace"] else ""), fmt(r["measured_us"]),
            fmt(r["sim_us"]), fmt(r["closed_us"]), fmt(r["sim_err_pct"], 1), fmt(r["closed_err_pct"], 1),
            f'{os.path.basename(r["file"])} [{r["index"]}]']  # the Files table gives the whole path


def headline(doc, by_op):
    """The validation numbers in one sentence."""
    s = doc["summary"]
    sim, cf = s["sim"], s["closed_form"]
    ops = ", ".join(by_op)
    text = (f"Across {sim['n']} measured runs ({ops}) the simulator is within {sim['median_abs_err_pct']:.1f} % of "
            f"the measured time at the median and {sim['p90_abs_err_pct']:.1f} % at p90 (worst "
            f"{sim['max_abs_err_pct']:.1f} %); the closed form is within {cf['median_abs_err_pct']:.1f} % median, "
            f"{cf['p90_abs_err_pct']:.1f} % at p90.")
    if "nccl" in s and s["nccl"].get("n"):
        nc = s["nccl"]
        text += (f" The layered baseline's {nc['n']} NCCL runs are predicted within {nc['median_abs_err_pct']:.1f} % "
                 f"median, {nc['p90_abs_err_pct']:.1f} % at p90 (docs/algorithms-nccl.md).")
    return text


def trace_section(tr):
    rec = tr["record"]
    out = {"file": tr["file"], "note": tr["note"].rstrip("."),
           "what": (f"{rec['op']} {rec['algo']} {size_label(rec['bytes'])}, {rec['file']} records[{rec['index']}], "
                    f"measured {fmt(rec['measured_us'])} µs, simulated {fmt(rec['sim_us'])} µs "
                    f"({fmt(rec['sim_err_pct'], 1)} %)")}
    steps = tr.get("steps", [])
    if tr.get("measured_trace"):
        measured = sorted((s for s in steps if s["meas_dur_us"] is not None),
                          key=lambda s: -abs(s["meas_dur_us"] - s["sim_dur_us"]))[:15]
        out["caption"] = "The steps whose measured and predicted durations disagree most:"
        out["columns"] = [("rank", "n"), ("lane", "n"), ("step", "n"), ("kind", "t"), ("measured start (µs)", "n"),
                          ("measured duration (µs)", "n"), ("simulated start (µs)", "n"),
                          ("simulated duration (µs)", "n"), ("duration difference (µs)", "n")]
        out["rows"] = [(s["rank"], s["lane"], s["step"], s["kind"], fmt(s["meas_start_us"], 3),
                        fmt(s["meas_dur_us"], 3), fmt(s["sim_start_us"], 3), fmt(s["sim_dur_us"], 3),
                        fmt(s["meas_dur_us"] - s["sim_dur_us"], 3)) for s in measured]
    else:
        out["caption"] = "The longest predicted steps:"
        out["columns"] = [("rank", "n"), ("lane", "n"), ("step", "n"), ("kind", "t"), ("simulated start (µs)", "n"),
                          ("simulated duration (µs)", "n")]
        out["rows"] = [(s["rank"], s["lane"], s["step"], s["kind"], fmt(s["sim_start_us"], 3), fmt(s["sim_dur_us"], 3))
                       for s in sorted(steps, key=lambda s: -s["sim_dur_us"])[:15]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="mk-validate --json output (mkernel.validation.v1)")
    ap.add_argument("--out", required=True, help="directory to write index.html and the PNGs into (must exist)")
    a = ap.parse_args()
    plt = import_pyplot(TOOL, "mk-validate --python")
    env = import_jinja(TOOL)
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
        sim = summary["sim"]
    except KeyError as e:
        fail(f"{a.json}: missing {e}")

    by_op = OrderedDict()
    for r in rows:
        by_op.setdefault(r["op"], OrderedDict()).setdefault(r["algo"], []).append(r)
    plots = [dict(zip(("op", "time_png", "err_png"), (op, *plot_op(plt, op, algos, a.out))))
             for op, algos in by_op.items()]

    stat_rows = []
    for op, algos in by_op.items():
        for algo, rs in algos.items():
            n, med, p90, mx = abs_stats([r["sim_err_pct"] for r in rs])
            cfe = [r["closed_err_pct"] for r in rs if r["closed_err_pct"] is not None]
            _, cmed, _, cmx = abs_stats(cfe)
            worst = max(rs, key=lambda r: abs(r["sim_err_pct"]))
            stat_rows.append((op, algo, n, fmt(med, 1), fmt(p90, 1), fmt(mx, 1), size_label(worst["bytes"]),
                              fmt(cmed, 1) if cfe else "-", fmt(cmx, 1) if cfe else "-"))
    gate = None
    if summary.get("max_median_err_pct") is not None:
        gate = {"limit": summary["max_median_err_pct"], "value": f"{sim['median_abs_err_pct']:.2f}",
                "passed": bool(summary.get("gate_passed"))}
    tool = doc.get("tool", {})
    html = render(
        env, "validation.html.j2", title=f"mk-validate: {doc.get('cluster', '?')}", cluster=doc.get("cluster", "?"),
        profile_name=profile.get("path") or "datasheet defaults (no file)", profile_source=profile.get("source", ""),
        headline=headline(doc, by_op),
        cards=[(str(sim["n"]), "measured runs"), (f"{sim['median_abs_err_pct']:.1f} %", "median |error|"),
               (f"{sim['p90_abs_err_pct']:.1f} %", "p90 |error|"), (f"{sim['max_abs_err_pct']:.1f} %", "worst |error|")],
        gate=gate, honesty=doc.get("honesty", ""),
        counts=(f"{summary.get('ignored', 0)} records of other kinds (NCCL baselines, calib-* micro-benchmarks, "
                f"enqueue-to-first-step) were ignored, {summary.get('filtered', 0)} left out by --op/--algo, "
                f"{summary.get('skipped', 0)} skipped as not regenerable."),
        stat_columns=[("op", "t"), ("algo", "t"), ("runs", "n"), ("simulator median |error| (%)", "n"),
                      ("simulator p90 (%)", "n"), ("simulator worst (%)", "n"), ("worst at size", "n"),
                      ("closed form median |error| (%)", "n"), ("closed form worst (%)", "n")],
        stat_rows=stat_rows, plots=plots, trace=trace_section(doc["trace"]) if doc.get("trace") else None,
        row_columns=ROW_COLUMNS,
        worst_rows=[row_cells(r) for r in sorted(rows, key=lambda r: -abs(r["sim_err_pct"]))[:20]],
        all_rows=[row_cells(r) for r in rows],
        skipped_rows=[(s["file"], s["index"], s["reason"]) for s in doc.get("skipped", [])],
        profile_rows=profile_rows(profile),
        provenance_rows=[(k, "; ".join(v) if isinstance(v, list) else v)
                         for k, v in profile.get("provenance", {}).items()],
        file_columns=[("file", "t"), ("system", "t"), ("run commit", "t"), ("records", "n"), ("validated", "n"),
                      ("ignored", "n"), ("left out", "n"), ("skipped", "n")],
        file_rows=[(f["path"], f["system"], f["run_commit"][:12], f["records"], f["validated"], f["ignored"],
                    f["filtered"], f["skipped"]) for f in doc.get("files", [])],
        footer=f"{tool.get('command', '')} (mk-validate commit {tool.get('commit', '?')})")
    with open(os.path.join(a.out, "index.html"), "w") as f:
        f.write(html + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
