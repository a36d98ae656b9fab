#!/usr/bin/env bash
# Two aubier builds back to back on one file: `aubier bench` of A, B, B, A (both orders), the
# product path of each (A's flags, B's flags), then one line per run with prefill / decode tok/s
# (median, min, max of the reps) and peak RSS from `bench --json`.
# Usage: docs/ab_bench.sh A_BINARY "A_FLAGS" B_BINARY "B_FLAGS" MODEL [BENCH_ARGS...]
# (BENCH_ARGS default: --n-prompt 512 --n-gen 128 --reps 3)
set -euo pipefail
a=$1 a_flags=$2 b=$3 b_flags=$4 model=$5
shift 5
args=("$@")
[ $# -gt 0 ] || args=(--n-prompt 512 --n-gen 128 --reps 3)
out=$(mktemp -d)
lscpu | grep -E 'Model name|^CPU\(s\)'
i=0
for side in A B B A; do
    i=$((i + 1))
    if [ "$side" = A ]; then bin=$a flags=$a_flags; else bin=$b flags=$b_flags; fi
    # shellcheck disable=SC2086 # the flags are words
    "$bin" bench --model "$model" "${args[@]}" $flags --json >"$out/$i-$side.json"
done
for f in "$out"/*.json; do
    python3 - "$f" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
name = os.path.basename(sys.argv[1])[:-5]
p, d = r['prefill_tok_s'], r['decode_tok_s']
print(f"{name}: prefill {p['median']:.2f} tok/s (min {p['min']:.2f}, max {p['max']:.2f}), "
      f"decode {d['median']:.2f} tok/s (min {d['min']:.2f}, max {d['max']:.2f}), "
      f"peak RSS {r['peak_rss_bytes'] / 1e9:.3f} GB")
PY
done
