# Headless-browser helpers of the HTML report tests (sourced by validation/tests/report_in_browser.sh and
# validation/plan/tests/report_in_browser.sh). The page's own check (report_common.py CHECK_SCRIPT) counts the
# images that loaded and the script errors on <body>; these helpers render a page and read them back.
# Needs: $work (the test's output folder). Sets $browser, or exits 77 (skipped) when there is none (Debian package
# chromium; scripts/setup installs it).
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

# Render the page (virtual time lets the load event and the page's check run) and print the checked <body> tag.
render() {
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/profile" \
    --enable-logging=stderr --v=0 --virtual-time-budget=10000 --dump-dom "file://$1" 2>"$work/browser.log" |
    grep -o '<body[^>]*>'
}

# A full-page PNG of the rendered page: screenshot <page> <png> [height].
screenshot() {
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/profile" \
    --hide-scrollbars --window-size=1300,"${3:-2400}" --virtual-time-budget=10000 --screenshot="$2" "file://$1" \
    2>>"$work/browser.log" >/dev/null
}

attr() { sed -n "s/.*$1=\"\\([^\"]*\\)\".*/\\1/p" <<<"$2"; }

# check_page <index.html> <min images> <what>: the page loads, its check ran, it shows at least <min images>
# images and every one loaded, no script or console error; its screenshot is saved as $work/report.png.
# Uses cli_testlib.sh's check.
check_page() {
  local page=$1 min=$2 what=$3 body want
  body=$(render "$page")
  want=$(grep -o '<img ' "$page" | wc -l)
  check "the page loaded and its check ran (body: $body)" test "$(attr data-checked "$body")" = yes
  check "the page shows $want images (saw $(attr data-images "$body"))" test "$(attr data-images "$body")" = "$want"
  check "the report has $what" test "$want" -ge "$min"
  check "every image loaded (missing: $(attr data-images-missing "$body"))" test "$(attr data-images-missing "$body")" = 0
  check "no script error (errors: $(attr data-js-errors "$body"))" test "$(attr data-js-errors "$body")" = 0
  check "no console error in the browser's log" bash -c "! grep -E 'CONSOLE.*(Uncaught|Error)' '$work/browser.log'"
  screenshot "$page" "$work/report.png"
  check "a screenshot of the report is saved ($work/report.png)" test -s "$work/report.png"
}

# check_broken <report dir> <png>: the check must see a broken page, the same report without one of its plots.
check_broken() {
  local body
  rm -rf "$work/broken" && cp -r "$1" "$work/broken" && rm "$work/broken/$2"
  body=$(render "$work/broken/index.html")
  check "a missing plot is caught (missing: $(attr data-images-missing "$body"))" test "$(attr data-images-missing "$body")" = 1
}
