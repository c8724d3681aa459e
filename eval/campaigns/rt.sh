#!/usr/bin/env bash
# The `rt` campaign of issue 18: every `rt`-family seed of the fuzzer's
# ranges, run with a given promise_fuzz binary; prints each failing seed
# with its violations, then a count per range.
#
# Usage: eval/campaigns/rt.sh BIN [START:COUNT ...]
#   BIN    a promise_fuzz binary (copy target/release/examples/promise_fuzz
#          first, so a rebuild does not change it mid-run)
#   ranges default to the twelve the docs name: 50000:294 97000:300
#          200000:118 300000:200 400000:150 500000:100 600000:150
#          700000:150 800000:150 900000:150 1000000:150 1100000:150
#          ("the ten ranges" are the first ten, "the nine" the first
#          nine, and so on)
# `--only rt` runs exactly the range's `rt` seeds, each as with
# `--seed S --count 1 --shrink 0 --host-bound 0`. Two halves side by side
# (two invocations with different ranges) use both cores.
set -u
bin=${1:?usage: rt.sh PROMISE_FUZZ_BINARY [START:COUNT ...]}
shift
ranges=("$@")
if [ ${#ranges[@]} -eq 0 ]; then
  ranges=(50000:294 97000:300 200000:118 300000:200 400000:150 500000:100
          600000:150 700000:150 800000:150 900000:150 1000000:150
          1100000:150)
fi
for r in "${ranges[@]}"; do
  start=${r%%:*}; count=${r##*:}
  echo "== $start +$count --only rt"
  "$bin" --seed "$start" --count "$count" --only rt --shrink 0 \
    --host-bound 0 --quiet --jobs 1 2>&1 | grep -E "^seed .*FAIL|^  [0-9]-|scenarios,"
done
