#!/usr/bin/env bash
# Runs schemathesis, every check, against `aubier serve --engine fake` (the bundled model's
# tokenizer and template, scripted tokens) and the /openapi.json it serves: zero 5xx and zero
# schema violations, or a non-zero exit. Not a cargo test, so `cargo test` needs no Python; CI
# runs it after `cargo test --workspace` (.ci/run).
#
# Usage: server/tests/schemathesis/run.sh [AUBIER_BINARY]
#   AUBIER_BINARY         default: $CARGO_TARGET_DIR (or target)/debug/aubier
#   SCHEMATHESIS_EXAMPLES examples per operation and phase (default 100)
#   SCHEMATHESIS_SEED     the generator's seed (default fixed, so CI runs the same cases)
# Needs `schemathesis` on PATH: pip install 'schemathesis==4.32.5'
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
bin="${1:-${CARGO_TARGET_DIR:-$root/target}/debug/aubier}"
if ! command -v schemathesis >/dev/null; then
    echo "schemathesis is not installed: pip install 'schemathesis==4.32.5'" >&2
    exit 1
fi
if [ ! -x "$bin" ]; then
    echo "no aubier binary at $bin: cargo build -p aubier-server" >&2
    exit 1
fi
work="$(mktemp -d)"
"$bin" serve --engine fake --port 0 --lock-file "$work/lock" \
    --model "$root/models/ms4-tiny256-q2k.gguf" 2>"$work/serve.log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT
url=""
for _ in $(seq 1 600); do
    url="$(grep -o 'listening on http://[0-9.:]*' "$work/serve.log" | sed 's/listening on //' || true)"
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { echo "aubier serve did not start" >&2; cat "$work/serve.log" >&2; exit 1; }
echo "schemathesis against $url/openapi.json"
# One worker: the engine is single-flight, so more would only queue. Run inside $work so the
# generator's database and reports stay out of the tree.
cd "$work"
SCHEMATHESIS_HOOKS=hooks PYTHONPATH="$here" schemathesis run "$url/openapi.json" \
    --checks all \
    --max-examples "${SCHEMATHESIS_EXAMPLES:-100}" \
    --seed "${SCHEMATHESIS_SEED:-25}" \
    --workers 1 \
    --request-timeout 60
