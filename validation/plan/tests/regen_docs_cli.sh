#!/usr/bin/env bash
# scripts/regen-docs: a stale block is named (exit 1) and rewritten from its command; malformed markers and a
# build directory without mk-plan exit 2 with one line and write nothing; a failing command exits 1.
# Usage: regen_docs_cli.sh <build dir> <workdir>
set -u
build=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../cmake/cli_testlib.sh"
regen="$(dirname "${BASH_SOURCE[0]}")/../../../scripts/regen-docs"

doc=$work/doc.md
printf '%s\n' 'intro' "<!-- generated: echo 'two words'; echo 'mk-plan: a run fact' -->" 'old text' \
  '<!-- end generated -->' "<!-- generated markdown: printf '| a |\\n'; echo 'mk-plan: in 1.2 s' -->" \
  '<!-- end generated -->' 'outro' >"$doc"
cp "$doc" "$work/before.md"
expect 1 "doc.md:2: stale block 'echo 'two words'" -- "$regen" --check --build "$build" "$doc"
check "--check writes nothing" cmp -s "$doc" "$work/before.md"
expect 0 '2 block\(s\) rewritten' -- "$regen" --build "$build" "$doc"
printf '%s\n' 'intro' "<!-- generated: echo 'two words'; echo 'mk-plan: a run fact' -->" '```text' 'two words' '```' \
  '<!-- end generated -->' "<!-- generated markdown: printf '| a |\\n'; echo 'mk-plan: in 1.2 s' -->" '| a |' \
  '<!-- end generated -->' 'outro' >"$work/want.md"
check "blocks rewritten from their commands, run-fact lines dropped" cmp "$doc" "$work/want.md"
expect 0 '' -- "$regen" --check --build "$build" "$doc"

printf '%s\n' '<!-- generated: false -->' '<!-- end generated -->' >"$work/fail.md"
expect 1 "fail.md:1: 'false' exited 1" -- "$regen" --check --build "$build" "$work/fail.md"
printf '%s\n' '<!-- generated: true -->' '<!-- end generated -->' >"$work/empty.md"
expect 1 "empty.md:1: 'true' printed nothing" -- "$regen" --check --build "$build" "$work/empty.md"
printf '%s\n' '<!-- generated: echo x -->' 'text' >"$work/open.md"
cp "$work/open.md" "$work/open-before.md"
expect 2 'open.md:1: generated block without' -- "$regen" --build "$build" "$work/open.md"
check "a malformed file is left as it was" cmp -s "$work/open.md" "$work/open-before.md"
one_line_error "$regen" --build "$build" "$work/open.md"
printf '%s\n' '<!-- end generated -->' >"$work/end.md"
expect 2 "end.md:1: '<!-- end generated -->' without" -- "$regen" --build "$build" "$work/end.md"
expect 2 'no such file' -- "$regen" --build "$build" "$work/absent.md"
expect 2 'no validation/plan/mk-plan in it' -- "$regen" --build "$work" "$doc"
expect 2 "regen-docs: argument --cache: invalid choice: 'warm'" -- "$regen" --cache warm --build "$build" "$doc"
one_line_error "$regen" --cache warm --build "$build" "$doc"
tables="$(dirname "${BASH_SOURCE[0]}")/../../../scripts/results_tables.py"
expect 2 'results_tables.py: .*not.json: cannot read a measurement file' -- "$tables" gemm "$work/not.json"
one_line_error "$tables" fused
expect 2 'doc.md: expected a plan.json with compute_model' -- "$tables" gemm-model "$doc"
cli_summary
