#!/usr/bin/env bash
# mk-plan's report as a person sees it: headless Chromium loads index.html, the page's own check (report_common.py)
# counts the images that loaded and the script errors, and this test reads them from the rendered DOM. A copy with
# one plot removed must be caught, so the check cannot pass by accident. Exits 77 (skipped) without Chromium
# (Debian package chromium; scripts/setup installs it).
# Usage: report_in_browser.sh <mk-plan> <workdir>
set -u
tool=$1
work=$2
# shellcheck source=../../tests/browser_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../tests/browser_lib.sh"
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../cmake/cli_testlib.sh"

cp "$(dirname "${BASH_SOURCE[0]}")/data/tiny-workload.json" "$work/tiny.json"  # a small transformer: TP in a node, DP across
expect 0 'report: ' -- "$tool" --workload "$work/tiny.json" --cluster dgx-h200 --gpus 8:32 --what-if nic-bw=2x \
  --what-if noise=0.05 --report "$work/rep" -q

body=$(render "$work/rep/index.html")
want=$(grep -o '<img ' "$work/rep/index.html" | wc -l)
check "the page loaded and its check ran (body: $body)" test "$(attr data-checked "$body")" = yes
check "the page shows $want images (saw $(attr data-images "$body"))" test "$(attr data-images "$body")" = "$want"
check "the report has at least 6 plots" test "$want" -ge 6
check "every image loaded (missing: $(attr data-images-missing "$body"))" test "$(attr data-images-missing "$body")" = 0
check "no script error (errors: $(attr data-js-errors "$body"))" test "$(attr data-js-errors "$body")" = 0
screenshot "$work/rep/index.html" "$work/report.png"
check "a screenshot of the report is saved ($work/report.png)" test -s "$work/report.png"
check "no console error in the browser's log" bash -c "! grep -E 'CONSOLE.*(Uncaught|Error)' '$work/browser.log'"

# The check must see a broken page: the same report without one of its plots.
cp -r "$work/rep" "$work/broken"
rm "$work/broken/breakdown.png"
body=$(render "$work/broken/index.html")
check "a missing plot is caught (missing: $(attr data-images-missing "$body"))" test "$(attr data-images-missing "$body")" = 1

cli_summary
