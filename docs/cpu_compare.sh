#!/usr/bin/env bash
# aubier against llama.cpp on one host, one script (docs/BENCHMARKS.md, "AVX2"): the read
# bandwidth, llama.cpp with its weight repacking off and on (docs/llamacpp_bench.py), then each
# aubier binary given, in order and again in reverse, with the same bench flags, then the
# bandwidth again; one line per run (median, min, max of the reps) and the per-component decode
# times of each aubier run.
# Usage: docs/cpu_compare.sh PYTHON MEMBW MODEL "AUBIER_FLAGS" AUBIER_BINARY...
#   PYTHON: a python with llama-cpp-python (for the AVX2 comparison, built with
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF")
#   MEMBW: target/release/examples/membw; AUBIER_FLAGS e.g. "--backend cpu --cpu-isa avx2".
# Bench shape: $BENCH_ARGS, default --n-prompt 512 --n-gen 128 --reps 3.
set -euo pipefail
python=$1 membw=$2 model=$3 flags=$4
shift 4
bins=("$@")
here=$(cd "$(dirname "$0")" && pwd)
read -r -a args <<<"${BENCH_ARGS:---n-prompt 512 --n-gen 128 --reps 3}"
out=$(mktemp -d)
lscpu | grep -E 'Model name|^CPU\(s\)'
echo "ISA: $(grep -o -w -E 'avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')"
"$python" -c "import llama_cpp as L; print('llama.cpp:', L.llama_print_system_info().decode())"
"$membw" | tail -2
i=0
for repack in 0 1; do
    i=$((i + 1))
    "$python" "$here/llamacpp_bench.py" "$model" --repack "$repack" --threads 2 \
        --n-prompt "${args[1]}" --n-gen "${args[3]}" --reps "${args[5]}" >"$out/$i-llama-repack$repack.json"
done
order=("${bins[@]}")
for ((k = ${#bins[@]} - 1; k >= 0; k--)); do order+=("${bins[k]}"); done
for bin in "${order[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086 # the flags are words
    "$bin" bench --model "$model" "${args[@]}" $flags --json >"$out/$i-$(basename "$bin").json"
done
"$membw" | tail -2
for f in "$out"/*.json; do
    python3 - "$f" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
name = os.path.basename(sys.argv[1])[:-5]
p, d = r['prefill_tok_s'], r['decode_tok_s']
line = (f"{name}: prefill {p['median']:.2f} tok/s ({p['min']:.2f}-{p['max']:.2f}), "
        f"decode {d['median']:.2f} tok/s ({d['min']:.2f}-{d['max']:.2f}), "
        f"peak RSS {r['peak_rss_bytes'] / 1e9:.3f} GB")
if 'decode_ms_per_token_by_component' in r:
    ms = r['decode_ms_per_token_by_component']
    line += "\n    decode ms/token: " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items())
print(line)
PY
done
