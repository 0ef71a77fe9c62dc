#!/usr/bin/env python3
"""No import cycles between the modules of a library crate (issue 23: "No module of a library
crate imports a module that imports it").

For each library crate (a `src/lib.rs` under the workspace, examples included), every source
file is a module (`src/a.rs` or `src/a/mod.rs` is `a`, `src/a/b.rs` is `a::b`). A module
imports another when its code names a path into it: `crate::x::..`, `$crate::x::..`,
`super::..`, `self::..`, in `use` trees (braces expanded) and anywhere else in the code.
Imports are compared between siblings (modules with the same parent, the crate root's
children included): `a::b` naming `c::d` is an edge `a -> c` at the top level; `a::b`
naming `a::e` is an edge `b -> e` inside `a`. A child naming its parent (`use super::*`) is not
an edge: that is how a module tree is built. Unit tests (`#[cfg(test)] mod tests`, to the end
of the file) are left out: they are not part of the library.

Usage: python3 ci/module-cycles.py [workspace root]. Prints each crate's cycles and exits 1
if there is any not listed in KNOWN (the cycles left when the check was written, issue 23: to
be broken, never to be added to); prints the edge count per crate otherwise.
"""

import pathlib
import re
import sys

# Cycles tolerated while being broken (crate, modules). Empty since the last two were broken
# (taskq's `task` tree, taskq-web's `ctx` and `json`; see docs/design.md): any cycle fails.
KNOWN: set = set()

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
SKIP = {"target", ".git", "node_modules"}


def library_crates(root):
    for lib in sorted(root.rglob("src/lib.rs")):
        if any(part in SKIP for part in lib.relative_to(root).parts):
            continue
        yield lib.parent


def module_of(src, path):
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip(text):
    """Code without comments, strings and the unit tests."""
    m = re.search(r"#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text)
    if m:
        text = text[: m.start()]
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r(#*)".*?"\1', '""', text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text, flags=re.S)
    return text


def expand_use(tree):
    """The paths of one `use` tree (`a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e)."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)

    def go(prefix, t):
        i = t.find("{")
        if i < 0:
            for alt in t.split(","):
                if alt:
                    yield prefix + alt
            return
        head, body = t[:i], t[i + 1 : t.rfind("}")]
        depth, start, items = 0, 0, []
        for j, ch in enumerate(body):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(body[start:j])
                start = j + 1
        items.append(body[start:])
        for item in items:
            if item:
                yield from go(prefix + head, item)

    yield from go("", tree)


PATH = re.compile(r"(?<![\w:])(\$crate|crate|super|self)((?:::\w+)+)")
USE = re.compile(r"\buse\s+([^;]+);")


def references(code):
    paths = []
    for m in USE.finditer(code):
        paths.extend(p.replace(" ", "") for p in expand_use(m.group(1)))
    rest = USE.sub("", code)
    paths.extend(m.group(1) + m.group(2) for m in PATH.finditer(rest))
    return paths


def resolve(path, here, modules):
    """The module a path names (the deepest module it goes into), or None."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] in ("crate", "$crate"):
        base, segs = (), segs[1:]
    elif segs[0] == "self":
        base, segs = here, segs[1:]
    elif segs[0] == "super":
        base = here
        while segs and segs[0] == "super":
            base, segs = base[:-1], segs[1:]
    else:
        return None
    cur = base
    for s in segs:
        if cur + (s,) in modules:
            cur = cur + (s,)
        else:
            break
    return cur


def edge(a, b):
    """The sibling edge of module `a` naming module `b`, if any."""
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    if n == len(a) or n == len(b):
        return None  # one contains the other: parent and child
    return (a[: n + 1], b[: n + 1])


def cycles(edges):
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
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
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            connect(v)
    return out


def main():
    failed = False
    for src in library_crates(ROOT):
        files = sorted(src.rglob("*.rs"))
        modules = {module_of(src, f) for f in files}
        edges = {}
        for f in files:
            here = module_of(src, f)
            for p in references(strip(f.read_text())):
                target = resolve(p, here, modules)
                if target is None:
                    continue
                e = edge(here, target)
                if e:
                    edges.setdefault(e, []).append(f"{f.relative_to(ROOT)}: {p}")
        name = src.parent.relative_to(ROOT)
        found = cycles(edges)
        if not found:
            print(f"{name}: no cycles ({len(edges)} module imports)")
            continue
        for comp in found:
            mods = ", ".join("::".join(m) for m in comp)
            if (str(name), tuple("::".join(m) for m in comp)) in KNOWN:
                print(f"{name}: known cycle (to break) between {mods}")
                continue
            failed = True
            print(f"{name}: CYCLE between {mods}")
            for (a, b), why in sorted(edges.items()):
                if a in comp and b in comp:
                    print(f"    {'::'.join(a)} -> {'::'.join(b)}  ({why[0]})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
