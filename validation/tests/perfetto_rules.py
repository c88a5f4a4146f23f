#!/usr/bin/env python3
"""Checks a Chrome trace-event JSON file against the rules Perfetto's JSON importer applies, so a trace that
passes is shown as written (no slice dropped, no track merged).

    perfetto_rules.py TRACE.json [TRACE.json ...]

Rules (a violation of any of them is reported, one line each, and the exit code is 1):
  * the file is an object with a "traceEvents" array (or a bare array of events);
  * every "X" slice has finite "ts" and "dur" with dur >= 0; every "B" has a matching "E" on its track;
  * pid and tid are integers and tid != 0 (Perfetto treats tid 0 as "no thread" and merges it into another
    track);
  * on one (pid, tid) track two slices either nest or are disjoint: a partial overlap makes the importer drop
    the later slice. Times are compared in integer nanoseconds (ts and dur in microseconds, rounded to 1 ns:
    the importer's resolution);
  * every track with a slice has a process_name and a thread_name metadata event.
Exit codes: 0 all rules hold, 1 a rule is broken, 2 unreadable input.
"""
import json
import math
import sys
from collections import defaultdict


def to_ns(us):
    return int(round(us * 1000.0))


def check(doc):
    """Returns (number of slices, list of violation lines)."""
    events = doc if isinstance(doc, list) else doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        return 0, ['expected an object with a "traceEvents" array']
    bad = []
    tracks = defaultdict(list)  # (pid, tid) -> [(start ns, end ns, index)]
    open_b = defaultdict(list)
    named_pid, named_tid = set(), set()
    slices = 0
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            bad.append(f"traceEvents[{i}]: not an object")
            continue
        ph = e.get("ph")
        pid, tid = e.get("pid"), e.get("tid")
        if ph == "M":
            if e.get("name") == "process_name":
                named_pid.add(pid)
            elif e.get("name") == "thread_name":
                named_tid.add((pid, tid))
                if tid == 0:
                    bad.append(f"traceEvents[{i}]: thread_name for tid 0 (pid {pid})")
            continue
        if ph not in ("X", "B", "E"):
            continue
        if not isinstance(pid, int) or not isinstance(tid, int):
            bad.append(f"traceEvents[{i}]: pid and tid must be integers")
            continue
        if tid == 0:
            bad.append(f"traceEvents[{i}]: tid 0 (pid {pid}) is 'no thread' to Perfetto")
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or not math.isfinite(ts):
            bad.append(f"traceEvents[{i}]: ts {ts!r} is not a finite number")
            continue
        if ph == "X":
            slices += 1
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or not math.isfinite(dur) or dur < 0:
                bad.append(f"traceEvents[{i}]: dur {dur!r} must be a finite number >= 0")
                continue
            tracks[(pid, tid)].append((to_ns(ts), to_ns(ts) + to_ns(dur), i))
        elif ph == "B":
            open_b[(pid, tid)].append((to_ns(ts), i))
        else:
            if not open_b[(pid, tid)]:
                bad.append(f"traceEvents[{i}]: E without an open B on pid {pid} tid {tid}")
                continue
            start, j = open_b[(pid, tid)].pop()
            slices += 1
            tracks[(pid, tid)].append((start, to_ns(ts), j))
    for (pid, tid), stack in open_b.items():
        for _, j in stack:
            bad.append(f"traceEvents[{j}]: B on pid {pid} tid {tid} is never closed")
    for (pid, tid), sl in sorted(tracks.items()):
        if pid not in named_pid:
            bad.append(f"pid {pid}: no process_name metadata event")
        if (pid, tid) not in named_tid:
            bad.append(f"pid {pid} tid {tid}: no thread_name metadata event")
        sl.sort(key=lambda s: (s[0], -s[1]))
        stack = []  # enclosing slices, innermost last
        for start, end, i in sl:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                o = stack[-1]
                bad.append(f"traceEvents[{i}] [{start}, {end}) ns overlaps traceEvents[{o[2]}] [{o[0]}, {o[1]}) ns "
                           f"partially on pid {pid} tid {tid}")
                continue  # Perfetto drops it: it does not enclose what follows
            stack.append((start, end, i))
    return slices, bad


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    rc = 0
    for path in argv[1:]:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"perfetto_rules.py: error: {path}: {e}", file=sys.stderr)
            return 2
        slices, bad = check(doc)
        for line in bad[:20]:
            print(f"{path}: {line}")
        if len(bad) > 20:
            print(f"{path}: ... {len(bad) - 20} more")
        print(f"{path}: {slices} slices, {len(bad)} violations")
        if bad:
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
