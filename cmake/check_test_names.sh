#!/usr/bin/env bash
# ctest splits a test name at ';' (a CMake list separator), so a doctest case whose name holds one is registered
# under names that match nothing and never runs, yet counts as passed. Fail when any TEST_CASE name has one.
#   cmake/check_test_names.sh <source root>
set -u
root=${1:?usage: check_test_names.sh <source root>}
bad=$(grep -rn --include='*.cpp' --include='*.cu' -E 'TEST_CASE\("[^"]*;' "$root/models" "$root/sim" "$root/validation" "$root/impl" 2>/dev/null)
if [[ -n $bad ]]; then
  echo "test names with ';' (ctest would never run them):"
  echo "$bad"
  exit 1
fi
echo "no test name holds ';'"
