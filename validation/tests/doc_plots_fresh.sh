#!/usr/bin/env bash
# The plots in docs/img/ match the committed data they are drawn from (validation/tools/make_doc_plots.py
# --check against docs/img/plots.json), and the check sees a stale manifest: a copy whose recorded hash of one
# input differs must fail, naming that input. With mk-validate, the model's numbers must still be the ones the
# plots show (a copy of the manifest with another median must fail).
# Usage: doc_plots_fresh.sh <workdir> [<mk-validate>]
set -u
work=$1
validate=${2:-}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$here/../.."
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../cmake/cli_testlib.sh
source "$here/../../cmake/cli_testlib.sh"
py=/usr/bin/python3
tool="$root/validation/tools/make_doc_plots.py"

expect 0 'plots match their' -- "$py" "$tool" --check
"$py" - "$root/docs/img/plots.json" "$work/stale.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
first = next(iter(m["inputs"]))
m["inputs"][first] = "0" * 64
json.dump(m, open(sys.argv[2], "w"))
print(first)
PY
expect 1 'changed since the plots were drawn' -- "$py" "$tool" --check --manifest "$work/stale.json"
expect 1 'draw the plots' -- "$py" "$tool" --check --manifest "$work/absent.json"
if [[ -n $validate ]]; then
  expect 0 'plots match their' -- "$py" "$tool" --check --mk-validate "$validate"
  "$py" - "$root/docs/img/plots.json" "$work/model.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["summary"]["sim"]["median_abs_err_pct"] += 1.0
json.dump(m, open(sys.argv[2], "w"))
PY
  expect 1 'the model now gives sim.median_abs_err_pct' -- "$py" "$tool" --check --manifest "$work/model.json" \
    --mk-validate "$validate"
fi

cli_summary
