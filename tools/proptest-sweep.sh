#!/usr/bin/env bash
# Runs the workspace's property tests (library tests of every crate that
# has them) under several proptest seeds other than the fixed one the
# README's test command uses (.cargo/config.toml), to find new failing
# cases before CI does. A failure is saved by proptest in the crate's
# `proptest-regressions/` file: commit that line with the fix.
#
# Usage: tools/proptest-sweep.sh [SEED ...]   (default: 1 2 3 4 5 6 7 8)
set -u
cd "$(dirname "$0")/.."
seeds=("$@")
[ ${#seeds[@]} -eq 0 ] && seeds=(1 2 3 4 5 6 7 8)
crates=(hqdmux-scheduler hqdmux-gpusim hqdmux-gpu hqdmux-mdev hqdmux-timeline hqdmux-eval)
args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done
status=0
log=$(mktemp)
for s in "${seeds[@]}"; do
  echo "== PROPTEST_RNG_SEED=$s"
  PROPTEST_RNG_SEED=$s cargo test --release "${args[@]}" --lib >"$log" 2>&1 || status=1
  grep -E "^test result|FAILED|minimal failing input" "$log"
done
rm -f "$log"
exit $status
