#!/usr/bin/env python3
"""Tables from flashattn and peers.py JSON files (the same schema).

    report.py --table FILE.json [FILE.json ...]            markdown table, one row per run
    report.py --table --baseline torch-flash FILE.json ... ratios against one kernel only

Runs are grouped by problem (shape, dtype, layout, flags) and mode. Each row gives the median time,
TFLOP/s, the check verdict and, for every PyTorch backend measured on the same problem, the ratio
`backend time / kernel time` (> 1: the kernel is faster).
"""

import argparse
import json
import sys


def load_runs(paths):
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"report.py: {path}: {e}", file=sys.stderr)
            raise SystemExit(2)
        for r in doc.get("runs", []):
            r = dict(r)
            r["_source"] = path
            r["_device"] = (doc.get("device") or {}).get("name", "")
            runs.append(r)
    return runs


def problem_key(r):
    s, f = r.get("shape", {}), r.get("flags", {})
    tag = f"B{s.get('B')} H{s.get('H')}"
    if s.get("H_kv") != s.get("H"):
        tag += f"/{s.get('H_kv')}"
    tag += f" S{s.get('S_q')}" + ("" if s.get("S_q") == s.get("S_k") else f"x{s.get('S_k')}") + f" D{s.get('D')}"
    tag += f" {r.get('dtype')}"
    if f.get("causal"):
        tag += " causal"
    if f.get("window_left", -1) >= 0 or f.get("window_right", -1) >= 0:
        tag += f" win({f.get('window_left')},{f.get('window_right')})"
    if f.get("seqlens_k"):
        tag += " pad"
    if f.get("mask"):
        tag += " mask"
    if r.get("layout") == "bshd":
        tag += " bshd"
    return tag


def check_text(r):
    c = r.get("check")
    if not c or not c.get("performed"):
        return "-"
    outs = c.get("outputs", {})
    worst = max((o.get("measured", o.get("rel_l2", 0)) or 0 for o in outs.values()), default=0)
    verdict = {True: "ok", False: "FAIL"}.get(c.get("passed"), "")
    return f"{worst:.1e} {verdict}".strip()


def table(runs, baseline=None):
    groups = {}
    for r in runs:
        groups.setdefault((problem_key(r), r.get("mode")), []).append(r)
    peers = sorted({r["kernel"] for r in runs if r["kernel"].startswith("torch-")})
    if baseline:
        peers = [baseline]
    head = ["problem", "mode", "kernel", "median ms", "TFLOP/s", "check"] + [f"vs {p}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (prob, mode), rs in groups.items():
        times = {r["kernel"]: r["timing"]["median_ms"] for r in rs if r.get("status") == "ok"}
        for r in rs:
            if r.get("status") != "ok":
                cells = [prob, mode, r["kernel"], "-", "-", r.get("status", "")] + ["-"] * len(peers)
            else:
                t = r["timing"]["median_ms"]
                cells = [prob, mode, r["kernel"], f"{t:.4f}", f"{r['throughput']['tflops']:.2f}", check_text(r)]
                cells += [f"{times[p] / t:.2f}x" if p in times and t > 0 else "-" for p in peers]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--table", action="store_true", help="print a markdown table (the default)")
    ap.add_argument("--baseline", default=None, help="ratio column against this kernel only")
    args = ap.parse_args(argv)
    runs = load_runs(args.files)
    devices = sorted({r["_device"] for r in runs if r["_device"]})
    if devices:
        print("device: " + ", ".join(devices))
    print(table(runs, args.baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
