#!/usr/bin/env bash
# aubier's Vulkan backend against llama.cpp's on one GGUF file and one Vulkan device, in one
# script (issue 37; docs/BENCHMARKS.md, "Vulkan kernels against llama.cpp's"). It builds nothing:
# it takes the two binaries. llama-bench runs with every layer on the device and flash attention
# on (`-ngl 99 -fa on`), `aubier bench --backend vulkan` with the same prompt length, generated
# tokens and repetitions; then it prints each engine's prefill and decode tok/s, aubier's ratio to
# llama.cpp for each, and aubier's time and weight GB/s per kernel from its own GPU timestamps
# (weight bytes a decoded token reads through the kernel ÷ the kernel's decode time).
#
# `-ngl 99` does not put every op on the device: llama.cpp's scheduler keeps on the CPU what the
# device cannot hold or what the loader repacked for the CPU (on lavapipe: the output head and the
# routed experts' down product). So the whole-engine ratios above are not device against device.
# Four short untimed llama-bench runs after the timed ones say where they are not and compare like
# for like:
#   - `GGML_SCHED_DEBUG=2 -v`, one decode (`-p 0 -n 2 -r 1`) and one prefill (`-p N_PROMPT -n 0
#     -r 1`): the scheduler's split lines; the script prints the ops of the CPU splits (op, node,
#     weight) and the role of each;
#   - `GGML_VK_PERF_LOGGER=1`, the same two shapes: llama.cpp's device time per op (its
#     "Vulkan Timings:" blocks, one per device split per graph; the warmup graph is dropped, the
#     decode time is per decoded token, the prefill time per prompt of N_PROMPT tokens);
# and it matches them with aubier's per-kernel, per-step device times (`aubier bench --json`,
# "kernels"[].steps: op, weights with ggml type and dimensions) by role: output head; attn_output;
# attn_q_a/q_b/kv_a; attention core (attn_k_b, attn_v_b, the attention itself); shared expert
# gate/up/down; routed experts gate+up; routed experts down; router; token embedding; other (norms,
# RoPE, activations, adds). A llama.cpp mat-mul (type, m, k, experts, batch) is matched to the
# file's weight of that type and shape. It prints per role both engines' ms per decoded token and
# per prefill and their ratio, and the ratio of aubier's device time to llama.cpp's summed over the
# roles llama.cpp ran on the device (aubier's time in the roles llama.cpp ran on the CPU left out).
# llama.cpp's decode in these short runs attends over 1-2 cached tokens, aubier's over
# N_PROMPT + up to N_GEN: the attention core's row is not like for like.
#
# Usage: scripts/vk-vs-llamacpp.sh AUBIER LLAMA_BENCH MODEL
#   AUBIER: an aubier binary (cargo build --release -p aubier-server: target/release/aubier)
#   LLAMA_BENCH: llama.cpp's llama-bench built with -DGGML_VULKAN=ON
#   MODEL: a GGUF file both read (e.g. `aubier synth --out real1x8.gguf --layers 1 --experts 8`)
# Environment: N_PROMPT (default 64), N_GEN (16), REPS (3); AUBIER_DEVICE: aubier's `--device`
# index (`aubier devices`; default: aubier's own choice, the first hardware GPU, else a software
# device); GGML_VK_VISIBLE_DEVICES: llama.cpp's device (default 0: llama.cpp uses a CPU-type
# device such as lavapipe only when it is named). Name the same device to both.
# RECEIPT: a file to write the measurement's receipt to (`aubier bench --receipt`, for
# docs/bench/ and docs/RESULTS.md), llama-bench's medians, minima and maxima as its peer.
# The tok/s comparison and aubier's kernel table are printed before the untimed runs, so they
# stand when one of those fails (llama.cpp 0c1e570's perf logger aborts in the prefill run on an
# 8-layer file). Exits non-zero with a message when a run fails or llama-bench's debug or perf
# output is not in the format this script reads (ggml-backend.cpp's
# ggml_backend_sched_print_assignments, ggml-vulkan.cpp's vk_perf_logger::print_timings,
# llama.cpp 0c1e570).
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
# llama-bench's figures in the shape of docs/llamacpp_bench.py's: the receipt's peer, and what the
# comparison below reads.
python3 - "$out/llama.json" "$n_prompt" "$n_gen" "$reps" >"$out/peer.json" <<'PY'
import json, statistics, sys

llama = json.load(open(sys.argv[1]))
n_prompt, n_gen, reps = map(int, sys.argv[2:5])

def spread(prefill):
    rows = [r for r in llama if (r["n_gen"] == 0) == prefill]
    if len(rows) != 1:
        sys.exit(f"llama-bench gave {len(rows)} {'prefill' if prefill else 'decode'} rows, expected 1")
    v = rows[0]["samples_ts"]
    return rows[0], {"median": statistics.median(v), "min": min(v), "max": max(v)}

row, prefill = spread(True)
_, decode = spread(False)
print(json.dumps({
    "engine": f"llama.cpp {row.get('build_commit', '?')} Vulkan (llama-bench -ngl 99 -fa on)",
    "build": row.get("build_commit", "?"),
    "device": row.get("gpu_info") or row.get("backends"),
    "n_prompt": n_prompt, "n_gen": n_gen, "reps": reps,
    "prefill_tok_s": prefill, "decode_tok_s": decode,
    "ttft_ms": None, "peak_rss_bytes": None,
    "note": "llama-bench's tok/s: prefill of n_prompt tokens, decode of n_gen tokens, "
            "each its own timed test (scripts/vk-vs-llamacpp.sh)",
}, indent=2))
PY
receipt=()
if [ -n "${RECEIPT:-}" ]; then receipt=(--receipt "$RECEIPT" --peer "$out/peer.json"); fi
"$aubier" bench --model "$model" --backend vulkan "${device[@]}" --n-prompt "$n_prompt" \
    --n-gen "$n_gen" --reps "$reps" --json "${receipt[@]}" >"$out/aubier.json"

python3 - "$out/peer.json" "$out/aubier.json" <<'PY'
import json, sys

peer = json.load(open(sys.argv[1]))
aubier = json.load(open(sys.argv[2]))
lp, ld = peer["prefill_tok_s"]["median"], peer["decode_tok_s"]["median"]
info = f"{peer['device'] or ''}, build {peer['build']}"
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

# The untimed runs: where llama.cpp's scheduler puts each op, then its device time per op.
perf_gen=2
llama_probe() { # NAME ENV... LLAMA_BENCH ARGS: its stderr to $out/NAME.log, its stdout dropped
    local name=$1
    shift
    if ! env -u GGML_VK_PERF_LOGGER_CONCURRENT "$@" >/dev/null 2>"$out/$name.log"; then
        echo "llama-bench failed in the $name run:" >&2
        tail -n 20 "$out/$name.log" >&2
        exit 1
    fi
}
llama_probe sched_decode GGML_SCHED_DEBUG=2 "$llama" -m "$model" -ngl 99 -fa on -p 0 -n 2 -r 1 -v
llama_probe sched_prefill GGML_SCHED_DEBUG=2 "$llama" -m "$model" -ngl 99 -fa on \
    -p "$n_prompt" -n 0 -r 1 -v
llama_probe perf_decode GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=1 "$llama" \
    -m "$model" -ngl 99 -fa on -p 0 -n "$perf_gen" -r 1
llama_probe perf_prefill GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=1 "$llama" \
    -m "$model" -ngl 99 -fa on -p "$n_prompt" -n 0 -r 1

python3 - "$out" "$n_prompt" "$perf_gen" <<'PY'
import json, re, sys

out, n_prompt, perf_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llama = json.load(open(f"{out}/llama.json"))
aubier = json.load(open(f"{out}/aubier.json"))

def fail(msg):
    sys.exit(f"vk-vs-llamacpp: {msg}")

# Roles, in print order: a weight's role from its tensor name; a step without weights is the
# attention core when it is aubier's `kqkv` (scores, softmax, values), else "other".
ROLES = [
    ("output head", r"output\.weight"),
    ("attn_output", r"blk\.\d+\.attn_output\.weight"),
    ("attn_q_a/q_b/kv_a", r"blk\.\d+\.(attn_q_a|attn_q_b|attn_kv_a_mqa)\.weight"),
    ("attention core", r"blk\.\d+\.(attn_k_b|attn_v_b|attn_kv_b)\.weight"),
    ("shared expert gate/up/down", r"blk\.\d+\.ffn_(gate|up|down)_shexp\.weight"),
    ("routed experts gate+up", r"blk\.\d+\.ffn_(gate|up|gate_up)_exps\.weight"),
    ("routed experts down", r"blk\.\d+\.ffn_down_exps\.weight"),
    ("router", r"blk\.\d+\.ffn_gate_inp\.weight"),
    ("token embedding", r"token_embd\.weight"),
]
OTHER = "other (norms, RoPE, activations, adds)"
ORDER = [r for r, _ in ROLES] + [OTHER]

def role_of(name):
    for role, pat in ROLES:
        if re.fullmatch(pat, name):
            return role
    return OTHER

# aubier: device ms per role, from each kernel's steps.
if not aubier["kernels"] or "steps" not in aubier["kernels"][0]:
    fail("aubier bench --json has no kernels[].steps: an aubier binary older than this script")
weights = {}
a_ms = {"decode": {}, "prefill": {}}
for k in aubier["kernels"]:
    for s in k["steps"]:
        for w in s["weights"]:
            weights[w["name"]] = w
        roles = sorted({role_of(w["name"]) for w in s["weights"]} - {OTHER})
        if roles:
            role = " + ".join(roles)
        else:
            role = "attention core" if s["op"] == "kqkv" else OTHER
        for phase, f in (("decode", "decode_ms_per_token"), ("prefill", "prefill_ms")):
            a_ms[phase][role] = a_ms[phase].get(role, 0.0) + s[f]

def weights_named(prefix):
    """The file's weights whose name starts with the scheduler's (20-character) cut of it."""
    prefix = re.sub(r"#\d+$", "", prefix.strip())
    prefix = re.sub(r"^CPU#", "", prefix)
    return [n for n in weights if prefix and n.startswith(prefix)]

# llama.cpp's CPU ops: the node lines of the splits on the CPU backend
# (ggml_backend_sched_print_assignments with GGML_SCHED_DEBUG=2).
SPLIT = re.compile(r"## SPLIT #\d+: (\S+) # \d+ inputs")
NODE = re.compile(r"node #\s*\d+ \((.{10})\): (.{20}) \(.{5}\) \[.{5} .{8}\] use=\d+,c=\d:(.*)")
SRC = re.compile(r" (.{20}) \(.{5}\) \[.{5} .{8}\]")

def cpu_ops(phase):
    text = open(f"{out}/sched_{phase}.log", errors="replace").read().splitlines()
    backend, splits, nodes, ops = None, 0, 0, {}
    for line in text:
        m = SPLIT.match(line)
        if m:
            backend, splits = m.group(1), splits + 1
            continue
        m = NODE.match(line)
        nodes += bool(m)
        if m and backend is not None and backend.startswith("CPU"):
            op, node = m.group(1).strip(), re.sub(r"-\d+$", "", m.group(2).strip())
            ws = sorted({n for src in SRC.findall(m.group(3)) for n in weights_named(src)})
            roles = sorted({role_of(n) for n in ws}) or [OTHER]
            ops[(op, node, ", ".join(ws) or "-")] = roles
    if splits == 0:
        fail(f"no '## SPLIT #n: BACKEND # n inputs' lines in llama-bench's {phase} run with "
             "GGML_SCHED_DEBUG=2 -v: not the ggml_backend_sched_print_assignments format "
             "this script reads")
    if nodes == 0:
        fail(f"no 'node #n (OP): NAME (SIZE) [BACKEND CAUSE] use=n,c=n: SRC…' lines in "
             f"llama-bench's {phase} run with GGML_SCHED_DEBUG=2 -v: not the "
             "ggml_backend_sched_print_assignments format this script reads")
    return ops

# llama.cpp's device time per op: vk_perf_logger::print_timings blocks, one per device split
# per graph computed: "OP: COUNT x MEAN us = TOTAL us[ (… GFLOPS/s)]", then "Total time: … us.".
PERF = re.compile(r"(.+): (\d+) x (\S+) us = (\S+) us(?: \(.* GFLOPS/s\))?")
MM = re.compile(r"\b(MUL_MAT(?:_ID)?)(?:_VEC)? (\S+) m=(\d+) n=(\d+) k=(\d+)"
                r"(?: n_expert=(\d+))?(?: batch=(\d+))?$")

def perf_blocks(phase):
    blocks, cur = [], None
    for line in open(f"{out}/perf_{phase}.log", errors="replace").read().splitlines():
        if line == "Vulkan Timings:":
            cur = {}
            blocks.append(cur)
        elif cur is not None and line.startswith("Total time:"):
            cur = None
        elif cur is not None:
            m = PERF.fullmatch(line)
            if not m:
                fail(f"llama-bench's {phase} run with GGML_VK_PERF_LOGGER=1 printed {line!r} "
                     "inside a 'Vulkan Timings:' block: not the vk_perf_logger format this "
                     "script reads")
            cur[m.group(1)] = cur.get(m.group(1), 0.0) + float(m.group(4)) / 1000.0
    if not blocks:
        fail(f"no 'Vulkan Timings:' block in llama-bench's {phase} run with "
             "GGML_VK_PERF_LOGGER=1: not the vk_perf_logger format this script reads")
    return blocks

def op_role(key):
    """The role of one vk_perf_logger key, and the weights it matched."""
    if key.startswith("FLASH_ATTN_EXT"):
        return "attention core", []
    m = MM.search(key)
    if not m:
        return OTHER, []
    op, ty, mm, _, kk, n_exp, batch = m.groups()
    ws = []
    for name, w in weights.items():
        ne = w["ne"] + [1] * (4 - len(w["ne"]))
        if w["ggml_type"].lower() != ty.lower() or ne[0] != int(kk) or ne[1] != int(mm):
            continue
        if op == "MUL_MAT_ID" and ne[2] != int(n_exp):
            continue
        if op == "MUL_MAT" and ne[2] not in ({1, int(batch)} if batch else {1}):
            continue
        ws.append(name)
    roles = sorted({role_of(n) for n in ws})
    if len(roles) != 1:
        what = "no weight" if not roles else "weights of several roles: " + ", ".join(ws)
        return f"unmatched mat-mul ({what})", ws
    return roles[0], ws

# Graphs computed in each perf run: the warmup and the timed rep (llama-bench); a prefill of
# N tokens is ceil(N / n_ubatch) graphs.
ubatch = llama[0]["n_ubatch"]
graphs = {"decode": (1, perf_gen), "prefill": (-(-n_prompt // ubatch),) * 2}
l_ms, keys, prefill_keys = {}, {}, set()
for phase, (warm, timed) in graphs.items():
    blocks = perf_blocks(phase)
    if len(blocks) % (warm + timed):
        fail(f"llama-bench's {phase} perf run printed {len(blocks)} 'Vulkan Timings:' blocks, "
             f"not a multiple of the {warm + timed} graphs it computes")
    per_graph = len(blocks) // (warm + timed)
    per = timed if phase == "decode" else 1
    ms = {}
    for b in blocks[warm * per_graph:]:
        for key, t in b.items():
            role, ws = op_role(key)
            keys.setdefault(key, (role, ws))
            if phase == "prefill":
                prefill_keys.add(key)
            ms[role] = ms.get(role, 0.0) + t / per
    l_ms[phase] = ms

cpu = {p: cpu_ops(p) for p in ("decode", "prefill")}
print(f"llama.cpp ops on the CPU despite -ngl 99 (GGML_SCHED_DEBUG=2; decode -p 0 -n 2, "
      f"prefill -p {n_prompt} -n 0):")
for p in ("decode", "prefill"):
    for (op, node, ws), roles in sorted(cpu[p].items()):
        print(f"  {p:<8} {op:<11} {node:<18} {ws:<34} -> {', '.join(roles)}")
cpu_roles = {p: {r for rs in cpu[p].values() for r in rs} for p in cpu}
for p in cpu_roles:
    if OTHER in cpu_roles[p]:
        print(f"  ({p}: the CPU ops of role '{OTHER}' have no aubier counterpart to leave out; "
              f"aubier's '{OTHER}' stays in its total)")
        cpu_roles[p].discard(OTHER)
print("llama.cpp mat-muls on the device matched to the file's weights (type, m=ne1, k=ne0):")
for key, (role, ws) in sorted(keys.items()):
    if MM.search(key):
        print(f"  {key:<58} -> {role} ({', '.join(ws) or '-'})")

def tokens(m):
    """The tokens a matched mat-mul key ran over: n for MUL_MAT, the batch for MUL_MAT_ID."""
    return int(m.group(7) or 1) if m.group(1) == "MUL_MAT_ID" else int(m.group(4))
short = sorted({(keys[key][0], tokens(MM.search(key))) for key in prefill_keys
                if MM.search(key) and tokens(MM.search(key)) < n_prompt})
if short:
    print(f"llama.cpp's prefill ran these mat-muls over fewer than the {n_prompt} prompt tokens "
          "(after the last layer's attention it computes only the rows it outputs; aubier "
          "too since Plan::last_rows, from its routing weights on): "
          + ", ".join(f"{r} ({n} token{'s' if n > 1 else ''})" for r, n in short))
print(f"device time by role (llama.cpp: GGML_VK_PERF_LOGGER=1, -p 0 -n {perf_gen} and "
      f"-p {n_prompt} -n 0, warmup graph dropped; aubier: its timestamps in the run above; "
      "a/l: aubier's time / llama.cpp's, below 1 aubier is faster)")
print(f"{'role':<40} {'llama ms/tok':>12} {'aubier':>9} {'a/l':>6}   "
      f"{'llama ms/prefill':>16} {'aubier':>9} {'a/l':>6}")
roles = ORDER + sorted((set(a_ms["decode"]) | set(l_ms["decode"]) | set(l_ms["prefill"])
                        | set(a_ms["prefill"])) - set(ORDER))
def cell(p, role):
    a = a_ms[p].get(role, 0.0)
    if role in cpu_roles[p]:
        return f"{'CPU':>12} {a:>9.2f} {'-':>6}" if p == "decode" else \
            f"{'CPU':>16} {a:>9.2f} {'-':>6}"
    l = l_ms[p].get(role, 0.0)
    r = f"{a / l:>6.2f}" if l > 0 else f"{'-':>6}"
    return f"{l:>12.2f} {a:>9.2f} {r}" if p == "decode" else f"{l:>16.2f} {a:>9.2f} {r}"
for role in roles:
    if any(role in d for d in (a_ms["decode"], a_ms["prefill"], l_ms["decode"],
                               l_ms["prefill"])):
        print(f"{role:<40} {cell('decode', role)}   {cell('prefill', role)}")
tot = {}
for p in ("decode", "prefill"):
    l = sum(l_ms[p].values())
    a = sum(t for r, t in a_ms[p].items() if r not in cpu_roles[p])
    tot[p] = (l, a, sum(a_ms[p].values()))
(ld, ad, aad), (lp, ap, aap) = tot["decode"], tot["prefill"]
if min(ld, ad, lp, ap) <= 0:
    fail(f"a device time total is zero (llama.cpp {ld}, {lp} ms; aubier {ad}, {ap} ms): "
         "nothing to compare")
print(f"{'all ops llama.cpp ran on the device':<40} {ld:>12.2f} {ad:>9.2f} {ad / ld:>6.2f}   "
      f"{lp:>16.2f} {ap:>9.2f} {ap / lp:>6.2f}")
print(f"aubier / llama.cpp device time over the ops llama.cpp ran on the device "
      f"(aubier's {', '.join(sorted(cpu_roles['decode'])) or 'nothing'} left out of decode, "
      f"{', '.join(sorted(cpu_roles['prefill'])) or 'nothing'} of prefill): decode "
      f"{ad / ld:.3f}x, prefill {ap / lp:.3f}x the time (as a speed ratio like the tok/s ones: "
      f"decode {ld / ad:.3f}x, prefill {lp / ap:.3f}x)")
print(f"aubier's whole device time: {aad:.2f} ms per token, {aap:.2f} ms per prefill")
PY
