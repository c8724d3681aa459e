#!/usr/bin/env bash
# Issue 21 comparison: the good VM beside each neighbour kind, ROUNDS times,
# interleaved (so every case sees the same host load), then the medians.
# Usage: examples/isolation/runall.sh [ROUNDS] (needs /dev/kvm and python3;
# builds the release binary first).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
cargo build --release -q -p hqdmux
hq=target/release/hqdmux
out=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  for f in alone busy barrier-q1-p8 barrier-q8-p8 barrier-q1-p12 barrier-q8-p12 spinner dbflood-p8 dbflood-p12; do
    python3 examples/isolation/measure.py "$hq" "examples/isolation/$f.toml" "$f-$r" "$out" >> "$out/results.jsonl"
  done
done
python3 examples/isolation/measure.py --summary "$out/results.jsonl"
