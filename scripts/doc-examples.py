#!/usr/bin/env python3
"""Lists public items of the documented API whose doc comment has no code example.

The documented API is every `pub` item outside the modules that lib.rs and cuda/mod.rs mark
`#[doc(hidden)]` (ring/, shm/, format/, cuda/driver, cuda/ipc, cuda/vmm, testing/) and the private
modules, less the memory kinds' sides: `pub` only so that the sealed `Memory` trait can name
them, in private modules nobody outside the crate can reach. An item counts
as covered when its own doc comment holds a ``` block. Fields and enum variants are not items
here; a trait impl's methods are documented by the trait. Exit status 1 if any item lacks one.

    scripts/doc-examples.py [--list]
"""
import pathlib, re, sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "src"
# Hidden modules, and private ones (their `pub` items are crate-internal).
HIDDEN = ("ring/", "shm/", "format/", "cuda/driver.rs", "cuda/ipc.rs", "cuda/vmm.rs", "testing/", "bin/",
          "doorbells.rs")
# `pub` in private modules, for the sealed trait's associated types: not nameable outside.
UNNAMEABLE = {("memory/host.rs", "HostTx"), ("memory/host.rs", "HostRx"),
              ("memory/cuda/tx/mod.rs", "CudaTx"), ("memory/cuda/rx/mod.rs", "CudaRx"),
              ("memory/mod.rs", "Sealed"), ("batch/memory.rs", "Sealed"), ("batch/memory.rs", "Gate"),
              ("batch/memory.rs", "Event"), ("batch/memory.rs", "Lane")}
ITEM = re.compile(r"^\s*pub (?:async )?(?:unsafe )?(fn|struct|enum|const|trait|type|static) (\w+)")

missing = []
for path in sorted(ROOT.rglob("*.rs")):
    rel = path.relative_to(ROOT).as_posix()
    if rel.startswith(HIDDEN):
        continue
    lines = path.read_text().splitlines()
    in_tests = False
    for i, line in enumerate(lines):
        if re.match(r"^\s*mod tests\s*\{", line):
            in_tests = True
        m = ITEM.match(line)
        if not m or in_tests or (rel, m.group(2)) in UNNAMEABLE:
            continue
        # Walk up over attributes to the doc comment.
        j, doc, attrs = i - 1, [], []
        while j >= 0 and (lines[j].strip().startswith("#[") or lines[j].strip().startswith("///")):
            (doc if lines[j].strip().startswith("///") else attrs).append(lines[j])
            j -= 1
        if any("cfg(doctest)" in a for a in attrs):
            continue
        if not any("```" in d for d in doc):
            missing.append(f"{rel}:{i + 1}: {m.group(1)} {m.group(2)}")

for m in missing:
    print(m)
print(f"{len(missing)} public items without an example", file=sys.stderr)
sys.exit(1 if missing else 0)
