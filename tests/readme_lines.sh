#!/usr/bin/env bash
# Every usage line of README.md ("## Using it"), run as a new user runs them from a fresh
# clone's root, in order (later lines use what earlier ones wrote: out/cnn.tdm,
# out/mlp.tdm, out/cluster.key), in a temporary copy of the source tree whose
# build/release is this build. Each must exit 0. So that the suite stays short, the copy's
# example jobs train on 512 samples (train_limit) and the `train` lines get
# `--train-limit 512 --test-limit 256` appended; the commands are otherwise the README's.
# `scripts/netns-cluster` (root, namespaces) is skipped: netns_test runs it.
#
#   tests/readme_lines.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1
build=$2
work=$(mktemp -d /tmp/tandem-readme-XXXXXX)
daemons=()
cleanup() {
  for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

# The tree as a clone has it (tracked files), with this build as its build/release.
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" ls-files -z | (cd "$src" && xargs -0 cp --parents -t "$work")
else
  (cd "$src" && tar --exclude=./build --exclude=./out -cf - .) | (cd "$work" && tar -xf -)
fi
mkdir -p "$work/build"
ln -s "$(cd "$build" && pwd)" "$work/build/release"
for job in "$work"/examples/jobs/*.yaml; do
  printf 'train_limit: 512\ntest_limit: 256\n' >>"$job"
done

# The usage block: from "## Using it" to the end of its first code block, continuation
# lines joined.
lines=$(awk '/^## Using it/ {on = 1; next} on && /^```sh/ {code = 1; next}
             code && /^```/ {exit} code {print}' "$src/README.md" |
        sed -e ':a' -e '/\\$/N; s/\\\n//; ta')
[ -n "$lines" ] || { echo "no usage block found in README.md"; exit 1; }

cd "$work"
failed=0
count=0
while IFS= read -r line; do
  command=${line%%  #*}  # the comment, after two spaces or more
  command=$(echo "$command" | sed 's/[[:space:]]*$//')
  [ -z "$command" ] && continue
  case $command in
    B=*) eval "$command"; continue ;;
    scripts/netns-cluster*) echo "skipped (root, namespaces; netns_test runs it): $command"; continue ;;
  esac
  case $command in
    *' train '*) command="$command --train-limit 512 --test-limit 256" ;;
  esac
  count=$((count + 1))
  if [[ $command == *'&' ]]; then
    # A daemon in the background: started, and given a moment to listen.
    eval "${command%&} >$work/daemon.log 2>&1 &"
    daemons+=($!)
    for _ in $(seq 50); do grep -q listening "$work/daemon.log" && break; sleep 0.1; done
    echo "started: $command"
    continue
  fi
  start=$(date +%s.%N)
  if out=$(eval "$command" 2>&1); then
    printf 'ok (%.1f s): %s\n' "$(echo "$(date +%s.%N) - $start" | bc)" "$command"
  else
    code=$?
    failed=$((failed + 1))
    echo "FAILED (exit $code): $command"
    echo "$out" | tail -20
  fi
done <<<"$lines"
echo "$count usage lines run, $failed failed"
[ "$failed" -eq 0 ] && [ "$count" -ge 10 ]
