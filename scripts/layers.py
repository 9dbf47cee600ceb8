#!/usr/bin/env python3
"""The library's layering, measured from its sources and objects.

usage: scripts/layers.py [BUILD] [--check] [--verbose]

Two kinds of arrows between files are taken:
  - includes: every #include "..." of a .c or .h file, resolved as the
    compiler does (-I. and -Iinclude);
  - calls: for each object BUILD/obj/FOLDER/FILE.o, the global symbols it
    leaves undefined (nm) that another library object defines. That is every
    cross-file function call and data reference, exactly, the inline
    functions of headers included (they land in the object that uses them).

Against the order declared below it reports: the arrows that point up
(between folders; and, inside loader/, between its .c files), the library
files outside loader/ that include a loader/ header other than its port
(PORT: the engine as the folders above it see it), the circles
(strongly connected components) of the file graph, across folders and inside
any one, the library files over their size (MAX_FILE lines, MAX_FILE_LOADER
in loader/) and the functions over MAX_FUNC lines (from a function's first
line to its closing brace). With --check it exits 1 when the layering does
not hold: an arrow up, an include of loader/ past its port, any circle, a
library file over its size, a loader/ or canary/ function over MAX_FUNC
lines, or a file the order does not place.
Needs only python3 and binutils' nm.
"""
import os
import re
import subprocess
import sys

# Folders, lowest first: a folder may use those before it, never one after.
# include/ is the public header (hotkern/*.h), base/ the ground floor (the
# driver binding, the error table's names and messages, the sized-structure
# rule, the format names and the version, the exit guard).
FOLDERS = ["include", "util", "base", "ptx", "canary", "loader", "watch", "net", "interpose", "cli"]

# loader/'s .c files, lowest first; files of one entry are one layer (they
# may not call each other at all, since either direction would be a circle).
# Its headers (core.h, one per part, expo.h, ...) declare what crosses files
# and are not ordered.
LOADER_ORDER = [
    ["record.c", "expo.c", "job.c"],  # the record's text, the metrics writer, jobs
    ["log.c"],  # logs and events (hkl_emit)
    ["source.c"],  # the sources' hooks
    ["context.c"],  # swap_lock's owner, capture mode, context push, driver errors
    ["gate.c"],  # the launch gate, the epoch slots, the fences
    ["version.c"],  # version operations: load, upload, resolve, unload, retire
    ["reset.c"],  # recovery from a context reset
    ["lkgdisk.c"],  # last known good on disk: files, writers, collection
    ["lkg.c"],  # last known good: records, quarantine, sticky errors
    ["metrics.c"],  # hk_stats_get, swap counters, the metrics text
    ["launch.c", "graph.c"],  # launches and pins; graphs
    ["expect_tu.c"],  # which file a program's kernel or variable belongs to
    ["expect_global.c"],  # the program's globals and the host's symbol copies
    ["expect.c"],  # the program's kernels and globals
    ["fit.c"],  # whether a version takes the program's launch configurations
    ["canary.c"],  # the canary step between build and stage
    ["swap.c"],  # the transaction: stage, validate, commit, roll back; rollback
    ["reclaim.c"],  # the reclaim thread
    ["worker.c"],  # hk_swap, hk_submit, the build step, the worker, safe points
    ["restore.c"],  # restoring the known-good images
    ["runtime.c"],  # the runtime: create and destroy, wiring the floors below
]

# The one loader/ header a library file outside loader/ may include: the
# runtime's layout and the parts' functions stay loader/'s own.
PORT = "loader/port.h"

# A file a newcomer can read: about 1,000 lines in every library folder, 800 in
# loader/ (the engine's floors stay small).
MAX_FILE = 1000
MAX_FILE_LOADER = 800
MAX_FUNC = 100

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB_FOLDERS = [f for f in FOLDERS if f != "include"]


def folder_of(path):
    top = path.split("/", 1)[0]
    return top if top in FOLDERS else None


def sources():
    out = []
    for f in FOLDERS:
        d = os.path.join(ROOT, f)
        if f == "include":
            d = os.path.join(ROOT, "include", "hotkern")
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if name.endswith((".c", ".h")):
                out.append(os.path.relpath(os.path.join(d, name), ROOT))
    return out


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def includes(files):
    edges = set()
    for f in files:
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            for cand in (os.path.join(os.path.dirname(f), inc), inc, os.path.join("include", inc)):
                cand = os.path.normpath(cand)
                if os.path.isfile(os.path.join(ROOT, cand)):
                    if cand != f:
                        edges.add((f, cand))
                    break
    return edges


def calls(build):
    defined, undefined = {}, {}
    objs = []
    for f in LIB_FOLDERS:
        d = os.path.join(ROOT, build, "obj", f)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            src = os.path.join(f, name[:-2] + ".c")
            # An object whose source is gone (moved or removed) is stale.
            if name.endswith(".o") and os.path.isfile(os.path.join(ROOT, src)):
                objs.append(src)
    if not objs:
        sys.exit("layers: no objects under %s/obj: run make first" % build)
    # One nm for all the objects (-A: each line starts with its object's
    # name), not one process an object.
    path = {os.path.join(ROOT, build, "obj", src[:-2] + ".o"): src for src in objs}
    out = subprocess.run(["nm", "-P", "-A"] + list(path), capture_output=True, text=True,
                         check=True).stdout
    for src in objs:
        undefined[src] = set()
    for line in out.splitlines():
        obj, _, rest = line.partition(": ")
        if obj not in path:
            sys.exit("layers: nm printed a line of no object given: " + line)
        src = path[obj]
        parts = rest.split()
        if len(parts) < 2:
            continue
        sym, kind = parts[0], parts[1]
        if kind in "Uw":
            undefined[src].add(sym)
        elif kind.isupper() and sym != "main":
            defined.setdefault(sym, set()).add(src)
    edges = {}
    for src, syms in undefined.items():
        for s in syms:
            for d in defined.get(s, ()):
                if d != src:
                    edges.setdefault((src, d), set()).add(s)
    return edges


def sccs(nodes, edges):
    """Tarjan's algorithm, iterative; returns components of more than one node."""
    succ = {n: set() for n in nodes}
    for a, b in edges:
        if a in succ and b in succ:
            succ[a].add(b)
    index, low, onstack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        onstack.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    onstack.add(nxt)
                    work.append((nxt, iter(sorted(succ[nxt]))))
                elif nxt in onstack:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    onstack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


FUNC_START = re.compile(r"^[A-Za-z_][^;=]*\(")


def functions(path):
    """(name, first line, length) of each function definition: clang-format
    puts a definition's first line and its closing brace in column 0."""
    with open(os.path.join(ROOT, path), errors="replace") as fh:
        lines = fh.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        # A definition may return a struct or an enum (struct conn *f(...)),
        # but a line that opens a type's braces is no function.
        if FUNC_START.match(line) and not line.startswith("typedef") and \
                not re.match(r"(struct|enum|union)\s+\w*\s*\{", line):
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith(("{", ";")) and j - i < 10:
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{") and "=" not in lines[j]:
                k = j + 1
                while k < len(lines) and lines[k].rstrip() != "}":
                    k += 1
                m = re.search(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(", line)
                out.append((m.group(1) if m else "?", i + 1, k - i + 1))
                i = k + 1
                continue
        i += 1
    return out


def max_lines(path):
    return MAX_FILE_LOADER if path.startswith("loader/") else MAX_FILE


def loader_rank(path):
    name = os.path.basename(path)
    for r, group in enumerate(LOADER_ORDER):
        if name in group:
            return r
    return None


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    check = "--check" in sys.argv
    verbose = "--verbose" in sys.argv
    # With --check, the report is printed only when the layering does not hold.
    report = []

    def say(line):
        report.append(line)
    build = args[0] if args else "build"
    files = sources()
    inc = includes(files)
    cal = calls(build)
    problems = []
    rank = {f: i for i, f in enumerate(FOLDERS)}

    # Folder graph.
    fedges = {}
    for (a, b), kind in [(e, "include") for e in inc] + [(e, "call") for e in cal]:
        fa, fb = folder_of(a), folder_of(b)
        if fa and fb and fa != fb:
            fedges.setdefault((fa, fb), {"include": 0, "call": 0})[kind] += 1
    say("== folders (lowest first): " + " < ".join(FOLDERS))
    for (fa, fb), n in sorted(fedges.items(), key=lambda x: (rank[x[0][0]], rank[x[0][1]])):
        up = rank[fa] < rank[fb]
        say("  %-9s -> %-9s includes %3d  calls %3d%s" % (fa, fb, n["include"], n["call"], "  UP" if up else ""))
    up_edges = []
    for (a, b) in sorted(inc):
        fa, fb = folder_of(a), folder_of(b)
        if fa and fb and rank[fa] < rank[fb]:
            up_edges.append("include %s -> %s" % (a, b))
    for (a, b), syms in sorted(cal.items()):
        fa, fb = folder_of(a), folder_of(b)
        if fa and fb and rank[fa] < rank[fb]:
            up_edges.append("call %s -> %s (%s)" % (a, b, ", ".join(sorted(syms))))

    # Inside loader/: calls between its .c files.
    unranked = sorted({f for f in files if f.startswith("loader/") and f.endswith(".c") and loader_rank(f) is None})
    for f in unranked:
        problems.append("loader file not in LOADER_ORDER: " + f)
    lup = 0
    for (a, b), syms in sorted(cal.items()):
        if a.startswith("loader/") and b.startswith("loader/"):
            ra, rb = loader_rank(a), loader_rank(b)
            if ra is not None and rb is not None and ra < rb:
                up_edges.append("call %s -> %s (%s)" % (a, b, ", ".join(sorted(syms))))
                lup += 1
    say("== arrows up: %d (%d between folders, %d inside loader/)" % (len(up_edges), len(up_edges) - lup, lup))
    for e in up_edges:
        say("  " + e)
    problems += ["arrow up: " + e for e in up_edges]

    # Past the port: a file outside loader/ that includes any other loader/ header.
    past = sorted("%s -> %s" % (a, b) for a, b in inc
                  if folder_of(a) != "loader" and folder_of(b) == "loader" and b != PORT)
    say("== includes of loader/ past %s: %d" % (PORT, len(past)))
    for e in past:
        say("  " + e)
    problems += ["include past %s (use it, or add what is needed to it): %s" % (PORT, e)
                 for e in past]

    # Circles of the file graph: calls, and includes (which, ending at
    # headers, close a circle only between headers).
    nodes = set(files) | {a for a, _ in cal} | {b for _, b in cal}
    graph = set(cal) | set(inc)
    comps = sccs(nodes, graph)
    cross = [c for c in comps if len({folder_of(f) for f in c}) > 1]
    inloader = [c for c in comps if all(f.startswith("loader/") for f in c)]
    # And of the folder graph: two folders that use each other, through
    # whichever files, are one circle even when no file circle crosses them.
    cross += sccs(set(FOLDERS), set(fedges))
    inside = [c for c in comps if c not in cross]
    say("== circles: %d across folders, %d inside a folder (%d inside loader/), %d in all" %
        (len(cross), len(inside), len(inloader), len(cross) + len(inside)))
    for c in cross:
        say("  (%d, across folders) %s" % (len(c), " ".join(c)))
    for c in inside:
        say("  (%d files) %s" % (len(c), " ".join(c)))
    problems += ["circle across folders: " + " ".join(c) for c in cross]
    problems += ["circle inside %s/: %s" % (folder_of(c[0]), " ".join(c)) for c in inside]

    # Sizes.
    big_files, big_funcs = [], []
    for f in files:
        if folder_of(f) == "include":
            continue
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            n = fh.read().count("\n")
        if n > max_lines(f):
            big_files.append((f, n))
        if f.endswith(".c"):
            for name, line, length in functions(f):
                if length > MAX_FUNC:
                    big_funcs.append((f, name, line, length))
    say("== files over about %d lines (%d in loader/): %d" % (MAX_FILE, MAX_FILE_LOADER,
                                                              len(big_files)))
    for f, n in big_files:
        say("  %5d %s" % (n, f))
    lc = [x for x in big_funcs if x[0].startswith(("loader/", "canary/"))]
    say("== functions over %d lines: %d (%d in loader/ and canary/)" % (MAX_FUNC, len(big_funcs), len(lc)))
    for f, name, line, length in big_funcs:
        if verbose or f.startswith(("loader/", "canary/")):
            say("  %5d %s:%d %s" % (length, f, line, name))
    problems += ["file over %d lines: %s (%d): split it along its sections, by concern "
                 "(a file a newcomer can read is about %d lines; %d in loader/)" %
                 (max_lines(f), f, n, MAX_FILE, MAX_FILE_LOADER) for f, n in big_files]
    problems += ["function over %d lines: %s:%d %s (%d)" % (MAX_FUNC, f, line, name, length)
                 for f, name, line, length in lc]

    say("== %s" % ("layering holds" if not problems else "%d problems" % len(problems)))
    if not check or problems or verbose:
        print("\n".join(report))
    if check and problems:
        for p in problems:
            print("layers: " + p, file=sys.stderr)
        return 1
    if check:
        print("layers: the layering holds (%s)" % " < ".join(FOLDERS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
