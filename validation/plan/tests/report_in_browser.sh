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

check_page "$work/rep/index.html" 6 "at least 6 plots"
check_broken "$work/rep" breakdown.png

cli_summary
