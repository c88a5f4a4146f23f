#!/usr/bin/env python3
"""Check every tool's --help against the CLI convention table (scripts/cli_convention.tsv).

Usage: check_cli_convention.py TABLE TOOL=PATH [TOOL=PATH ...]

For each row (flag | aliases | meaning regex | tools): every listed tool that was given must have the flag with
exactly these names (its aliases, NAME@TOOL ones only in that tool) and a help text matching the meaning; a tool
that has the flag or one of its aliases must be listed in a row for that flag. Prints one line per drift and exits
1 when there is any, 0 otherwise.
"""
import re
import subprocess
import sys


def load_table(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = [p.strip() for p in line.split(" | ")]
            if len(parts) != 4:
                sys.exit(f"{path}:{n}: expected 'flag | aliases | meaning | tools', got {line!r}")
            flag, aliases, meaning, tools = parts
            rows.append({"line": n, "flag": flag, "aliases": aliases.split(), "meaning": meaning,
                         "tools": tools.split()})
    return rows


def parse_help(text):
    """{name: (names, help text)} for every option of a CLI11 --help."""
    options = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^  (-[^\s]+)(.*)$", line)
        if m:
            names = tuple(m.group(1).split(","))
            rest = m.group(2)
            # the value type ("TEXT=float32", "UINT", "TEXT:{a,b}=a") is separated from the help by 2+ spaces
            parts = re.split(r"\s{2,}", rest.strip(), maxsplit=1)
            desc = parts[1] if len(parts) == 2 else ("" if re.match(r"^[A-Z]", parts[0] or "") else parts[0])
            current = [names, desc]
            for name in names:
                options[name] = current
        elif current is not None and re.match(r"^\s{10,}\S", line):
            current[1] = (current[1] + " " + line.strip()).strip()
        else:
            current = None
    return options


def names_for(row, tool):
    names = {row["flag"]}
    for alias in row["aliases"]:
        name, _, only = alias.partition("@")
        if not only or only == tool:
            names.add(name)
    return names


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = load_table(sys.argv[1])
    tools = dict(arg.split("=", 1) for arg in sys.argv[2:])
    drifts = []
    checked = 0
    for tool, path in tools.items():
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            drifts.append(f"{tool}: --help exited {out.returncode}")
            continue
        options = parse_help(out.stdout)
        for row in rows:
            if tool not in row["tools"]:
                continue
            checked += 1
            want = names_for(row, tool)
            entry = options.get(row["flag"])
            if entry is None:
                drifts.append(f"{tool}: {row['flag']} missing (table line {row['line']})")
                continue
            if set(entry[0]) != want:
                drifts.append(f"{tool}: {row['flag']} has names {','.join(entry[0])}, the convention "
                              f"{','.join(sorted(want))} (table line {row['line']})")
            if not re.search(row["meaning"], entry[1]):
                drifts.append(f"{tool}: {row['flag']} help {entry[1]!r} does not say /{row['meaning']}/ "
                              f"(table line {row['line']})")
        # Every flag or alias of the table that the tool has must be the table's for this tool.
        for row in rows:
            for name in [row["flag"]] + [a.partition("@")[0] for a in row["aliases"]]:
                if name not in options:
                    continue
                owners = [r for r in rows if r["flag"] == options[name][0][-1] or r["flag"] in options[name][0]]
                if not any(tool in r["tools"] and name in names_for(r, tool) for r in owners):
                    drifts.append(f"{tool}: has {name} ({','.join(options[name][0])}), which the convention does "
                                  f"not give this tool (table line {row['line']})")
    for d in sorted(set(drifts)):
        print("DRIFT: " + d)
    print(f"cli convention: {len(tools)} tool(s), {checked} flag(s) checked, {len(set(drifts))} drift(s)")
    return 1 if drifts else 0


if __name__ == "__main__":
    sys.exit(main())
