#!/usr/bin/env bash
# The larger-than-RAM CPU case, one script (docs/BENCHMARKS.md, "Larger than RAM", issue 34):
# one GGUF larger than the machine's memory (a 36-layer `aubier synth` file, ~43 GB), llama.cpp
# (its mmap, docs/llamacpp_bench.py) against each aubier configuration given, every run cold:
# the file's pages are dropped from the page cache first (`posix_fadvise(POSIX_FADV_DONTNEED)`
# over the whole file; drop_caches needs privileges a user may not have), with the same prompt
# and the same number of generated tokens. Prints the host, the memory, the disk's cold read
# rate of the file (the first GiB, O_DIRECT), then one line per run: prefill, decode, peak RSS,
# the run's wall time (load included), and aubier's served fraction and read-ahead figures.
# Usage: docs/larger_than_ram.sh PYTHON AUBIER MODEL [AUBIER_FLAGS...]
#   PYTHON: a python with llama-cpp-python; AUBIER_FLAGS: one quoted string per aubier run, any
#   `aubier bench` flags (default: "--prefetch-budget 0" and "": demand paging, and aubier's
#   default, which reads ahead when the file is larger than the memory), e.g.
#   "--prefetch-budget 0" "" "--prefetch-budget 2 --prefetch-lead 2 --page-ahead all"
#   (an unquoted flag list would make each word a run of its own: refused).
# Shape: $BENCH_ARGS, default --n-prompt 16 --n-gen 32 --reps 1 (a rep after the first would
# find the file cached).
set -euo pipefail
python=$1 aubier=$2 model=$3
shift 3
configs=("$@")
if [ ${#configs[@]} -eq 0 ]; then configs=("--prefetch-budget 0" ""); fi
for flags in "${configs[@]}"; do
    if [ -n "$flags" ] && [ "${flags#--}" = "$flags" ]; then
        echo "aubier run \"$flags\" does not start with a flag: quote each run's flags as one" \
            "argument, e.g. \"--prefetch-budget 2 --prefetch-lead 2\"" >&2
        exit 2
    fi
done
here=$(cd "$(dirname "$0")" && pwd)
read -r -a args <<<"${BENCH_ARGS:---n-prompt 16 --n-gen 32 --reps 1}"
out=$(mktemp -d)
cold() {
    sync
    python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$model"
}
lscpu | grep -E 'Model name|^CPU\(s\)'
grep -E 'MemTotal|MemAvailable' /proc/meminfo
echo "model: $(du -h --apparent-size "$model" | cut -f1) $model"
cold
dd if="$model" of=/dev/null bs=16M count=64 iflag=direct 2>&1 | tail -1
i=0
run() {
    local name=$1
    shift
    i=$((i + 1))
    cold
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >"$out/$i-$name.json"
    t1=$(date +%s.%N)
    echo "$t0 $t1" >"$out/$i-$name.wall"
    echo "load average after $name: $(cut -d' ' -f1-3 /proc/loadavg)"
}
run llama.cpp "$python" "$here/llamacpp_bench.py" "$model" --threads 2 \
    --n-prompt "${args[1]}" --n-gen "${args[3]}" --reps "${args[5]}"
for flags in "${configs[@]}"; do
    # shellcheck disable=SC2086 # the flags are words
    run "aubier${flags:+ $flags}" "$aubier" bench --model "$model" "${args[@]}" $flags --json
done
for f in "$out"/*.json; do
    python3 - "$f" "${f%.json}.wall" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
t0, t1 = map(float, open(sys.argv[2]).read().split())
name = os.path.basename(sys.argv[1])[:-5]
p, d = r['prefill_tok_s'], r['decode_tok_s']
line = (f"{name}: prefill {p['median']:.3f} tok/s, decode {d['median']:.3f} tok/s, "
        f"peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB, wall {t1 - t0:.0f} s")
if 'served_fraction' in r:
    line += (f"\n    served fraction {r['served_fraction']:.3f}, host store "
             f"{r['host_bytes_per_token'] / 1e6:.0f} MB/token")
    if r.get('read_ahead'):
        a = r['read_ahead']
        line += (f"; read-ahead {a['loads']} loads ({a['bytes_per_token'] / 1e6:.0f} MB per "
                 f"decoded token), {a['served']} routed slots served by them, {a['late']} late, "
                 f"{a.get('pending', 0)} pending in later steps")
    if r.get('prediction_recall') is not None:
        line += (f"; recall {r['prediction_recall']:.3f} "
                 f"({r.get('prediction_lead', 1)} layer(s) ahead)")
    ms = r['decode_ms_per_token_by_component']
    line += "\n    decode ms/token: " + ", ".join(f"{k} {v:.1f}" for k, v in ms.items())
print(line)
PY
done
