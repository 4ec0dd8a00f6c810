#!/usr/bin/env python3
"""The direction of dependency between gpuring's top-level modules (src/*), from the code.

Prints which module uses which (`crate::NAME` in code; comments and re-exports, `pub use`, left
out: a re-export keeps a public path, it is not a dependency of the code) and exits 1 if any
modules depend on each other in a cycle. docs/protocol.md ("Code layout") gives the order. Names
taken from the crate root (`use crate::{Producer, ...}`) are the API's: only the modules above
it (`any`, `bridge`) do that.

    python3 scripts/layers.py [SRC]
"""
import os
import re
import sys


def modules(root):
    deps = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            if not f.endswith(".rs") or rel.startswith("bin/") or rel == "lib.rs":
                continue
            top = rel.split("/")[0].removesuffix(".rs")
            uses = deps.setdefault(top, set())
            statement = ""
            for line in open(os.path.join(dirpath, f)):
                code = line.split("//")[0]
                statement = statement + code if statement else code
                if statement.lstrip().startswith("pub use") and ";" not in statement:
                    continue  # a re-export spread over lines: skip it whole
                if not statement.lstrip().startswith("pub use"):
                    uses.update(re.findall(r"crate::([a-z_]+)", statement))
                statement = ""
            uses.discard(top)
    return {m: {u for u in us if u in deps} for m, us in deps.items()}


def cycles(deps):
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in deps[v]:
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
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(deps):
        if v not in index:
            visit(v)
    return found


def main():
    deps = modules(sys.argv[1] if len(sys.argv) > 1 else "src")
    for m in sorted(deps):
        print(f"{m:10} uses {', '.join(sorted(deps[m])) or 'nothing of the crate'}")
    found = cycles(deps)
    if found:
        print("cycles:", "; ".join(" <-> ".join(c) for c in found))
        return 1
    print("no cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
