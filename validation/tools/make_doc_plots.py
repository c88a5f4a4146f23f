#!/usr/bin/env python3
"""Every plot in docs/img/, generated from the committed data, and the manifest that keeps them honest.

    /usr/bin/python3 validation/tools/make_doc_plots.py [--mk-validate build/validation/mk-validate]
    /usr/bin/python3 validation/tools/make_doc_plots.py --check

Generate (from the repository root): mk-validate judges the committed 2 x H200 collective measurements
(validation/data/measured/*-h200x2-*.json, calibration files excepted) with the committed profile
(validation/data/profiles/h200x2-calibrated.json), exactly what docs/results.md quotes; the report's plot code
(validation/report/validation_plots.py) draws docs/img/validation/{time,error}-<op>.png; docs/img/plots.json
records the SHA-256 of every input (the data, the profile, the plot code in validation_plots.py), of every plot,
and the validation summary the plots show.

--check (no build, no matplotlib): exit 1, naming the file, when an input changed since the plots were drawn (the
plots are older than the data), when a plot was edited or is missing, or when the manifest is absent; exit 0
when the plots match the data. With --mk-validate as well, it also runs mk-validate and fails when the model now
gives other numbers than the plots show (a model change, not a data change, made them stale). The CTest "docs:
docs/img plots match the committed data" runs it.
Exit codes: 0 ok, 1 stale plots (--check), 2 bad input, 3 no matplotlib or mk-validate failed.
"""
import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections import OrderedDict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = os.path.join(ROOT, "validation", "report")
MANIFEST = os.path.join("docs", "img", "plots.json")
OUT_DIR = os.path.join("docs", "img", "validation")
PROFILE = os.path.join("validation", "data", "profiles", "h200x2-calibrated.json")
TOOL = "make_doc_plots.py"


def fail(msg, code=2):
    print(f"{TOOL}: error: {msg}", file=sys.stderr)
    sys.exit(code)


def data_files():
    files = sorted(glob.glob(os.path.join(ROOT, "validation", "data", "measured", "*-h200x2-*.json")))
    return [os.path.relpath(f, ROOT) for f in files if not f.endswith("-calibration.json")]


def inputs():
    """Repository-relative paths of everything the plots are drawn from, in a fixed order."""
    return data_files() + [PROFILE, os.path.join("validation", "report", "validation_plots.py")]


def sha256(path):
    h = hashlib.sha256()
    with open(os.path.join(ROOT, path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run_validate(mk_validate):
    """mk-validate's JSON document on the inputs (exit 3 when it fails)."""
    if not os.access(mk_validate, os.X_OK):
        fail(f"--mk-validate {mk_validate}: not an executable (build it: make -C build mk-validate)")
    with tempfile.TemporaryDirectory() as tmp:
        out_json = os.path.join(tmp, "validation.json")
        cmd = [mk_validate, "--profile", PROFILE, "--cluster", "h200x2", "--json", out_json] + data_files()
        r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            fail(f"mk-validate exited {r.returncode}: {r.stdout.strip().splitlines()[-1:]}", 3)
        with open(out_json) as f:
            return json.load(f)


def summary_of(doc):
    return {k: doc["summary"][k] for k in ("sim", "closed_form")}


def check(manifest_path, mk_validate=None):
    try:
        with open(os.path.join(ROOT, manifest_path)) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{manifest_path}: {e}: run {TOOL} to draw the plots")
        return 1
    stale = []
    want = inputs()
    recorded = m.get("inputs", {})
    for path in want:
        if path not in recorded:
            stale.append(f"{path}: a new input, not in {manifest_path}")
        elif recorded[path] != sha256(path):
            stale.append(f"{path}: changed since the plots were drawn")
    for path in recorded:
        if path not in want:
            stale.append(f"{path}: drawn from, but no longer an input (removed?)")
    for path, digest in m.get("plots", {}).items():
        if not os.path.exists(os.path.join(ROOT, path)):
            stale.append(f"{path}: missing")
        elif sha256(path) != digest:
            stale.append(f"{path}: not the plot {TOOL} drew (edited by hand?)")
    if not m.get("plots"):
        stale.append(f"{manifest_path}: lists no plot")
    if mk_validate and not stale:
        now = summary_of(run_validate(mk_validate))
        for line, stats in now.items():
            shown = m.get("summary", {}).get(line, {})
            for key, value in stats.items():
                if key not in shown or abs(shown[key] - value) > 0.005:
                    stale.append(f"the model now gives {line}.{key} = {value:.2f}, the plots show "
                                 f"{shown.get(key, 'nothing')}: the model changed since they were drawn")
    for line in stale:
        print(f"stale: {line}")
    if stale:
        print(f"docs/img is out of date: regenerate with /usr/bin/python3 validation/tools/{TOOL} "
              "(needs a build with mk-validate) and commit the plots and the manifest")
        return 1
    print(f"docs/img: {len(m['plots'])} plots match their {len(want)} inputs")
    return 0


def generate(mk_validate):
    sys.path.insert(0, REPORT)
    from report_common import import_pyplot  # noqa: E402
    from validation_plots import plot_op  # noqa: E402
    plt = import_pyplot(TOOL, "run it with /usr/bin/python3")
    doc = run_validate(mk_validate)
    by_op = OrderedDict()
    for row in doc["rows"]:
        by_op.setdefault(row["op"], OrderedDict()).setdefault(row["algo"], []).append(row)
    out = os.path.join(ROOT, OUT_DIR)
    os.makedirs(out, exist_ok=True)
    plots = []
    for op, algos in by_op.items():
        plots += [os.path.join(OUT_DIR, p) for p in plot_op(plt, op, algos, out)]
    for old in glob.glob(os.path.join(out, "*.png")):
        if os.path.relpath(old, ROOT) not in plots:
            os.remove(old)  # a plot of an op no longer measured
    summary = summary_of(doc)
    manifest = OrderedDict(
        [("generator", f"validation/tools/{TOOL}"),
         ("command", f"mk-validate --profile {PROFILE} --cluster h200x2 --json J <the measured files of inputs>"),
         ("summary", summary),
         ("inputs", OrderedDict((p, sha256(p)) for p in inputs())),
         ("plots", OrderedDict((p, sha256(p)) for p in sorted(plots)))])
    with open(os.path.join(ROOT, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    s = summary["sim"]
    print(f"{len(plots)} plots in {OUT_DIR}; validation: n={s['n']} median_abs_err_pct={s['median_abs_err_pct']:.2f} "
          f"p90_abs_err_pct={s['p90_abs_err_pct']:.2f} max_abs_err_pct={s['max_abs_err_pct']:.2f}; {MANIFEST} written")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only verify that the plots match their inputs")
    ap.add_argument("--manifest", default=MANIFEST, help="the manifest to check (default: %(default)s)")
    ap.add_argument("--mk-validate", help="the mk-validate to run (default: build/validation/mk-validate; with "
                    "--check: none, the model's numbers are then not compared)")
    a = ap.parse_args()
    if a.check:
        return check(a.manifest, a.mk_validate and os.path.abspath(a.mk_validate))
    return generate(os.path.abspath(a.mk_validate or os.path.join(ROOT, "build", "validation", "mk-validate")))


if __name__ == "__main__":
    sys.exit(main())
