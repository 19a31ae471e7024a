#!/usr/bin/env bash
# scripts/skipped-tests against JUnit files as ctest writes them: none skipped passes; a
# skipped test fails naming it and the reason from its output, unless allowed by name;
# an unreadable file or bad arguments exit 2.
set -uo pipefail
script="$1/scripts/skipped-tests"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cat >"$dir/none.xml" <<'XML'
<testsuite tests="1" skipped="0"><testcase name="A.Runs" status="run"><system-out>ok</system-out></testcase></testsuite>
XML
cat >"$dir/one.xml" <<'XML'
<testsuite tests="2" skipped="1">
<testcase name="A.Runs" status="run"><system-out>ok</system-out></testcase>
<testcase name="B.NeedsRoot" status="notrun"><skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
<system-out>[ RUN      ] B.NeedsRoot
/src/tests/b_test.cpp:12: Skipped
needs root for network namespaces
[  SKIPPED ] B.NeedsRoot (0 ms)</system-out></testcase>
</testsuite>
XML

out=$("$script" "$dir/none.xml") || fail "none skipped should pass: $out"
[[ "$out" == *"skipped 0 of 1 tests"* ]] || fail "count: $out"

out=$("$script" "$dir/one.xml" 2>&1); code=$?
[[ $code -eq 1 ]] || fail "a skip should exit 1, got $code: $out"
[[ "$out" == *"B.NeedsRoot: needs root for network namespaces (/src/tests/b_test.cpp:12) [must run here]"* ]] ||
  fail "reason: $out"

out=$("$script" "$dir/one.xml" --allow "B.NeedsRoot=not here") || fail "an allowed skip should pass: $out"
[[ "$out" == *"[allowed: not here]"* ]] || fail "allowed: $out"

"$script" "$dir/missing.xml" >/dev/null 2>&1; [[ $? -eq 2 ]] || fail "a missing file should exit 2"
"$script" "$dir/one.xml" --allow >/dev/null 2>&1; [[ $? -eq 2 ]] || fail "--allow without NAME=WHY should exit 2"
echo "ok"
