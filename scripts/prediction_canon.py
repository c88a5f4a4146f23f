"""Print a prediction JSON (mk-plan's plan.json, mk-sim's --json) with the facts of the run removed and keys sorted.

Used by scripts/prediction-snapshot: what is left is every predicted number, printed with all its digits
(repr of a float), so that two snapshots differ exactly where a prediction changed.
"""
import json
import sys

# Facts of the run, not predictions: they differ between two runs of the same code.
RUN_FACTS = {"commit", "wall_s", "wall_seconds", "elapsed_s", "date", "host", "stats", "run_stats", "cache", "tool"}


def strip(value):
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in RUN_FACTS}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def main():
    if len(sys.argv) != 2:
        print("usage: prediction_canon.py FILE.json", file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"prediction_canon.py: {sys.argv[1]}: {e}", file=sys.stderr)
        return 2
    json.dump(strip(doc), sys.stdout, sort_keys=True, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
