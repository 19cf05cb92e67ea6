#!/usr/bin/env python3
"""A build without NCCL must still link: src/ring.cpp then compiles its stand-ins for the Ring
methods (the #ifndef FLASHATTN_HAVE_NCCL half), and a method missing there fails only that build.
This compiles src/ring.cpp once more without FLASHATTN_HAVE_NCCL, with the command the build used
(compile_commands.json), and compares the Ring methods it defines with those the NCCL build's
objects define (src/ring.cpp and src/ring_steps.cpp; Ring::Impl's own excluded).

    scripts/ring_stubs.py BUILD_DIR

Exit 0: every method has its stand-in; 1: some are missing (listed); 77: the build has no NCCL,
so it links the stand-ins itself and there is nothing to compare.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile


def ring_methods(objects):
    out = subprocess.run(["nm", "-C", "--defined-only", *objects], check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        m = re.search(r" [TtWw] (flashattn::Ring::.*)$", line)
        if not m or m.group(1).startswith("flashattn::Ring::Impl") or "[clone" in m.group(1):
            continue  # the implementation's own, or a compiler's copy of a method
        if re.search(r"\)( const)?::", m.group(1)):
            continue  # an entity local to a method
        names.add(m.group(1))
    return names


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build = os.path.abspath(sys.argv[1])
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    by_name = {}
    for e in entries:
        if e["file"].endswith(("/src/ring.cpp", "/src/ring_steps.cpp")):
            by_name[os.path.basename(e["file"])] = e
    ring = by_name.get("ring.cpp")
    if ring is None or "-DFLASHATTN_HAVE_NCCL" not in shlex.split(ring["command"]):
        print("this build has no NCCL: it links the stand-ins itself")
        return 77
    objects = []
    for e in by_name.values():
        args = shlex.split(e["command"])
        objects.append(os.path.join(e["directory"], args[args.index("-o") + 1]))
    with tempfile.TemporaryDirectory() as tmp:
        args = [a for a in shlex.split(ring["command"]) if a != "-DFLASHATTN_HAVE_NCCL"]
        stub_obj = os.path.join(tmp, "ring_stubs.o")
        args[args.index("-o") + 1] = stub_obj
        subprocess.run(args, cwd=ring["directory"], check=True)
        stubs = ring_methods([stub_obj])
    missing = sorted(ring_methods(objects) - stubs)
    for name in missing:
        print(f"src/ring.cpp: no stand-in without NCCL for {name}")
    print(f"{len(stubs)} Ring methods have their stand-ins" if not missing else f"{len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
