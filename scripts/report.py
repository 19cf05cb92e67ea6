#!/usr/bin/env python3
"""Tables, CSV and plots from flashattn and peers.py results (the same schema).

    report.py FILE [FILE ...]                        markdown table on stdout (also: --table)
    report.py --baseline torch-flash FILE ...        ratio column against one kernel
    report.py --baseline peers FILE ...              one ratio column per PyTorch backend
    report.py FILES --md OUT.md --summary SUM.md --csv OUT.csv --plots DIR [--readme README.md]

FILEs are session documents (.json, as `flashattn --json` and peers.py write them) or JSON Lines
(.jsonl, one session document per line, as sweeps write them). Runs are grouped by problem
(shape, dtype, layout, flags) and mode; when the same kernel was measured on the same problem
more than once, the last measurement read wins.

The ratio columns are `baseline time / kernel time` (> 1: the kernel is faster). The default
baseline is torch-flash when the inputs contain it, else cublas; cublas, the in-process baseline,
gets a column of its own as well. --summary writes one compact table per (dtype, mode, D, causal)
with TFLOP/s per sequence length; --plots writes PNGs (see report_plots.py); --readme replaces
the part of README.md between `<!-- results:begin -->` and `<!-- results:end -->` with the
summary tables and the plots.
"""

import argparse
import csv
import json
import os
import signal
import sys

MARK_BEGIN, MARK_END = "<!-- results:begin -->", "<!-- results:end -->"
DTYPE_ORDER = {"bf16": 0, "fp16": 1, "fp32": 2, "fp64": 3}
PEER_ORDER = ["torch-flash", "torch-cudnn", "torch-efficient", "torch-math"]


# ---- loading ----------------------------------------------------------------------------------

def read_docs(path):
    """Session documents in a .json file or a .jsonl file (one per non-empty line)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"report.py: {path}: {e.strerror}")
    if path.endswith(".jsonl"):
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    docs.append(json.loads(line))
                except ValueError as e:
                    raise SystemExit(f"report.py: {path}:{n}: not JSON ({e})")
        return docs
    try:
        return [json.loads(text)]
    except ValueError as e:
        raise SystemExit(f"report.py: {path}: not JSON ({e})")


class Results:
    """Every run of the inputs (deduplicated), with what the documents say about the machine."""

    def __init__(self, paths):
        self.runs, self.ceilings, self.peaks, self.devices, self.memory_bytes = [], None, None, [], None
        seen = {}
        for path in paths:
            for doc in read_docs(path):
                dev = doc.get("device") or {}
                if dev.get("name") and dev["name"] not in self.devices:
                    self.devices.append(dev["name"])
                if doc.get("ceilings"):
                    self.ceilings = doc["ceilings"]
                if dev.get("peak") and any(dev["peak"].values()):
                    self.peaks = dev["peak"]
                if dev.get("memory_bytes"):
                    self.memory_bytes = dev["memory_bytes"]
                for r in doc.get("runs", []):
                    r = dict(r, _source=path, _device=dev.get("name", ""))
                    key = (problem_key(r), r.get("mode"), r.get("kernel"))
                    if key in seen:
                        self.runs[seen[key]] = r
                    else:
                        seen[key] = len(self.runs)
                        self.runs.append(r)
        self.quadratic = quadratic_kernels(self.runs)

    def kernels(self):
        """Kernel names: ours in order of appearance, then the PyTorch backends."""
        names = []
        for r in self.runs:
            if r["kernel"] not in names:
                names.append(r["kernel"])
        peers = [k for k in PEER_ORDER if k in names] + sorted(k for k in names if k.startswith("torch-") and k not in PEER_ORDER)
        return [k for k in names if not k.startswith("torch-")] + peers

    def has_ok(self, kernel, dtype=None):
        return any(r["kernel"] == kernel and ok(r) and (dtype is None or r.get("dtype") == dtype) for r in self.runs)


def ok(r):
    return r.get("status") == "ok" and (r.get("timing") or {}).get("median_ms")


def shape(r):
    return r.get("shape") or {}


def problem_key(r):
    s, f = shape(r), r.get("flags") or {}
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


def sort_key(r):
    s, f = shape(r), r.get("flags") or {}
    return (DTYPE_ORDER.get(r.get("dtype"), 9), s.get("D") or 0, bool(f.get("causal")), s.get("S_k") or 0,
            s.get("S_q") or 0, s.get("B") or 0, s.get("H") or 0, problem_key(r))


def quadratic_kernels(runs):
    """Kernels whose extra memory holds the S_q x S_k scores: at least one byte per score element
    (fp32 S alone is 4) at their largest problem, where flash kernels need ~4/S_k (the lse)."""
    best = {}
    for r in runs:
        mem, s = r.get("memory") or {}, shape(r)
        if not ok(r) or mem.get("extra_bytes") is None or not s.get("S_k"):
            continue
        scores = s["B"] * s["H"] * s["S_q"] * s["S_k"]
        if r["kernel"] not in best or scores > best[r["kernel"]][0]:
            best[r["kernel"]] = (scores, mem["extra_bytes"] / scores)
    return {k for k, (_, per) in best.items() if per >= 1.0}


def resolve_baselines(res, arg):
    """The ratio columns: --baseline's list ('peers' = every PyTorch backend), default torch-flash
    if present else cublas, plus cublas (the in-process baseline) when it ran."""
    if arg:
        names = []
        for b in arg.split(","):
            b = b.strip()
            names += [k for k in res.kernels() if k.startswith("torch-")] if b == "peers" else [b]
        return [b for b in dict.fromkeys(names) if b]
    base = ["torch-flash"] if res.has_ok("torch-flash") else []
    if res.has_ok("cublas"):
        base.append("cublas")
    return base


def plot_baseline(res, baseline, dtype):
    """The speedup plots' reference for one dtype: the baseline if it ran in that dtype, else the
    first PyTorch backend (then cublas) that did."""
    for k in [baseline, "torch-flash", "torch-cudnn", "torch-efficient", "torch-math", "cublas"]:
        if k and res.has_ok(k, dtype):
            return k
    return None


# ---- text -------------------------------------------------------------------------------------

def human_bytes(b):
    if not b:  # not measured (host kernels)
        return "–"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:.1f} {unit}" if b / div < 100 else f"{b / div:.0f} {unit}"
    return f"{b} B"


def fmt_ms(ms):
    return f"{ms:.3f}" if ms >= 1 else f"{ms:.4f}"


def check_text(r):
    c = r.get("check")
    if not c or not c.get("performed"):
        return "–"
    outs = c.get("outputs", {})
    worst = max((o.get("measured", o.get("rel_l2", 0)) or 0 for o in outs.values()), default=0)
    verdict = {True: "ok", False: "FAIL"}.get(c.get("passed"), "")
    return f"{worst:.1e} {verdict}".strip()


def noise_text(t):
    n = t.get("noise", t.get("rel_stddev"))
    if n is None:
        return "–"
    return f"{100 * n:.1f}%" + ("*" if t.get("noise_rule_met") is False else "")


def short(text, n=70):
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


def run_notes(r, res):
    if not ok(r):
        return f"{r.get('status', '?')}: {short(r.get('reason', ''))}"
    notes = []
    t = r.get("timing") or {}
    if t.get("throttled"):
        notes.append("throttled")
    if r["kernel"] in res.quadratic:
        notes.append("O(S²) memory")
    return ", ".join(notes)


def groups_of(runs):
    """(problem, mode) -> runs, in a stable reading order: dtype, D, causal, S, then mode."""
    groups = {}
    for r in sorted(runs, key=lambda r: (sort_key(r), r.get("mode") != "forward")):
        groups.setdefault((problem_key(r), r.get("mode")), []).append(r)
    return groups


def table(res, baselines, skipped=True):
    order = {k: i for i, k in enumerate(res.kernels())}
    head = ["problem", "mode", "kernel", "median ms", "noise", "TFLOP/s", "peak mem", "check"]
    head += [f"vs {b}" for b in baselines] + ["notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (prob, mode), rs in groups_of(res.runs).items():
        times = {r["kernel"]: r["timing"]["median_ms"] for r in rs if ok(r)}
        for r in sorted(rs, key=lambda r: order[r["kernel"]]):
            if not ok(r):
                if not skipped:
                    continue
                cells = [prob, mode, r["kernel"], "–", "–", "–", "–", "–"] + ["–"] * len(baselines)
            else:
                t = r["timing"]
                cells = [prob, mode, r["kernel"], fmt_ms(t["median_ms"]), noise_text(t),
                         f"{r['throughput']['tflops']:.2f}", human_bytes((r.get("memory") or {}).get("peak_bytes")),
                         check_text(r)]
                cells += [f"{times[b] / t['median_ms']:.2f}×" if b in times and b != r["kernel"] else "–"
                          for b in baselines]
            lines.append("| " + " | ".join(cells + [run_notes(r, res)]) + " |")
    legend = ("\nratio = baseline time / kernel time (> 1: faster than the baseline); noise = relative stddev of "
              "the samples, * where it stayed above --max-noise; peak mem = inputs + outputs + workspace.")
    return "\n".join(lines) + "\n" + legend


def s_label(S):
    return f"{S // 1024}k" if S >= 1024 and S % 1024 == 0 else str(S)


def summary(res, baselines):
    """One table per (dtype, mode, D, causal): a row per kernel, a column per problem size, cells
    TFLOP/s with the ratio to the first baseline that ran there."""
    blocks = {}
    for r in res.runs:
        s, f = shape(r), r.get("flags") or {}
        blocks.setdefault((DTYPE_ORDER.get(r.get("dtype"), 9), r.get("dtype"), r.get("mode") != "forward",
                           r.get("mode"), s.get("D"), bool(f.get("causal"))), []).append(r)
    order = {k: i for i, k in enumerate(res.kernels())}
    out = []
    for (_, dtype, _, mode, D, causal), rs in sorted(blocks.items(), key=lambda kv: kv[0][:3] + kv[0][4:]):
        cols = sorted({(shape(r)["S_k"], shape(r)["S_q"], shape(r)["B"], shape(r)["H"]) for r in rs})
        unique_s = len({c[0] for c in cols}) == len(cols)
        labels = [f"S={s_label(c[0])}" if unique_s else f"B{c[2]} H{c[3]} S{s_label(c[0])}" for c in cols]
        base = next((b for b in baselines if any(r["kernel"] == b and ok(r) for r in rs)), None)
        by = {(r["kernel"], (shape(r)["S_k"], shape(r)["S_q"], shape(r)["B"], shape(r)["H"])): r for r in rs}
        note = ""
        if len(cols) > 1 and len({c[2] * c[0] for c in cols}) == 1 and len({c[3] for c in cols}) == 1:
            note = f", B·S = {cols[0][2] * cols[0][0]}, H = {cols[0][3]}"  # e.g. fa-grid: constant tokens
        title = f"**{dtype} {mode}, D = {D}{', causal' if causal else ''}{note}** — TFLOP/s"
        title += f" (× = time of {base} / time)" if base else ""
        lines = [title, "", "| kernel | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
        for k in sorted({r["kernel"] for r in rs}, key=lambda k: order[k]):
            cells = []
            for c in cols:
                r = by.get((k, c))
                if r is None:
                    cells.append("")
                elif not ok(r):
                    reason = (r.get("reason") or "").lower()
                    cells.append("oom" if "memory" in reason else r.get("status", "?"))
                else:
                    cell = f"{r['throughput']['tflops']:.1f}"
                    b = by.get((base, c))
                    if base and k != base and b is not None and ok(b):
                        cell += f" ({b['timing']['median_ms'] / r['timing']['median_ms']:.2f}×)"
                    cells.append(cell)
            name = k + (" ‡" if k in res.quadratic else "")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    foot = ("‡ materialises the S × S scores (O(S²) memory); oom: did not fit in GPU memory; skipped: the kernel "
            "does not support the problem.")
    return "\n\n".join(out) + "\n\n" + foot + "\n"


# ---- CSV --------------------------------------------------------------------------------------

CSV_COLUMNS = ["kernel", "mode", "status", "reason", "B", "H", "H_kv", "S_q", "S_k", "D", "dtype", "layout", "causal",
               "window_left", "window_right", "median_ms", "min_ms", "max_ms", "mean_ms", "noise", "noise_rule_met",
               "stop_reason", "samples", "l2_flush", "timing_mode", "sm_clock_min_mhz", "sm_clock_max_mhz",
               "throttled", "flops", "tflops", "bytes", "gbps", "peak_fraction", "inputs_bytes", "outputs_bytes",
               "extra_bytes", "peak_bytes", "check_passed", "quadratic_memory", "device", "source"]


def csv_rows(res, baselines):
    groups = groups_of(res.runs)
    for (_, _), rs in groups.items():
        times = {r["kernel"]: r["timing"]["median_ms"] for r in rs if ok(r)}
        for r in rs:
            s, f = shape(r), r.get("flags") or {}
            t, th, mem = r.get("timing") or {}, r.get("throughput") or {}, r.get("memory") or {}
            c = r.get("check") or {}
            row = {"kernel": r["kernel"], "mode": r.get("mode"), "status": r.get("status"), "reason": r.get("reason", ""),
                   **{k: s.get(k) for k in ("B", "H", "H_kv", "S_q", "S_k", "D")},
                   "dtype": r.get("dtype"), "layout": r.get("layout"), "causal": f.get("causal"),
                   "window_left": f.get("window_left"), "window_right": f.get("window_right"),
                   **{k: t.get(k) for k in ("median_ms", "min_ms", "max_ms", "mean_ms", "noise_rule_met",
                                            "stop_reason", "l2_flush", "sm_clock_min_mhz", "sm_clock_max_mhz",
                                            "throttled")},
                   "noise": t.get("noise", t.get("rel_stddev")), "samples": t.get("repeat"),
                   "timing_mode": t.get("mode"),
                   **{k: th.get(k) for k in ("flops", "tflops", "bytes", "gbps", "peak_fraction")},
                   **{k: mem.get(k) for k in ("inputs_bytes", "outputs_bytes", "extra_bytes", "peak_bytes")},
                   "check_passed": c.get("passed") if c.get("performed") else None,
                   "quadratic_memory": r["kernel"] in res.quadratic, "device": r["_device"], "source": r["_source"]}
            for b in baselines:
                row[f"vs_{b}"] = times[b] / t["median_ms"] if ok(r) and b in times else None
            yield row


def write_csv(res, baselines, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS + [f"vs_{b}" for b in baselines])
        w.writeheader()
        for row in csv_rows(res, baselines):
            w.writerow(row)


# ---- README -----------------------------------------------------------------------------------

def readme_section(res, baselines, summary_text, plot_files, readme, md, csv_path):
    rel = lambda p: os.path.relpath(p, os.path.dirname(os.path.abspath(readme)))  # noqa: E731
    lines = [MARK_BEGIN, ""]
    dev = ", ".join(res.devices) or "unknown device"
    lines.append(f"Measured on {dev} by `scripts/bench.sh`; every number is the median of L2-flushed repetitions "
                 "(noise rule: relative stddev ≤ 0.5% or the time cap).")
    if res.ceilings:
        c = res.ceilings
        lines.append(f"Measured ceilings (`flashattn --ceilings`): bf16 GEMM {c['bf16_gemm_tflops']:.0f} TFLOP/s, "
                     f"fp32 GEMM {c['fp32_gemm_tflops']:.1f} TFLOP/s, copy {c['copy_gbps']:.0f} GB/s.")
    links = [f"[full table]({rel(md)})" if md else "", f"[CSV]({rel(csv_path)})" if csv_path else ""]
    if any(links):
        lines.append("Every run: " + ", ".join(x for x in links if x) + ".")
    lines += ["", summary_text, ""]
    for path in plot_files:
        name = os.path.splitext(os.path.basename(path))[0].replace("_", " ")
        lines.append(f"![{name}]({rel(path)})")
    lines += ["", MARK_END]
    try:
        with open(readme) as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"report.py: {readme}: {e.strerror}")
    if MARK_BEGIN not in text or MARK_END not in text:
        raise SystemExit(f"report.py: {readme}: no '{MARK_BEGIN}' ... '{MARK_END}' section to replace")
    head, rest = text.split(MARK_BEGIN, 1)
    tail = rest.split(MARK_END, 1)[1]
    with open(readme, "w") as f:
        f.write(head + "\n".join(lines) + tail)


def write_text(path, text):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("files", nargs="+", metavar="FILE")
    ap.add_argument("--table", action="store_true", help="print the markdown table (the default without outputs)")
    ap.add_argument("--baseline", default=None, metavar="K[,K...]|peers",
                    help="ratio columns against these kernels (default torch-flash if present, else cublas; "
                         "cublas is added when it ran)")
    ap.add_argument("--md", metavar="FILE", help="write the full markdown table here")
    ap.add_argument("--summary", metavar="FILE", help="write the per-(dtype, mode, D, causal) TFLOP/s tables here")
    ap.add_argument("--csv", metavar="FILE", help="write one CSV row per run here")
    ap.add_argument("--plots", metavar="DIR", help="write PNG plots here (needs matplotlib)")
    ap.add_argument("--readme", metavar="FILE", help="replace the results section of this README")
    ap.add_argument("--no-skipped", action="store_true", help="leave skipped and failed runs out of the table")
    args = ap.parse_args(argv)

    res = Results(args.files)
    if not res.runs:
        print("report.py: no runs in the input files", file=sys.stderr)
        return 2
    baselines = resolve_baselines(res, args.baseline)
    if args.baseline is None and "cublas" not in baselines and res.has_ok("cublas"):
        baselines.append("cublas")
    text = table(res, baselines, skipped=not args.no_skipped)
    sum_text = summary(res, baselines)
    outputs = any((args.md, args.summary, args.csv, args.plots, args.readme))
    if args.table or not outputs:
        if res.devices:
            print("device: " + ", ".join(res.devices))
        print(text)
    if args.md:
        write_text(args.md, f"# Results\n\nDevice: {', '.join(res.devices) or 'unknown'}\n\n{text}\n")
    if args.summary:
        write_text(args.summary, sum_text)
    if args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        write_csv(res, baselines, args.csv)
    plot_files = []
    if args.plots:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import report_plots  # noqa: E402  (matplotlib is only needed here)
        plot_files = report_plots.write_all(res, baselines[0] if baselines else None, args.plots)
        for p in plot_files:
            print(f"wrote {p}", file=sys.stderr)
    if args.readme:
        readme_section(res, baselines, sum_text, plot_files, args.readme, args.md, args.csv)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `report.py ... | head` ends quietly
    sys.exit(main())
