#!/usr/bin/env python3
"""Markdown tables of committed mk-bench measurement files (mkernel.measurement.v1), for docs/results.md.

    validation/report/measured_tables.py validation/data/measured/2026-11-30-h200x2-5400cad-allreduce.json ...

Numbers are printed as stored (median over reps); nothing is rounded beyond the display format below.
"""
import json
import sys

SIZES = [8, 1024, 32768, 1 << 20, 16 << 20, 64 << 20, 512 << 20]


def label(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def main(paths):
    for path in paths:
        d = json.load(open(path))
        recs = [r for r in d["records"] if r.get("stat") == "median" and r["op"] in
                ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall")]
        if not recs:
            continue
        op = recs[0]["op"]
        def column(r):  # "auto:ring" -> "auto": one column whatever auto chose (the cell names the choice)
            a = r.get("algo", "")
            return "auto" if a.startswith("auto") else a

        algos = []
        for r in recs:
            key = (r["impl"], column(r))
            if r["impl"] == "mkernel" and key not in algos:
                algos.append(key)
        print(f"\n**{op}**, {d['system']['gpus']} x {d['system']['gpu']} ({d['system'].get('link', '')}), "
              f"{recs[0]['dtype']}, commit `{d['run']['commit'][:10]}`, `{d['run']['command']}`\n")
        cols = [a for _, a in algos] + ["nccl"]
        print("| size | " + " | ".join(f"{c} µs (busbw GB/s)" for c in cols) + " |")
        print("|---:|" + "---:|" * len(cols))
        for size in SIZES:
            row = []
            for c in cols:
                impl = "nccl" if c == "nccl" else "mkernel"
                hit = [r for r in recs if r["bytes"] == size and r["impl"] == impl and (impl == "nccl" or column(r) == c)]
                choice = f" {hit[0]['algo'][5:]}" if hit and c == "auto" else ""
                row.append(f"{hit[0]['time_us']:.2f} ({hit[0]['busbw_gbs']:.1f}){choice}" if hit else "–")
            print(f"| {label(size)} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
