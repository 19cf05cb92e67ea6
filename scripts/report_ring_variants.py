#!/usr/bin/env python3
"""A ring under several settings of its switches, side by side (scripts/ring_variants.sh).

    report_ring_variants.py NAME=FILE [NAME=FILE ...] [--kernel hopper]

Each FILE is one run's --json (JSON lines or one document) under the setting NAME; a NAME given
several times pools its files (its rounds, in the order given). One row per (shape, mask), mode
and NAME, in the order the names first appear: each round's median ms and scaling efficiency (on
the first GPU's one-GPU time; in parentheses against the cards' combined rate, where recorded),
the median of the rounds' medians and its ratio against the first NAME's (> 1: faster than the
first, the same statistic on both sides), and from the last round's profiled repetition when each
GPU's blocks ended, the tail after the last of them (its passes: what no block hides) and what
was lent (under FLASHATTN_RING_LEND=auto, with the lag it measured). Runs that failed --check are left out and counted under the table.
"""
import argparse
import statistics
import sys

import report_ring


def load_variants(pairs, kernel=None):
    """[(name, [{key: {mode: run}} per file])] in first-seen order, and how many ring runs failed
    their check."""
    order, files, failed = [], {}, 0
    for name, path in pairs:
        if name not in files:
            order.append(name)
            files[name] = []
        with open(path) as f:
            rows, left_out = report_ring.rows_of(report_ring.parse_docs(f.read()), kernel)
        files[name].append(rows)
        failed += left_out
    return [(n, files[n]) for n in order], failed


def profile(run):
    """'76.01 / 76.48', the tail in ms and the lending, from one run's ring."""
    g = run["ring"]
    ends = [p.get("blocks_ms") for p in g.get("per_gpu", [])]
    ends_text = " / ".join(f"{e:.2f}" for e in ends if e is not None) or "–"
    tail = g["profiled_ms"] - max(ends) if ends and None not in ends and g.get("profiled_ms") else None
    lend = g.get("lend")
    auto = ""
    if lend is not None and lend.get("auto"):  # with the gap it measured before the timed loop
        auto = f" (auto, lag {lend['lag_ms']:.2f} ms)" if lend.get("lag_ms") is not None else " (auto)"
    if lend is None:
        lent = "–"
    elif lend.get("rank") is None:
        lent = "none" + auto
    else:
        lent = f"rank {lend['rank']}: {lend['kv_heads']:g} kv heads" + auto
    return ends_text, tail, lent


def efficiency(ring):
    """'0.947', or '0.947 (0.953)' with the efficiency against the ring's cards."""
    first, cards = ring.get("scaling_efficiency"), ring.get("scaling_efficiency_cards")
    text = "–" if first is None else f"{first:.3f}"
    return text if cards is None else f"{text} ({cards:.3f})"


def table(variants):
    keys = []
    for _, rounds in variants:
        for rows in rounds:
            keys += [k for k in rows if k not in keys]
    out = ["| shape | mode | setting | median ms by round | efficiency by round | median | × first | "
           "blocks end by GPU (last round) | tail ms | lent |", "|---" * 10 + "|"]
    for key in sorted(keys):
        B, H, Hkv, S, D, causal = key
        shape = f"B{B} H{H}{'/' + str(Hkv) if Hkv != H else ''} S{S} D{D}{' causal' if causal else ''}"
        for mode in ("forward", "backward"):
            first = None
            for name, rounds in variants:
                runs = [rows[key][mode] for rows in rounds if mode in rows.get(key, {})]
                if not runs:
                    continue
                ms = [r["timing"]["median_ms"] for r in runs]
                eff = [efficiency(r["ring"]) for r in runs]
                med = statistics.median(ms)
                first = med if first is None else first
                ends, tail, lent = profile(runs[-1])
                out.append(f"| {shape} | {mode} | {name} | {', '.join(f'{x:.3f}' for x in ms)} | "
                           f"{', '.join(eff)} | {med:.3f} | "
                           f"{first / med:.3f}× | {ends} | {'–' if tail is None else f'{tail:.3f}'} | {lent} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="NAME=FILE")
    ap.add_argument("--kernel", help="only this kernel's rings (default: every ring run)")
    a = ap.parse_args(argv)
    pairs = []
    for item in a.runs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            sys.exit(f"report_ring_variants.py: '{item}' is not NAME=FILE")
        pairs.append((name, path))
    variants, failed = load_variants(pairs, a.kernel)
    if not any(rows for _, rounds in variants for rows in rounds):
        sys.exit("report_ring_variants.py: no ring run passed its check in the files given")
    print(table(variants))
    if failed:
        print(f"\n{failed} ring run(s) failed --check and are left out.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
