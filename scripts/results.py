#!/usr/bin/env python3
"""Builds docs/RESULTS.md, the page that says where aubier stands, from the receipts in docs/bench/.

A receipt is one JSON object per measurement (schema `aubier-receipt/1`, written by `--receipt
FILE` of `aubier bench` / `replay` / `quality`, or transcribed from the lab notebook
docs/BENCHMARKS.md; the fields are described in server/src/receipt.rs). Receipts are ordered by
`date` (ISO 8601 UTC text; a receipt without one counts as the oldest), then by file name. The page
shows, per host and backend, the latest receipt of each kind of measurement: speed against the peer
(llama.cpp) with the ratio, speed of the other backends, the mask cost of constrained decoding,
served fractions of the expert-placement replays, quality verdicts and the server soak. Plots are
SVG files under docs/results/, written deterministically (no timestamps, fixed float formatting,
inputs sorted), so that the same receipts give the same bytes.

Usage: scripts/results.py [--check] [--receipts DIR] [--out FILE]
  --check: write nothing; exit 1 naming each file that differs from what would be written (CI).
Exit status 2 with a message naming the file for a receipt that cannot be read.
Python 3 standard library only.
"""

import argparse
import json
import os
import re
import sys
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = "aubier-receipt/1"
KINDS = ("bench", "replay", "quality", "soak")
PEER_GOALS = ((1.0, "prefill goal 1.0×"), (1.25, "decode goal 1.25×"))
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")
DASH = "—"


class ReceiptError(Exception):
    """A receipt that cannot be used; the message names the file."""


def load_receipts(directory):
    """The receipts of `directory` (its `*.json` files), each with `_file` set to its file name,
    in page order: by date (none first), then by file name. Raises ReceiptError."""
    out = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            raise ReceiptError(f"{path}: not a JSON file ({e})") from e
        check_receipt(path, r)
        r["_file"] = name
        out.append(r)
    out.sort(key=lambda r: (r["date"] or "", r["_file"]))
    return out


def check_receipt(path, r):
    """Raises ReceiptError unless `r` has the receipt's fields with usable types."""
    if not isinstance(r, dict):
        raise ReceiptError(f"{path}: not a JSON object")
    if r.get("schema") != SCHEMA:
        raise ReceiptError(f"{path}: schema is {r.get('schema')!r}, expected {SCHEMA!r}")
    for key in ("kind", "date", "command", "commit", "host", "backend", "device", "model",
                "peer", "figures", "source"):
        if key not in r:
            raise ReceiptError(f"{path}: no field {key!r} (null where unknown)")
    if r["kind"] not in KINDS:
        raise ReceiptError(f"{path}: kind {r['kind']!r} is not one of {', '.join(KINDS)}")
    if r["date"] is not None and not re.fullmatch(
            r"\d{4}-\d\d-\d\d(T\d\d:\d\d(:\d\d)?Z)?", str(r["date"])):
        raise ReceiptError(f"{path}: date {r['date']!r} is not YYYY-MM-DD[THH:MM[:SS]Z]")
    if not isinstance(r["host"], dict):
        raise ReceiptError(f"{path}: host is not an object")
    if not isinstance(r["figures"], (dict, list)):
        raise ReceiptError(f"{path}: figures is not an object or a list")
    if r["kind"] == "replay" and not all(
            isinstance(row, dict) and isinstance(row.get("policies"), dict)
            for row in as_list(r["figures"])):
        raise ReceiptError(f"{path}: a replay's figures are {{slots, policies}} rows")


def as_list(x):
    return x if isinstance(x, list) else [x]


def get(obj, *keys):
    """obj[k0][k1]…, or None where a level is missing or null."""
    for k in keys:
        if not isinstance(obj, dict) or obj.get(k) is None:
            return None
        obj = obj[k]
    return obj


def num(x, digits):
    """`x` with `digits` decimals, or a dash for null."""
    return DASH if x is None else f"{x:.{digits}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def host_label(h):
    """The host as a reader names it: the CPU's model name (else its vendor), family/model and
    CPU count where known."""
    name = h.get("model_name") or h.get("vendor") or "unknown CPU"
    extra = []
    if h.get("cpu_family") is not None and h.get("cpu_model") is not None:
        extra.append(f"family {h['cpu_family']} model {h['cpu_model']}")
    if h.get("cpus") is not None:
        extra.append(f"{h['cpus']} CPUs")
    return name + (f" ({', '.join(extra)})" if extra else "")


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def short(commit):
    return DASH if not commit else f"`{commit[:7]}`"


def base(path):
    return DASH if not path else os.path.basename(path)


def flags(text):
    """A configuration's flags as code, or "defaults" for none."""
    return f"`{text}`" if text else "defaults"


def link(r):
    return f"[{r['_file']}](bench/{r['_file']})"


def latest_by(receipts, key):
    """The last receipt of each `key(r)`, in the order of the keys' sorted text."""
    last = {}
    for r in receipts:
        last[key(r)] = r
    return [last[k] for k in sorted(last, key=lambda k: json.dumps(k))]


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


# ---------------------------------------------------------------------------------------------
# SVG


def nice_step(span, ticks=5):
    """A tick step of 1, 2, 2.5 or 5 times a power of ten giving about `ticks` ticks over `span`."""
    raw = span / ticks
    power = 10.0 ** int(f"{raw:e}".split("e")[1])
    for m in (1, 2, 2.5, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power


def fmt(v):
    """A coordinate: one decimal, no negative zero."""
    s = f"{v:.1f}"
    return "0.0" if s == "-0.0" else s


def tick_text(v, step):
    digits = 0 if step >= 1 else 1 if step >= 0.1 else 2 if step >= 0.01 else 3
    return f"{v:.{digits}f}"


def line_plot(title, x_label, y_label, xs, x_ticks, series, hlines=(), y_min=None, y_max=None):
    """An SVG line chart. `xs`: the x values (numbers); `x_ticks`: [(x, text)]; `series`:
    [(name, [y or None per x])]; `hlines`: [(y, text)] dashed reference lines."""
    w, h, left, right, top, bottom = 700, 360, 64, 170, 36, 52
    ys = [y for _, vals in series for y in vals if y is not None] + [y for y, _ in hlines]
    lo = min(ys) if y_min is None else y_min
    hi = max(ys) if y_max is None else y_max
    if hi <= lo:
        hi = lo + 1.0
    step = nice_step(hi - lo)
    lo = step * int(lo // step)
    hi = step * -int(-hi // step)
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    pw, ph = w - left - right, h - top - bottom

    def px(x):
        return left + (x - x_lo) / (x_hi - x_lo) * pw

    def py(y):
        return top + (hi - y) / (hi - lo) * ph

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
         f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{fmt(w / 2)}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>']
    n = int(round((hi - lo) / step))
    for i in range(n + 1):
        y = lo + i * step
        o.append(f'<line x1="{left}" y1="{fmt(py(y))}" x2="{left + pw}" y2="{fmt(py(y))}" '
                 f'stroke="#e0e0e0"/>')
        o.append(f'<text x="{left - 6}" y="{fmt(py(y) + 4)}" text-anchor="end">'
                 f'{tick_text(y, step)}</text>')
    for x, text in x_ticks:
        o.append(f'<text x="{fmt(px(x))}" y="{top + ph + 16}" text-anchor="middle">'
                 f'{escape(text)}</text>')
    o.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    o.append(f'<text x="{fmt(left + pw / 2)}" y="{h - 12}" text-anchor="middle">'
             f'{escape(x_label)}</text>')
    o.append(f'<text x="14" y="{fmt(top + ph / 2)}" text-anchor="middle" '
             f'transform="rotate(-90 14 {fmt(top + ph / 2)})">{escape(y_label)}</text>')
    legend_y = top + 8
    for y, text in hlines:
        o.append(f'<line x1="{left}" y1="{fmt(py(y))}" x2="{left + pw}" y2="{fmt(py(y))}" '
                 f'stroke="#888" stroke-dasharray="5 4"/>')
        o.append(f'<line x1="{left + pw + 10}" y1="{legend_y}" x2="{left + pw + 30}" '
                 f'y2="{legend_y}" stroke="#888" stroke-dasharray="5 4"/>')
        o.append(f'<text x="{left + pw + 34}" y="{legend_y + 4}">{escape(text)}</text>')
        legend_y += 18
    for k, (name, vals) in enumerate(series):
        color = COLORS[k % len(COLORS)]
        runs, run = [], []
        for x, y in zip(xs, vals):
            if y is None:
                runs, run = runs + [run] if run else runs, []
            else:
                run.append((x, y))
        runs += [run] if run else []
        for r in runs:
            pts = " ".join(f"{fmt(px(x))},{fmt(py(y))}" for x, y in r)
            o.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in zip(xs, vals):
            if y is not None:
                o.append(f'<circle cx="{fmt(px(x))}" cy="{fmt(py(y))}" r="3" fill="{color}"/>')
        o.append(f'<line x1="{left + pw + 10}" y1="{legend_y}" x2="{left + pw + 30}" '
                 f'y2="{legend_y}" stroke="{color}" stroke-width="2"/>')
        o.append(f'<text x="{left + pw + 34}" y="{legend_y + 4}">{escape(name)}</text>')
        legend_y += 18
    o.append("</svg>")
    return "\n".join(o) + "\n"


# ---------------------------------------------------------------------------------------------
# Sections


def bench_key(r):
    h = r["host"]
    return (host_label(h), h.get("isa") or "", r["backend"] or "", r["device"] or "",
            base(r["model"]))


def is_vulkan(r):
    """Whether a receipt measured the `vulkan` backend (its name starts with it)."""
    return (r["backend"] or "").startswith("vulkan")


def peer_table(rs, device):
    """The table of the latest receipt per key against its peer (with a device column and
    prefill to two decimals when `device`), each row with the ratio range over every receipt
    of its key."""
    digits = 2 if device else 1
    rows = []
    for r in latest_by(rs, bench_key):
        f, p = r["figures"], r["peer"]
        key = bench_key(r)
        same = [x for x in rs if bench_key(x) == key]
        rng = []
        for what in ("prefill_tok_s", "decode_tok_s"):
            v = [ratio(get(x, "figures", what, "median"), get(x, "peer", what, "median"))
                 for x in same]
            v = [x for x in v if x is not None]
            rng.append(f"{min(v):.2f}–{max(v):.2f}× ({len(v)})" if v else DASH)
        pr = ratio(get(f, "prefill_tok_s", "median"), get(p, "prefill_tok_s", "median"))
        dr = ratio(get(f, "decode_tok_s", "median"), get(p, "decode_tok_s", "median"))
        rows.append([
            key[0], key[1] or DASH, key[2] or DASH] + ([key[3] or DASH] if device else []) + [
            key[4],
            f"{get(f, 'n_prompt') or DASH} + {get(f, 'n_gen') or DASH}",
            num(get(f, "prefill_tok_s", "median"), digits),
            num(get(p, "prefill_tok_s", "median"), digits),
            "**" + num(pr, 2) + "×**" if pr is not None else DASH,
            num(get(f, "decode_tok_s", "median"), 2), num(get(p, "decode_tok_s", "median"), 2),
            "**" + num(dr, 2) + "×**" if dr is not None else DASH,
            rng[0], rng[1],
            short(r["commit"]), r["date"] or DASH, link(r)])
    return table(["host", "ISA", "backend"] + (["device"] if device else []) + [
                  "model", "prompt + gen tokens",
                  "aubier prefill tok/s", "llama.cpp prefill", "ratio",
                  "aubier decode tok/s", "llama.cpp decode", "ratio",
                  "prefill ratio range (receipts)", "decode ratio range (receipts)",
                  "commit", "date", "receipt"], rows) + [""]


def speed_vs_peer(rs, plots):
    out = peer_table(rs, device=False)
    hosts = sorted({host_label(r["host"]) for r in rs})
    for host in hosts:
        hr = [r for r in rs if host_label(r["host"]) == host]
        xs = list(range(1, len(hr) + 1))
        isas = sorted({r["host"].get("isa") or DASH for r in hr})
        series = [(f"{what}, {isa}" if len(isas) > 1 else what,
                   [ratio(get(r, "figures", f"{what}_tok_s", "median"),
                          get(r, "peer", f"{what}_tok_s", "median"))
                    if (r["host"].get("isa") or DASH) == isa else None for r in hr])
                  for isa in isas for what in ("prefill", "decode")]
        every = max(1, len(xs) // 10)
        name = f"speed-{slug(host)}.svg"
        plots[name] = line_plot(
            f"aubier ÷ llama.cpp, {host}", "receipts in date order (oldest left)",
            "ratio (aubier ÷ llama.cpp)", xs,
            [(x, str(x)) for x in xs if (x - 1) % every == 0], series, PEER_GOALS, y_min=0.0)
        out += [f"![aubier ÷ llama.cpp on {host}](results/{name})", ""]
    return out


def speed_vs_peer_vulkan(rs, plots):
    return peer_table(rs, device=True)


def speed_by_backend(rs, plots):
    out = []
    rows = []
    for r in latest_by(rs, bench_key):
        f = r["figures"]
        key = bench_key(r)
        rss = get(f, "peak_rss_bytes")
        rows.append([key[0], key[1] or DASH, key[2] or DASH, key[3] or DASH, key[4],
                     f"{get(f, 'n_prompt') or DASH} + {get(f, 'n_gen') or DASH}",
                     num(get(f, "prefill_tok_s", "median"), 2),
                     num(get(f, "decode_tok_s", "median"), 2),
                     num(None if rss is None else rss / 2**20, 0),
                     short(r["commit"]), r["date"] or DASH, link(r)])
    out += table(["host", "ISA", "backend", "device", "model", "prompt + gen tokens",
                  "prefill tok/s", "decode tok/s", "peak RSS MiB", "commit", "date", "receipt"],
                 rows)
    return out + [""]


def mask_cost(rs, plots):
    out = []

    def key(r):
        g = get(r, "figures", "grammar", "grammar") or ""
        return bench_key(r) + (g.split(" ")[0],)

    rows = []
    for r in latest_by(rs, key):
        g = r["figures"]["grammar"]
        rows.append([key(r)[0], key(r)[1] or DASH, base(r["model"]), key(r)[5],
                     num(get(g, "masks"), 0), num(get(g, "mask_ms_median"), 3),
                     num(get(g, "mask_ms_p99"), 3), num(get(g, "exposed_ms_per_token"), 3),
                     f"{num(get(g, 'step_ms'), 2)} → {num(get(g, 'constrained_step_ms'), 2)}",
                     num(get(g, "slowdown"), 3), short(r["commit"]), r["date"] or DASH, link(r)])
    out += table(["host", "ISA", "model", "grammar", "masks", "mask median ms", "mask p99 ms",
                  "mask wait not hidden, ms/token", "decode ms/token without → with",
                  "pairs' ratio", "commit", "date", "receipt"], rows)
    return out + [""]


def placement(rs, plots):
    out = []
    for r in latest_by(rs, lambda r: r["model"] or ""):
        rows = sorted(as_list(r["figures"]), key=lambda row: row.get("slots") or 0)
        policies = []
        for row in rows:
            policies += [p for p in row["policies"] if p not in policies]
        trace = r["model"] or DASH
        out += [f"### {trace}", "",
                f"Commit {short(r['commit'])}, {r['date'] or DASH}, {link(r)}.", ""]
        out += table(["slots"] + policies,
                     [[row.get("slots")] + [num(get(row, "policies", p), 4) for p in policies]
                      for row in rows])
        out.append("")
        xs = [row.get("slots") or 0 for row in rows]
        if len(xs) > 1:
            name = f"served-{slug(trace)}.svg"
            plots[name] = line_plot(
                f"served fraction, {trace[:70]}", "fast-store slots per layer",
                "served fraction", xs, [(x, str(x)) for x in xs],
                [(p, [get(row, "policies", p) for row in rows]) for p in policies],
                y_min=0.0, y_max=1.0)
            out += [f"![served fraction against slots, {trace}](results/{name})", ""]
    return out


def quality(rs, plots):
    out = []

    def key(r):
        f = r["figures"]
        return (base(r["model"]), get(f, "a", "flags") or "", get(f, "b", "flags") or "",
                get(f, "tokens") or 0)

    rows = []
    for r in latest_by(rs, key):
        f = r["figures"]
        ci = get(f, "ci95")
        ci_text = f"[{ci[0]:+.5f}, {ci[1]:+.5f}]" if isinstance(ci, list) and None not in ci \
            else DASH
        rows.append([base(r["model"]), flags(get(f, "a", "flags")),
                     flags(get(f, "b", "flags")), num(get(f, "positions"), 0),
                     f"{num(get(f, 'a', 'mean_nll'), 6)} → {num(get(f, 'b', 'mean_nll'), 6)}",
                     num(get(f, "mean_diff"), 5), ci_text, num(get(f, "margin"), 3),
                     f"**{get(f, 'verdict') or DASH}**", short(r["commit"]), r["date"] or DASH,
                     link(r)])
    out += table(["model", "A", "B", "positions", "mean NLL A → B", "mean diff", "95% CI",
                  "margin", "verdict", "commit", "date", "receipt"], rows)
    return out + [""]


def soak(rs, plots):
    out = []
    rows = []
    for r in latest_by(rs, bench_key):
        f = r["figures"]
        rows.append([host_label(r["host"]), r["backend"] or DASH, base(r["model"]),
                     num(get(f, "requests"), 0), num(get(f, "seconds"), 1),
                     num(get(f, "unexpected_errors"), 0),
                     f"{num(get(f, 'latency_ms', 'p50'), 1)} / {num(get(f, 'latency_ms', 'p99'), 1)}",
                     f"{num(get(f, 'rss_mib', 'boot'), 1)} / {num(get(f, 'rss_mib', 'after_1000'), 1)}"
                     f" / {num(get(f, 'rss_mib', 'end'), 1)}",
                     short(r["commit"]), r["date"] or DASH, link(r)])
    out += table(["host", "backend", "model", "requests", "seconds", "unexpected errors",
                  "latency p50 / p99 ms", "RSS MiB boot / after 1,000 / end", "commit", "date",
                  "receipt"], rows)
    return out + [""]


def has_grammar(r):
    """Whether a bench receipt measured constrained decoding (its figures have `grammar`)."""
    return get(r, "figures", "grammar") is not None


# The page's sections: title, body, which receipts it shows, its introduction.
SECTIONS = (
    ("Speed against llama.cpp (CPU)", speed_vs_peer,
     lambda r: r["kind"] == "bench" and r["peer"] is not None and not has_grammar(r)
     and not is_vulkan(r),
     "The latest receipt of each host, ISA tier, backend and model; the peer ran the same "
     "file and shape on the same host (`docs/llamacpp_bench.py`). Ratios are aubier ÷ "
     "llama.cpp (medians); the goals of issue 7 are prefill ≥ 1.0× and decode ≥ 1.25×. "
     "The range is that of the ratios over every receipt of the row's key: these hosts' "
     "figures move from run to run."),
    ("Speed against llama.cpp's Vulkan backend (same device)", speed_vs_peer_vulkan,
     lambda r: r["kind"] == "bench" and r["peer"] is not None and not has_grammar(r)
     and is_vulkan(r),
     "`scripts/vk-vs-llamacpp.sh` with `RECEIPT` set: aubier's `vulkan` backend and "
     "llama.cpp's Vulkan backend (`llama-bench -ngl 99 -fa on`) on the same file and device, "
     "the latest receipt per host, device and model. Ratios are aubier ÷ llama.cpp (medians); "
     "the goals of issue 37 are prefill ≥ 1.0× and decode ≥ 1.0×. On lavapipe (a software "
     "device on the CPU) llama.cpp keeps the output head on the CPU, which weighs most in a "
     "file of few layers (BENCHMARKS.md, \"The layer count\")."),
    ("Speed by backend", speed_by_backend,
     lambda r: r["kind"] == "bench" and r["peer"] is None and not has_grammar(r),
     "The latest `aubier bench` without a peer for each host, ISA tier, backend, device "
     "and model (the Vulkan rows on lavapipe are a software device on the CPU: "
     "correctness, not speed)."),
    ("Constrained decoding: the mask's cost", mask_cost,
     lambda r: r["kind"] == "bench" and has_grammar(r),
     "`aubier bench --json-schema` / `--tools` (`server/src/bench.rs`, step 6): the latest "
     "receipt per host, model and grammar. The goal: a constrained decode within 5% of "
     "an unconstrained one."),
    ("Expert placement: served fraction against slots", placement,
     lambda r: r["kind"] == "replay",
     "`aubier replay`: the fraction of routed (token, layer, expert) slots served from the "
     "fast store, per policy and number of slots per layer; the latest receipt per trace. "
     "`static` and `min` are offline oracles (`min`, Belady's MIN, is the ceiling). "
     "Replays are deterministic: any host gives the same figures."),
    ("Numerics: `aubier quality`", quality, lambda r: r["kind"] == "quality",
     "Paired per-position NLL differences B − A (nats/token), 95% interval by paired t; "
     "the latest receipt per model, configurations and token count."),
    ("Server soak", soak, lambda r: r["kind"] == "soak",
     "`server/examples/soak.py` against one `aubier serve`: the latest receipt per host "
     "and backend."),
)


def render(receipts):
    """(page text, {svg file name: text}) for `receipts` in page order."""
    plots = {}
    out = ["# Results", "",
           "<!-- Generated by scripts/results.py from docs/bench/*.json: do not edit; "
           "rerun `python3 scripts/results.py` after adding a receipt. -->", "",
           "Where aubier stands, from the receipts in [bench/](bench/): one JSON file per "
           "measurement, written by `aubier bench` / `replay` / `quality --receipt FILE` "
           "(`server/src/receipt.rs`) or transcribed from the lab notebook "
           "[BENCHMARKS.md](BENCHMARKS.md), which keeps the method, the history and the "
           "caveats of every figure. A dash is a figure the receipt does not have. Hosts are "
           "named as `/proc/cpuinfo` (lscpu) names them; ISA is the tier of the `cpu` "
           "backend's kernels.", "",
           f"{len(receipts)} receipts.", ""]
    for title, body, wanted, intro in SECTIONS:
        rs = [r for r in receipts if wanted(r)]
        out += [f"## {title}", "", intro if rs else "No receipt yet.", ""]
        if rs:
            out += body(rs, plots)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n", plots


def outputs(receipts_dir, page):
    """{path: text} of every file the page consists of."""
    text, plots = render(load_receipts(receipts_dir))
    plot_dir = os.path.join(os.path.dirname(page), "results")
    files = {page: text}
    for name, svg in plots.items():
        files[os.path.join(plot_dir, name)] = svg
    return files, plot_dir


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a file differs from what would be written")
    ap.add_argument("--receipts", default=os.path.join(ROOT, "docs", "bench"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "RESULTS.md"))
    a = ap.parse_args(argv)
    try:
        files, plot_dir = outputs(a.receipts, a.out)
    except (ReceiptError, OSError) as e:
        print(f"results.py: {e}", file=sys.stderr)
        return 2
    stale = []
    if os.path.isdir(plot_dir):
        stale = [os.path.join(plot_dir, n) for n in sorted(os.listdir(plot_dir))
                 if n.endswith(".svg") and os.path.join(plot_dir, n) not in files]
    if a.check:
        bad = []
        for path, text in sorted(files.items()):
            try:
                with open(path, encoding="utf-8") as f:
                    same = f.read() == text
            except OSError:
                same = False
            if not same:
                bad.append(path)
        bad += stale
        for path in bad:
            print(f"results.py: {os.path.relpath(path, ROOT)} is not what the receipts give; "
                  "run python3 scripts/results.py", file=sys.stderr)
        return 1 if bad else 0
    os.makedirs(plot_dir, exist_ok=True)
    for path in stale:
        os.remove(path)
    for path, text in sorted(files.items()):
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
