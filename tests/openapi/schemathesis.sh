#!/usr/bin/env bash
# Property-based conformance run of schemathesis (PyPI) against a running
# fleet's API, through a TCP -> Unix socket forwarder. Not in CI (needs
# KVM, network for pip, and minutes). Usage (from the repository root):
#   tests/openapi/schemathesis.sh [EXTRA SCHEMATHESIS ARGS]
# Exit status: schemathesis's (0: every check passed).
# Left out, and why: `stopVm` (stopping the fleet's last VM ends the run by
# design, which ends the test server; tests/tests/api_openapi.rs covers it).
# Nothing else: a schema-valid `[[vm]]` body this fleet cannot take (an
# image missing here, a name taken) answers 409, which schemathesis accepts.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/target/schemathesis-venv"
work=$(mktemp -d)
port=${PORT:-18787}
if [ ! -x "$venv/bin/schemathesis" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet schemathesis
fi
cargo build --quiet -p hqdmux --manifest-path "$root/Cargo.toml"
cat > "$work/fleet.toml" <<'TOML'
[[vm]]
name = "gpuvm"
image = "builtin:gpu"
memory_mib = 256
gpu = true
args = "kernels=1 wgs=304 cost_us=200000 loops=100000"

[[vm]]
name = "idle"
image = "builtin:fault"
args = "mode=hang"
TOML
"$root/target/debug/hqdmux" run --quiet --api-socket "$work/api.sock" "$work/fleet.toml" \
    > "$work/run.out" 2> "$work/run.err" &
fleet=$!
python3 "$root/tests/openapi/forward.py" "$work/api.sock" "$port" &
fwd=$!
cleanup() {
    echo "--- fleet stderr (tail) ---"; tail -5 "$work/run.err" || true
    kill "$fwd" 2>/dev/null || true
    kill -TERM "$fleet" 2>/dev/null || true
    wait "$fleet" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$work/api.sock" ] && break; sleep 0.1; done
status=0
"$venv/bin/schemathesis" run "$root/docs/api/openapi.json" \
    --url "http://127.0.0.1:$port" --checks all --exclude-operation-id stopVm \
    "$@" || status=$?
echo "fleet still answering after the run: $(curl -s --unix-socket "$work/api.sock" http://x/api/v1/fleet | head -c 200)"
exit $status
