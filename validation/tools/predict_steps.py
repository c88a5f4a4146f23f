#!/usr/bin/env python3
"""Predict every training-step record of a measurement file (validation/tools/step_bench.py's "op": "step") with
mk-plan on one GPU of a cluster, and print measured against predicted with the signed error and the median / max
|error| (issue 32, item 5). Each record carries the workload mk-plan reads.

  validation/tools/predict_steps.py STEPS.json [--mk-plan build/validation/plan/mk-plan] [--cluster dgx-h100]

Exit 2 for bad input (a file without step records, an mk-plan that is not there), 1 when mk-plan fails a record.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", help="measurement file with step records")
    ap.add_argument("--mk-plan", default="build/validation/plan/mk-plan", help="the mk-plan to run")
    ap.add_argument("--cluster", default="dgx-h100", help="cluster preset or topology file of the records' GPU")
    a = ap.parse_args()
    if not os.access(a.mk_plan, os.X_OK):
        sys.stderr.write("predict_steps.py: --mk-plan %s is not an executable (build it first)\n" % a.mk_plan)
        return 2
    try:
        records = [r for r in json.load(open(a.steps))["records"] if r.get("op") == "step"]
    except (OSError, ValueError, KeyError, TypeError) as ex:
        sys.stderr.write("predict_steps.py: %s: %s\n" % (a.steps, ex))
        return 2
    if not records:
        sys.stderr.write("predict_steps.py: %s has no step record\n" % a.steps)
        return 2
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, r in enumerate(records):
            wl, out = os.path.join(tmp, "w%d.json" % i), os.path.join(tmp, "p%d.json" % i)
            json.dump(r["workload"], open(wl, "w"))
            p = subprocess.run([a.mk_plan, "--workload", wl, "--cluster", a.cluster, "--gpus", "1", "--json", out],
                               capture_output=True, text=True)
            if p.returncode:
                sys.stderr.write("predict_steps.py: record %d: mk-plan exit %d: %s\n" %
                                 (i, p.returncode, p.stderr.strip().splitlines()[-1:]))
                return 1
            pred = json.load(open(out))["variants"][0]["scales"][0]["layered"]["step_us"]
            e = pred / r["time_us"] - 1
            errors.append(abs(e))
            print("%-14s seq %5d mb %d x %d  measured %8.1f ms  predicted %8.1f ms  %+6.1f %%" %
                  (r.get("model", "?"), r["seq"], r["micro_batch"], r["micro_batches"], r["time_us"] / 1e3,
                   pred / 1e3, 100 * e))
    print("n=%d median |error| %.1f %%, max %.1f %%" % (len(errors), 100 * statistics.median(errors),
                                                         100 * max(errors)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
