#!/usr/bin/env bash
# aubier's Vulkan backend against llama.cpp's on one GGUF file and one Vulkan device, in one
# script (issue 37; docs/BENCHMARKS.md, "Vulkan kernels against llama.cpp's"). It builds nothing:
# it takes the two binaries. llama-bench runs with every layer on the device and flash attention
# on (`-ngl 99 -fa on`), `aubier bench --backend vulkan` with the same prompt length, generated
# tokens and repetitions; then it prints each engine's prefill and decode tok/s, aubier's ratio to
# llama.cpp for each, and aubier's time and weight GB/s per kernel from its own GPU timestamps
# (weight bytes a decoded token reads through the kernel ÷ the kernel's decode time).
#
# Usage: scripts/vk-vs-llamacpp.sh AUBIER LLAMA_BENCH MODEL
#   AUBIER: an aubier binary (cargo build --release -p aubier-server: target/release/aubier)
#   LLAMA_BENCH: llama.cpp's llama-bench built with -DGGML_VULKAN=ON
#   MODEL: a GGUF file both read (e.g. `aubier synth --out real1x8.gguf --layers 1 --experts 8`)
# Environment: N_PROMPT (default 64), N_GEN (16), REPS (3); AUBIER_DEVICE: aubier's `--device`
# index (`aubier devices`; default: aubier's own choice, the first hardware GPU, else a software
# device); GGML_VK_VISIBLE_DEVICES: llama.cpp's device (default 0: llama.cpp uses a CPU-type
# device such as lavapipe only when it is named). Name the same device to both.
set -euo pipefail
if [ $# -ne 3 ]; then
    sed -n '2,/^set -e/p' "$0" | sed '$d' >&2
    exit 2
fi
aubier=$1 llama=$2 model=$3
n_prompt=${N_PROMPT:-64} n_gen=${N_GEN:-16} reps=${REPS:-3}
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
device=()
if [ -n "${AUBIER_DEVICE:-}" ]; then device=(--device "$AUBIER_DEVICE"); fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

lscpu | grep -E 'Model name|^CPU\(s\)'
"$aubier" devices
echo "model: $model ($(stat -c %s "$model") bytes); prompt $n_prompt tokens, $n_gen generated, $reps reps"

"$llama" -m "$model" -ngl 99 -fa on -p "$n_prompt" -n "$n_gen" -r "$reps" -o json >"$out/llama.json"
"$aubier" bench --model "$model" --backend vulkan "${device[@]}" --n-prompt "$n_prompt" \
    --n-gen "$n_gen" --reps "$reps" --json >"$out/aubier.json"

python3 - "$out/llama.json" "$out/aubier.json" <<'PY'
import json, statistics, sys

llama = json.load(open(sys.argv[1]))
aubier = json.load(open(sys.argv[2]))

def llama_rate(kind):
    rows = [r for r in llama if (r["n_gen"] == 0) == (kind == "prefill")]
    if len(rows) != 1:
        sys.exit(f"llama-bench gave {len(rows)} {kind} rows, expected 1")
    r = rows[0]
    info = f"{r.get('gpu_info') or r.get('backends', '')}, build {r.get('build_commit', '?')}"
    return statistics.median(r["samples_ts"]), info

lp, info = llama_rate("prefill")
ld, _ = llama_rate("decode")
ap, ad = aubier["prefill_tok_s"]["median"], aubier["decode_tok_s"]["median"]
print(f"llama.cpp ({info}): prefill {lp:.2f} tok/s, decode {ld:.2f} tok/s (medians)")
print(f"aubier ({aubier['device']}): prefill {ap:.2f} tok/s, decode {ad:.2f} tok/s (medians)")
print(f"aubier / llama.cpp: prefill {ap / lp:.3f}x, decode {ad / ld:.3f}x")
wb = aubier["weight_bytes_per_token"]["total"]
print(f"aubier decode: {wb / 1e6:.1f} MB of weights per token, {wb * ad / 1e9:.2f} GB/s overall")
print(f"{'kernel':<28} {'ms/prefill':>11} {'ms/token':>10} {'MB/token':>9} {'GB/s':>7} {'launches':>9}")
for k in aubier["kernels"][:20]:
    mb = k["decode_weight_bytes_per_token"] / 1e6
    gbs = (k["decode_weight_bytes_per_token"] / (k["decode_ms_per_token"] * 1e6)
           if k["decode_ms_per_token"] > 0 and mb > 0 else float("nan"))
    print(f"{k['name']:<28} {k['prefill_ms']:>11.2f} {k['decode_ms_per_token']:>10.3f} "
          f"{mb:>9.2f} {gbs:>7.2f} {k['launches']:>9}")
PY
