#!/usr/bin/env bash
# scripts/check-structure: the tree passes it, and a tree that breaks each of its rules
# does not, with the rule and place named.
#
#   tests/structure_test.sh SOURCE_DIR
set -uo pipefail
src=$1
check=$src/scripts/check-structure
fail() { echo "FAIL: $*"; exit 1; }

"$check" "$src" || fail "the tree breaks its structure (above)"

work=$(mktemp -d /tmp/tandem-structure-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/core "$work"/transport "$work"/partitioner "$work"/runtime/control \
  "$work"/runtime/job "$work"/tests
# What may be included: a lower layer, an earlier room, the folder itself.
printf '#include "core/tensor.h"\n' >"$work/transport/ok.h"
printf '#include "runtime/control/messages.h"\n#include "core/a.h"\n' >"$work/runtime/job/ok.h"
printf '#include "runtime/job/job.h"\n#include "targets/tandem/x.h"\n' >"$work/tests/ok.cpp"
"$check" "$work" >"$work/out" || fail "allowed includes were refused: $(cat "$work/out")"

# Each rule broken once.
printf '#include "partitioner/plan.h"\n' >"$work/transport/sideways.h"
printf '#include "transport/link.h"\n' >"$work/core/up.h"
printf '// one\n#include "runtime/job/job.h"\n' >"$work/runtime/control/later_room.h"
{
  echo "namespace tandem {"
  echo "void tooLong() {"
  for i in $(seq 1 119); do echo "  work($i);"; done
  echo "}"
  echo "struct Fine {"
  for i in $(seq 1 130); do echo "  int field$i = 0;"; done
  echo "};"
  echo "constexpr int kTable[] = {"
  for i in $(seq 1 130); do echo "  $i,"; done
  echo "};"
  echo "class Holder {"
  echo " public:"
  echo "  int inlineTooLong() const {"
  for i in $(seq 1 120); do echo "    work($i);"; done
  echo "  }"
  echo "};"
  echo "}  // namespace tandem"
} >"$work/partitioner/long_function.cpp"
for i in $(seq 1 601); do echo "int v$i = 0;"; done >"$work/core/long_file.cpp"
"$check" "$work" >"$work/out" && fail "a tree that breaks every rule passed"
expect() { grep -qF -- "$1" "$work/out" || fail "no '$1' in: $(cat "$work/out")"; }
expect "transport/sideways.h:1: 'transport' includes from 'partitioner', which is not below it"
expect "core/up.h:1: 'core' includes from 'transport', which is not below it"
expect "runtime/control/later_room.h:2: runtime's room 'control' includes from the later room 'job'"
expect "partitioner/long_function.cpp:2: a function of 121 lines, over 120"
expect "core/long_file.cpp:1: 601 lines, over 600"
expect "partitioner/long_function.cpp:389: a function of 122 lines, over 120"
[ "$(grep -c "long_function.cpp" "$work/out")" = 2 ] ||
  fail "a struct or an initializer was counted as a function: $(cat "$work/out")"
echo "structure test: passed"
