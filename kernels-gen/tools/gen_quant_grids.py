#!/usr/bin/env python3
"""Writes kernels-gen/src/quant_grids.rs: the lookup tables of the ggml i-quants and FP4 types.

The tables are read from PyPI gguf 0.19.0 (`gguf.quants`), whose dequantize output the
fixture README shows to be bit-exact with llama.cpp's `dequantize_row_*`. gguf-py stores each
grid packed (2 or 3 bits per element indexing `grid_map`); this script unpacks it with gguf-py's
own `init_grid` and re-encodes every row the way ggml-common.h spells it: one little-endian
integer whose bytes are the row's elements (u64 for 8-wide rows, u32 for 4-wide rows; IQ1S
bytes are int8 -1/0/+1).

Usage: pip install gguf==0.19.0 numpy && python3 kernels-gen/tools/gen_quant_grids.py > kernels-gen/src/quant_grids.rs
"""

import sys
from importlib.metadata import version

import numpy as np
from gguf import quants as q

if version("gguf") != "0.19.0":
    sys.exit(f"gguf 0.19.0 is required, found {version('gguf')}")


def rows(cls):
    cls.init_grid()
    grid = np.asarray(cls.grid).reshape(cls.grid_shape)
    return [[int(v) for v in row] for row in grid]


def pack(row):
    value = 0
    for k, v in enumerate(row):
        value |= (v & 0xFF) << (8 * k)
    return value


def table(name, ty, width, values, doc, per_line):
    hexw = 2 * width // 8 if ty.startswith("u") and width > 8 else None
    out = [f"/// {line}" if line else "///" for line in doc]
    out.append("#[rustfmt::skip]")
    out.append(f"pub static {name}: [{ty}; {len(values)}] = [")
    for start in range(0, len(values), per_line):
        chunk = values[start : start + per_line]
        if hexw:
            cells = ", ".join(f"0x{v:0{hexw}x}" for v in chunk)
        else:
            cells = ", ".join(str(v) for v in chunk)
        out.append(f"    {cells},")
    out.append("];")
    return "\n".join(out)


def main():
    parts = [
        "//! Lookup tables of the ggml i-quants and FP4 types (generated: do not edit).",
        "//!",
        "//! Written by `kernels-gen/tools/gen_quant_grids.py` from PyPI gguf 0.19.0 (`gguf/quants.py`), whose",
        "//! `dequantize` is bit-exact with llama.cpp `dequantize_row_*` (tests/data/quants/README.md).",
        "//! Each grid row is one little-endian integer whose bytes are the row's elements, as in",
        "//! llama.cpp `ggml/src/ggml-common.h` (`iq2xxs_grid`, `iq2xs_grid`, `iq2s_grid`,",
        "//! `iq3xxs_grid`, `iq3s_grid`, `iq1s_grid`, `ksigns_iq2xs`, `kvalues_iq4nl`, `kvalues_mxfp4`).",
        "//! The runtime's CPU decoders (`aubier_runtime::gguf::quant`) and the GPU dequant device functions",
        "//! ([`crate::gpu::quant`]) both read these tables, so both decode with the same values.",
        "//! Regenerate: `python3 kernels-gen/tools/gen_quant_grids.py > kernels-gen/src/quant_grids.rs`.",
        "",
    ]
    grids = [
        ("IQ2XXS_GRID", q.IQ2_XXS, "u64", 64, "`iq2xxs_grid`: 256 rows of 8 unsigned magnitudes in {8, 25, 43} (IQ2_XXS)."),
        ("IQ2XS_GRID", q.IQ2_XS, "u64", 64, "`iq2xs_grid`: 512 rows of 8 unsigned magnitudes in {8, 25, 43} (IQ2_XS)."),
        ("IQ2S_GRID", q.IQ2_S, "u64", 64, "`iq2s_grid`: 1024 rows of 8 unsigned magnitudes in {8, 25, 43} (IQ2_S)."),
        ("IQ3XXS_GRID", q.IQ3_XXS, "u32", 32, "`iq3xxs_grid`: 256 rows of 4 unsigned magnitudes (IQ3_XXS)."),
        ("IQ3S_GRID", q.IQ3_S, "u32", 32, "`iq3s_grid`: 512 rows of 4 odd magnitudes in 1..=15 (IQ3_S)."),
        ("IQ1S_GRID", q.IQ1_S, "u64", 64, "`iq1s_grid`: 2048 rows of 8 int8 values in {-1, 0, +1} (IQ1_S, IQ1_M)."),
    ]
    for name, cls, ty, width, doc in grids:
        values = [pack(r) for r in rows(cls)]
        per_line = 4 if width == 64 else 8
        parts.append(table(name, ty, width, values, [doc], per_line))
        parts.append("")
    ksigns = list(q.IQ2_XXS.ksigns)
    parts.append(table("KSIGNS_IQ2XS", "u8", 8, ksigns,
                       ["`ksigns_iq2xs`: a 7-bit sign index to 8 sign bits (bit j set: element j negative);",
                        "bit 7 makes the count of set bits even."], 16))
    parts.append("")
    parts.append(table("KVALUES_IQ4NL", "i8", 8, list(q.IQ4_NL.kvalues),
                       ["`kvalues_iq4nl`: the 16 non-linear 4-bit levels of IQ4_NL and IQ4_XS."], 16))
    parts.append("")
    parts.append(table("KVALUES_MXFP4", "i8", 8, list(q.MXFP4.kvalues),
                       ["`kvalues_mxfp4`: the 16 E2M1 (FP4) values, doubled (the scale decoders halve instead)."], 16))
    parts.append("")
    sys.stdout.write("\n".join(parts))


if __name__ == "__main__":
    main()
