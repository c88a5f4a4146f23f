#!/usr/bin/env bash
# mk-plan's report as a person sees it: headless Chromium loads index.html, the page's own check (report_common.py)
# counts the images that loaded and the script errors, and this test reads them from the rendered DOM. A copy with
# one plot removed must be caught, so the check cannot pass by accident. Exits 77 (skipped) without Chromium
# (Debian package chromium; scripts/setup installs it).
# Usage: report_in_browser.sh <mk-plan> <workdir>
set -u
tool=$1
work=$2
browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then
    browser=$(command -v "$b")
    break
  fi
done
if [[ -z $browser ]]; then
  echo "SKIP: no headless browser (apt-get install chromium, or run scripts/setup)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../cmake/cli_testlib.sh"

cp "$(dirname "${BASH_SOURCE[0]}")/data/tiny-workload.json" "$work/tiny.json"  # a small transformer: TP in a node, DP across
expect 0 'report: ' -- "$tool" --workload "$work/tiny.json" --cluster dgx-h200 --gpus 8:32 --what-if nic-bw=2x \
  --what-if noise=0.05 --report "$work/rep" -q

# Render the page (virtual time lets the load event and the page's check run) and print the checked <body> tag.
render() {
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/profile" \
    --enable-logging=stderr --v=0 --virtual-time-budget=10000 --dump-dom "file://$1" 2>"$work/browser.log" |
    grep -o '<body[^>]*>'
}
attr() { sed -n "s/.*$1=\"\\([^\"]*\\)\".*/\\1/p" <<<"$2"; }

body=$(render "$work/rep/index.html")
want=$(grep -o '<img ' "$work/rep/index.html" | wc -l)
check "the page loaded and its check ran (body: $body)" test "$(attr data-checked "$body")" = yes
check "the page shows $want images (saw $(attr data-images "$body"))" test "$(attr data-images "$body")" = "$want"
check "the report has at least 6 plots" test "$want" -ge 6
check "every image loaded (missing: $(attr data-images-missing "$body"))" test "$(attr data-images-missing "$body")" = 0
check "no script error (errors: $(attr data-js-errors "$body"))" test "$(attr data-js-errors "$body")" = 0
check "no console error in the browser's log" bash -c "! grep -E 'CONSOLE.*(Uncaught|Error)' '$work/browser.log'"

# The check must see a broken page: the same report without one of its plots.
cp -r "$work/rep" "$work/broken"
rm "$work/broken/breakdown.png"
body=$(render "$work/broken/index.html")
check "a missing plot is caught (missing: $(attr data-images-missing "$body"))" test "$(attr data-images-missing "$body")" = 1

cli_summary
