#!/usr/bin/env python3
"""Import circles between the source files of each crate of the workspace.

Every `.rs` file under a crate's `src/` is a module (`lib.rs`/`main.rs` the root, `a/mod.rs` and
`a.rs` the module `a`). An edge A -> B means file A names an item of module B: a `use` (or `pub
use`) or a path in code that starts with `crate::`, `super::` or `self::` (or a module declared
by A), resolved to the longest existing module prefix; a module's own items and its `#[cfg(test)]`
module are not edges. Declaring a child (`mod b;`) is not an edge. The strongly connected
components of more than one file are the circles; the script prints each with one edge path
and exits 1, or prints `no import circle` per crate and exits 0.

Usage: scripts/module-cycles.py [CRATE_DIR ...]   (default: every crate of the workspace)
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRATES = ["dsl", "compiler", "kernels-gen", "runtime", "server", "tests"]


def modules(src):
    """{module path tuple: file} for the files under `src`."""
    out = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            out[tuple(parts)] = os.path.join(dirpath, f)
    return out


def strip_tests(text):
    """The text without `#[cfg(test)] mod tests { ... }` blocks, comments and strings."""
    text = re.sub(r'\br(#+)".*?"\1', '""', text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text, flags=re.S)
    text = re.sub(r"'(?:\\.|[^'\\])'", "' '", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def use_paths(text):
    """Every path a `use` declaration names (braces expanded), and every `crate::`/`super::`
    path in code."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        paths.extend(expand(re.sub(r"\s+", "", m.group(1))))
    for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", text):
        paths.append(m.group(1))
    return paths


def expand(tree):
    """`a::{b, c::{d}}` -> [`a::b`, `a::c::d`]."""
    i = tree.find("{")
    if i < 0:
        return [tree.split(" as ")[0]]
    prefix, inner = tree[:i], tree[i + 1 : tree.rfind("}")]
    items, depth, start = [], 0, 0
    for j, c in enumerate(inner):
        depth += c == "{"
        depth -= c == "}"
        if c == "," and depth == 0:
            items.append(inner[start:j])
            start = j + 1
    items.append(inner[start:])
    return [p for it in items if it for p in expand(prefix + it)]


def resolve(path, here, mods):
    """The module a path names from module `here`, or None (an external crate)."""
    parts = path.split("::")
    if parts[0] == "crate":
        base, rest = (), parts[1:]
    elif parts[0] in ("super", "self"):
        base = here
        rest = parts
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    else:
        # a path relative to `here`: a child module declared by it
        base, rest = here, parts
        if (here + (parts[0],)) not in mods:
            return None
    best = base
    for k in range(1, len(rest) + 1):
        if base + tuple(rest[:k]) in mods:
            best = base + tuple(rest[:k])
        else:
            break
    return best


def graph(src):
    mods = modules(src)
    edges = {}
    for m, path in mods.items():
        text = strip_tests(open(path, encoding="utf-8").read())
        for p in use_paths(text):
            t = resolve(p, m, mods)
            if t is not None and t != m:
                edges.setdefault(m, set()).add(t)
    return mods, edges


def sccs(nodes, edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def name(m):
    return "::".join(m) or "(root)"


def main():
    crates = sys.argv[1:] or [os.path.join(ROOT, c) for c in CRATES]
    bad = False
    for crate in crates:
        src = os.path.join(crate, "src")
        mods, edges = graph(src)
        circles = sccs(mods, edges)
        label = os.path.basename(os.path.normpath(crate))
        if not circles:
            print(f"{label}: no import circle ({len(mods)} files)")
            continue
        bad = True
        for comp in circles:
            members = sorted(comp)
            print(f"{label}: circle among {', '.join(name(m) for m in members)}")
            for m in members:
                for t in sorted(edges.get(m, ())):
                    if t in comp:
                        print(f"    {name(m)} -> {name(t)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
