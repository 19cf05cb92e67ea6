#!/usr/bin/env python3
"""Rings side by side: flashattn's (--devices) against PyTorch's context parallelism (peers_ring.py).

    report_ring.py OURS.jsonl PEERS.jsonl [--kernel hopper]

One row per (shape, mask) and mode, plus `both` (forward + backward medians added, each side):
median ms of both rings, ratio = PyTorch's median / ours (> 1: ours faster, the same statistic on
both sides), per-GPU TFLOP/s, and each side's scaling efficiency twice: T(one GPU) / (N * T(ring))
on its first GPU's one-GPU run, and against the combined rate of every rank's card alone
(`scaling_efficiency_cards`: the same for cards alike, and not tied to which card is listed
first; "–" where a record lacks the per-rank times, --ring-baseline first or an older record);
then our mean SM clock on the ring and on one GPU where the records have both (two loaded GPUs may
each run slower than one alone), which of our GPUs ended its blocks last in the profiled
repetition and by how much after the first (a ring waits for its slowest GPU: the shards' work is
level, the cards are not quite), and each of our ranks' card alone (ms), which tells a slower
card from a slower ring. The ratio and the efficiencies have three decimals, so that one at a
target's edge (1.05, 0.95) reads as it is. Rows of ours that did not pass --check are left out.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ring_model import cards_efficiency  # noqa: E402


def parse_docs(text):
    """The documents of a --json file: JSON lines or one JSON document (a sweep's --json)."""
    try:
        return [json.loads(text)]
    except ValueError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def rows_of(docs, kernel=None):
    """{(B, H, H_kv, S, D, causal): {mode: run}} of the ring runs in `docs`, of `kernel` only if
    given, those that failed --check left out; and how many were left out so."""
    rows, failed = {}, 0
    for d in docs:
        for r in d.get("runs", []):
            if r.get("status") != "ok" or not r.get("ring") or (kernel and r["kernel"] != kernel):
                continue
            if r.get("check") is not None and not (r["check"] or {}).get("passed", True):
                failed += 1
                continue
            s = r["shape"]
            key = (s["B"], s["H"], s["H_kv"], s["S_q"], s["D"], bool(r["flags"].get("causal")))
            rows.setdefault(key, {})[r["mode"]] = r
    return rows, failed


def load(path, kernel=None):
    """rows_of the file at `path`: JSON lines or one JSON document (a sweep's --json)."""
    with open(path) as f:
        return rows_of(parse_docs(f.read()), kernel)[0]


def card_ms(runs, mode):
    """Each rank's card alone (ms) for `mode` (both: forward + backward per card), or None."""
    if mode == "both":
        parts = [card_ms(runs, m) for m in ("forward", "backward")]
        return [f + b for f, b in zip(*parts)] if all(parts) else None
    per_rank = ((runs.get(mode) or {}).get("ring") or {}).get("one_gpu_per_rank") or []
    times = [c.get("median_ms") for c in per_rank]
    return times if times and all(times) else None


def summary(runs, mode):
    """(median ms, per-GPU TFLOP/s, scaling efficiency on the first GPU, against the cards) of one
    mode, or of both added."""
    if mode == "both":
        if "forward" not in runs or "backward" not in runs:
            return None
        parts = [summary(runs, m) for m in ("forward", "backward")]
        f = [runs[m]["throughput"]["flops"] for m in ("forward", "backward")]
        one = [runs[m]["ring"].get("one_gpu_median_ms") for m in ("forward", "backward")]
        ms = parts[0][0] + parts[1][0]
        n = runs["forward"]["ring"]["size"]
        eff = sum(one) / (n * ms) if all(one) else None
        return ms, sum(f) / n / (ms * 1e-3) / 1e12, eff, cards_efficiency(card_ms(runs, mode), ms)
    if mode not in runs:
        return None
    r = runs[mode]
    n = r["ring"]["size"]
    ms = r["timing"]["median_ms"]
    return ms, r["throughput"]["flops"] / n / (ms * 1e-3) / 1e12, r["ring"].get("scaling_efficiency"), \
        cards_efficiency(card_ms(runs, mode), ms)


def clocks(runs, mode):
    """'ring / one GPU' mean SM clock (MHz) of our run of `mode`, or '–'."""
    r = runs.get(mode)
    ring = r and r["timing"].get("sm_clock_mean_mhz")
    one = r and r["ring"].get("one_gpu_sm_clock_mean_mhz")
    return f"{ring:.0f} / {one:.0f}" if ring and one else "–"


def last_gpu(runs, mode):
    """'GPU i +x.x %': our GPU whose blocks ended last in the profiled repetition, and how far after
    the first to end; '–' without the per-GPU record."""
    r = runs.get(mode)
    ends = [(g.get("blocks_ms"), g.get("device")) for g in ((r or {}).get("ring") or {}).get("per_gpu", [])]
    ends = [e for e in ends if e[0]]
    if len(ends) < 2:
        return "–"
    last, first = max(ends), min(ends)
    return f"GPU {last[1]} +{100 * (last[0] / first[0] - 1):.1f} %"


def table(ours, peers):
    head = ("| shape | mode | ours ms | PyTorch ms | × | ours TFLOP/s per GPU | PyTorch TFLOP/s per GPU | "
            "ours efficiency | PyTorch efficiency | ours efficiency, cards | PyTorch efficiency, cards | "
            "ours MHz ring / one GPU | ours last GPU | ours one GPU by rank's card, ms |")
    out = [head, "|---" * 14 + "|"]
    fmt = lambda x, p: "–" if x is None else f"{x:.{p}f}"  # noqa: E731
    for key in sorted(ours):
        if key not in peers:
            continue
        B, H, Hkv, S, D, causal = key
        shape = f"B{B} H{H}{'/' + str(Hkv) if Hkv != H else ''} S{S} D{D}{' causal' if causal else ''}"
        for mode in ("forward", "backward", "both"):
            a, b = summary(ours[key], mode), summary(peers[key], mode)
            if not a or not b:
                continue
            cards = card_ms(ours[key], mode)
            out.append(f"| {shape} | {mode} | {a[0]:.3f} | {b[0]:.3f} | {b[0] / a[0]:.3f}× | {a[1]:.0f} | {b[1]:.0f} | "
                       f"{fmt(a[2], 3)} | {fmt(b[2], 3)} | {fmt(a[3], 3)} | {fmt(b[3], 3)} | "
                       f"{clocks(ours[key], mode)} | {last_gpu(ours[key], mode)} | "
                       f"{' / '.join(f'{t:.2f}' for t in cards) if cards else '–'} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ours")
    ap.add_argument("peers")
    ap.add_argument("--kernel", help="only this kernel of ours (default: every ring run)")
    a = ap.parse_args(argv)
    ours, peers = load(a.ours, a.kernel), load(a.peers)
    if not ours or not peers:
        sys.exit("report_ring.py: no ring run in " + (a.ours if not ours else a.peers))
    print(table(ours, peers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
