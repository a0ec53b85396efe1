#!/usr/bin/env python3
"""scripts/check-layers.py: the layer rules of docs/architecture.md, checked
(ctest check_layers).

  scripts/check-layers.py ROOT OBJECT...

1. Includes. src/server and src/cli include only the public headers
   (idem/*.h) and their own directory's; include/idem only itself; src/util
   only util/ and idem/; src/store never core/, pay/, server/ or cli/;
   src/core never pay/, server/ or cli/ (store/backend.h is the vtable it
   drives); src/pay never store/, server/ or cli/.
2. Calls go down. From the library's object files (nm: what each defines and
   what it needs): a file of one layer (util < store < core < pay) never
   needs a symbol defined in a higher layer, and no two files need each
   other, directly or round a longer loop. A loop is printed with the
   symbols on each of its edges, so it can be cut where it is thinnest.

Exit 0 when every rule holds, 1 otherwise (2 on bad usage).
"""
import collections
import os
import re
import subprocess
import sys

LAYERS = {"util": 0, "store": 1, "core": 2, "pay": 3}

# directory -> (allowed include prefixes, or None for "anything but denied"; denied prefixes)
INCLUDE_RULES = {
    "src/server": (("idem/", "server/"), ()),
    "src/cli": (("idem/", "cli/"), ()),
    "include/idem": (("idem/",), ()),
    "src/util": (("util/", "idem/"), ()),
    "src/store": (None, ("core/", "pay/", "server/", "cli/")),
    "src/core": (None, ("pay/", "server/", "cli/")),
    "src/pay": (None, ("store/", "server/", "cli/")),
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def check_includes(root):
    bad = []
    for d, (allowed, denied) in INCLUDE_RULES.items():
        top = os.path.join(root, d)
        if not os.path.isdir(top):
            continue
        for name in sorted(os.listdir(top)):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(top, name)
            with open(path, errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    # A bare name is a sibling in the same directory.
                    if "/" not in inc:
                        continue
                    if allowed is not None and not inc.startswith(allowed):
                        bad.append(f"{d}/{name}:{n}: includes \"{inc}\" "
                                   f"(only {', '.join(allowed)} here)")
                    elif inc.startswith(denied):
                        bad.append(f"{d}/{name}:{n}: includes \"{inc}\" (a layer above "
                                   f"or beside {d})")
    return bad


def source_of(obj):
    """src/<layer>/<file>.c for an object path, or None."""
    m = re.search(r"(src/[a-z]+/[A-Za-z0-9_]+\.c)\.o$", obj.replace(os.sep, "/"))
    return m.group(1) if m else None


def symbols(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, needed = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRCWV":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            needed.add(parts[1])
    return defined, needed


def check_calls(objects):
    where, needs = {}, {}
    for obj in objects:
        src = source_of(obj)
        if not src:
            continue
        defined, needed = symbols(obj)
        for s in defined:
            where[s] = src
        needs[src] = needed
    edges = collections.defaultdict(lambda: collections.defaultdict(set))
    for src, needed in needs.items():
        for s in needed:
            dst = where.get(s)
            if dst and dst != src:
                edges[src][dst].add(s)
    bad = []
    for src in sorted(edges):
        ls = LAYERS.get(src.split("/")[1], 99)
        for dst in sorted(edges[src]):
            ld = LAYERS.get(dst.split("/")[1], 99)
            if ld > ls:
                bad.append(f"{src} calls up into {dst}: {' '.join(sorted(edges[src][dst]))}")
    # Loops: strongly connected components of more than one file (Tarjan).
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(needs):
        if v not in index:
            visit(v)
    for comp in comps:
        bad.append("a loop between files: " + ", ".join(comp))
        members = set(comp)
        for src in comp:
            for dst in sorted(set(edges[src]) & members):
                bad.append(f"    {src} -> {dst}: {' '.join(sorted(edges[src][dst]))}")
    return bad, len(needs)


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    root, objects = sys.argv[1], sys.argv[2:]
    bad = check_includes(root)
    call_bad, nfiles = check_calls(objects)
    bad += call_bad
    for line in bad:
        print("check-layers: " + line)
    if bad:
        return 1
    print(f"check-layers: ok ({nfiles} files of libidem, no call up a layer, no loop)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
