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
