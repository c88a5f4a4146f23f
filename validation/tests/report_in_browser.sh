#!/usr/bin/env bash
# mk-validate's report as a person sees it: mk-validate judges the committed 2 x H200 measurements with the
# committed profile and writes its report; headless Chromium loads index.html, the page's own check
# (report_common.py) counts the images that loaded and the script errors, and this test reads them from the
# rendered DOM, checks the headline and the table alignment, and saves a screenshot (<workdir>/report.png). A copy
# with one plot removed must be caught, so the check cannot pass by accident. Exits 77 (skipped) without Chromium
# (Debian package chromium; scripts/setup installs it).
# Usage: report_in_browser.sh <mk-validate> <workdir>
set -u
tool=$1
work=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=browser_lib.sh
source "$here/browser_lib.sh"
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../cmake/cli_testlib.sh
source "$here/../../cmake/cli_testlib.sh"

data="$here/../data"
files=()
for f in "$data"/measured/*-h200x2-*.json; do
  [[ $f == *-calibration.json ]] || files+=("$f")
done
expect 0 'validation: n=' -- "$tool" --profile "$data/profiles/h200x2-calibrated.json" --cluster h200x2 \
  --report "$work/rep" "${files[@]}"

page="$work/rep/index.html"
check_page "$page" 6 "a time and an error plot per op (3 ops)"
check "the headline says the numbers in words" grep -qE 'Across [0-9]+ measured runs .* within [0-9.]+ % of the measured time at the median and [0-9.]+ % at p90' "$page"
check "no raw summary line (median_abs_err_pct=) on the page" bash -c "! grep -q 'median_abs_err_pct=' '$page'"
check "numbers are right-aligned (class n) and text is not" grep -q '<th class="n">measured (µs)</th>' "$page"
check "the profile table has a unit column" grep -q '<th>unit</th>' "$page"
check "every number of the profile has its unit" bash -c "! grep -E '<tr><td>[^<]*</td><td class=\"n\">[^<]*</td><td></td></tr>' '$page'"
check "one stylesheet" test "$(grep -c '<style>' "$page")" = 1
dups=$(grep -o '<p[^>]*>[^<]\{40,\}' "$page" | sed 's/<p[^>]*>//' | sort | uniq -d | head -3)
check "no sentence is repeated (${dups:-none})" test -z "$dups"
check_broken "$work/rep" time-allreduce.png

cli_summary
