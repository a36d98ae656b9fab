#!/usr/bin/env bash
# The split expert store on a GPU, one script (issue 32): on the 4-layer 128-expert synthetic
# model, decode tok/s with every expert resident and with a fast store of a quarter of the experts
# (2Q, LRU, static), the host store's bytes per token (read over the bus) and the fraction of the
# device's memory-bandwidth roofline; llama.cpp's Vulkan backend as the peer when its
# `llama-bench` is given (all layers on the device, through scripts/vk-vs-llamacpp.sh, then the
# experts of every layer on the CPU: `--n-cpu-moe`); a 36-layer file too when `LAYERS36=1` and
# time is left.
#
# Usage: scripts/gpu-check.sh AUBIER [MODEL.gguf] [LLAMA_BENCH]
#   AUBIER       a prebuilt `aubier` (release, stripped: `strip target/release/aubier`)
#   MODEL.gguf   the 4-layer synthetic model; made with `AUBIER synth` when absent
#                (default ./ms4-synth-q2k.gguf)
#   LLAMA_BENCH  llama.cpp's `llama-bench` built with -DGGML_VULKAN=ON (optional)
# Environment: DEVICE (the Vulkan device index, default: aubier's choice), PEAK_GBS (the device's
# memory bandwidth in GB/s for the roofline, e.g. 4800 for an H200; default: not printed),
# N_PROMPT (default 64), N_GEN (default 64), REPS (default 3), LAYERS36=1.
#
# Sending it to a device machine: the working tree plus carried paths is limited (64 MiB), and
# tests/data alone is larger. Send a worktree with what the script needs instead:
#   git worktree add /tmp/gpu HEAD && cd /tmp/gpu && git sparse-checkout set scripts models
#   cp <repo>/target/release/aubier /tmp/gpu/aubier && strip /tmp/gpu/aubier
# then run `scripts/gpu-check.sh ./aubier` there (the model is made on the device machine).
set -euo pipefail
aubier=$1
model=${2:-ms4-synth-q2k.gguf}
llama=${3:-}
n_prompt=${N_PROMPT:-64} n_gen=${N_GEN:-64} reps=${REPS:-3}
device=()
[ -n "${DEVICE:-}" ] && device=(--device "$DEVICE")
start=$(date +%s)
lscpu | grep -E 'Model name' || true
"$aubier" devices | head -20
if [ ! -e "$model" ]; then
    "$aubier" synth --out "$model" --layers 4 --experts 128 --quant Q2_K --seed 0
fi

# One `aubier bench --json` line: tok/s, served fraction, host store MB per token, roofline; or,
# when the case does not run (a fast store larger than the device), the error's last line.
bench() {
    local label=$1
    shift
    local out
    out=$(mktemp -d)
    if ! "$aubier" bench --model "$model" --backend vulkan "${device[@]}" --n-prompt "$n_prompt" \
        --n-gen "$n_gen" --reps "$reps" --json "$@" >"$out/json" 2>"$out/err"; then
        echo "$label: did not run: $(tail -n 1 "$out/err")"
        return 0
    fi
    python3 -c '
import json, os, sys
r = json.load(sys.stdin)
label, peak = sys.argv[1], os.environ.get("PEAK_GBS")
d, p = r["decode_tok_s"]["median"], r["prefill_tok_s"]["median"]
read = r["weight_bytes_per_token"]["total"]
roof = f", {d * read / 1e9 / float(peak):.3f} of the {peak} GB/s roofline" if peak else ""
print(f"{label}: prefill {p:.2f} tok/s, decode {d:.2f} tok/s, served {r['"'"'served_fraction'"'"']:.3f}, "
      f"host store {r['"'"'host_bytes_per_token'"'"'] / 1e6:.1f} MB/token, {read / 1e6:.0f} MB read/token{roof} "
      f"({r['"'"'device'"'"']})")
' "$label" <"$out/json"
}

bench "all resident" --n-res 128
for policy in 2q lru static; do
    bench "quarter resident, $policy" --n-res 32 --policy "$policy"
done
if [ -n "$llama" ]; then
    # Every layer on the device: both engines, their ratios and aubier's per-kernel GB/s (issue 37).
    AUBIER_DEVICE=${DEVICE:-} N_PROMPT=$n_prompt N_GEN=$n_gen REPS=$reps \
        "$(dirname "$0")/vk-vs-llamacpp.sh" "$aubier" "$llama" "$model"
    "$llama" -m "$model" -ngl 99 -fa 1 -p "$n_prompt" -n "$n_gen" -r "$reps" --n-cpu-moe 3
fi
echo "elapsed $(( $(date +%s) - start )) s"
if [ "${LAYERS36:-0}" = 1 ]; then
    big=ms4-synth36-q2k.gguf
    [ -e "$big" ] || "$aubier" synth --out "$big" --layers 36 --experts 128 --quant Q2_K --seed 0
    model=$big bench "36 layers, default budget"
    echo "elapsed $(( $(date +%s) - start )) s"
fi
