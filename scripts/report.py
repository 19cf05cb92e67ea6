#!/usr/bin/env python3
"""Tables, CSV and plots from flashattn and peers.py results (the same schema).

    report.py FILE [FILE ...]                        markdown table on stdout (also: --table)
    report.py --baseline torch-flash FILE ...        ratio column against one kernel
    report.py --baseline peers FILE ...              one ratio column per PyTorch backend
    report.py --stat min FILE ...                    ratios and TFLOP/s from the min time instead
    report.py FILES --md OUT.md --summary SUM.md --csv OUT.csv --plots DIR [--decode-md DEC.md] [--readme README.md]

FILEs are session documents (.json, as `flashattn --json` and peers.py write them) or JSON Lines
(.jsonl, one session document per line, as sweeps write them). Runs are grouped by problem
(shape, dtype, layout, flags; for decode the point and the timing mode) and mode; when the same
kernel was measured on the same problem more than once, the last measurement read wins (a hot
run never replaces a cold one).

Every ratio is `baseline's <stat> time / kernel's <stat> time` (> 1: the kernel is faster), with
the same statistic (--stat, default median) on both sides, and TFLOP/s comes from that time too.
The default baseline is torch-flash when the inputs contain it, else cublas; cublas, the
in-process baseline, gets a column of its own as well. Runs that missed the noise rule are marked
*, unchecked runs †; a run that failed --check is never quoted, plotted or used in a ratio.
--summary writes one compact table per (dtype, mode, D, causal) with TFLOP/s per sequence length,
then the decode table (cold and hot, attention and step, each against its PyTorch counterpart);
--plots writes PNGs (see report_plots.py); --readme replaces the part of README.md between
`<!-- results:begin -->` and `<!-- results:end -->` with the summary tables and the plots.
"""

import argparse
import csv
import os
import signal
import sys

from report_common import (DTYPE_ORDER, NOISE_MARK, STATS, UNCHECKED_MARK, Results, check_state, fmt_ms, fmt_ratio,
                           human_bytes, is_decode, is_peer, marks, noise_missed, ok, problem_key, ratio, run_ms,
                           s_label, shape, short, sort_key, tflops, usable)
from report_decode import decode_table

MARK_BEGIN, MARK_END = "<!-- results:begin -->", "<!-- results:end -->"
HELD_STREAM = ("events around each repetition with the stream held until the batch is enqueued: no host time "
               "inside the events")


def resolve_baselines(res, arg):
    """The ratio columns: --baseline's list ('peers' = every PyTorch backend), default torch-flash
    if present else cublas, plus cublas (the in-process baseline) when it ran."""
    if arg:
        names = []
        for b in arg.split(","):
            b = b.strip()
            names += [k for k in res.kernels() if is_peer(k)] if b == "peers" else [b]
        return [b for b in dict.fromkeys(names) if b]
    base = ["torch-flash"] if res.has_ok("torch-flash") else []
    if res.has_ok("cublas"):
        base.append("cublas")
    return base


# ---- the full table ---------------------------------------------------------------------------

def worst_error(r):
    """The largest measured error over the checked outputs (each in its rule's metric)."""
    outs = (r.get("check") or {}).get("outputs") or {}
    return max((o.get("measured", o.get("rel_l2", 0)) or 0 for o in outs.values()), default=None)


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def check_text(r):
    """The worst measured error with ok/FAIL, or 'unchecked'."""
    state = check_state(r)
    if state == "unchecked":
        return "unchecked"
    worst = worst_error(r)
    verdict = "ok" if state == "ok" else "FAIL"
    return f"{worst:.1e} {verdict}" if worst is not None else verdict


def noise_text(t):
    n = t.get("noise", t.get("rel_stddev"))
    if n is None:
        return "–"
    return f"{100 * n:.1f}%" + (NOISE_MARK if noise_missed(t) else "")


def median_over_min(t):
    return t["median_ms"] / t["min_ms"] if t.get("median_ms") and t.get("min_ms") else None


def run_notes(r, res):
    if not ok(r):
        return f"{r.get('status', '?')}: {short(r.get('reason', ''))}"
    notes = []
    t = r.get("timing") or {}
    if check_state(r) == "fail":
        notes.append("failed --check: not quoted")
    if is_decode(r):
        notes.append("decode step (cache update + attention)")
    if t.get("throttled"):
        notes.append("throttled")
    if t.get("hold_timeouts"):
        notes.append(f"stream hold timed out {t['hold_timeouts']}×")
    if t.get("batches_rerun"):
        notes.append(f"{t['batches_rerun']} batches rerun")
    if r["kernel"] in res.quadratic:
        notes.append("O(S²) memory")
    return ", ".join(notes)


def groups_of(runs):
    """(problem, mode) -> runs, in a stable reading order: dtype, D, causal, S, then mode."""
    groups = {}
    for r in sorted(runs, key=lambda r: (sort_key(r), r.get("mode") != "forward")):
        groups.setdefault((problem_key(r), r.get("mode")), []).append(r)
    return groups


def group_times(rs, stat):
    """kernel -> <stat> time of the group's quotable runs (failed runs give and take no ratio)."""
    return {r["kernel"]: run_ms(r, stat) for r in rs if usable(r) and run_ms(r, stat)}


def table(res, baselines, skipped=True, stat="median"):
    """One row per run: median, min and their ratio, noise, TFLOP/s and the ratios from <stat>."""
    order = {k: i for i, k in enumerate(res.kernels())}
    head = ["problem", "mode", "kernel", "median ms", "min ms", "median/min", "noise", f"TFLOP/s ({stat})",
            "peak mem", "check"] + [f"vs {b}" for b in baselines] + ["notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (prob, mode), rs in groups_of(res.runs).items():
        times = group_times(rs, stat)
        for r in sorted(rs, key=lambda r: order[r["kernel"]]):
            if not ok(r):
                if not skipped:
                    continue
                cells = [prob, mode, r["kernel"]] + ["–"] * 7 + ["–"] * len(baselines)
            else:
                t = r["timing"]
                mm = median_over_min(t)
                tf = tflops(r, stat) if usable(r) else None
                cells = [prob, mode, r["kernel"], fmt_ms(t.get("median_ms")), fmt_ms(t.get("min_ms")),
                         f"{mm:.3f}" if mm else "–", noise_text(t), f"{tf:.2f}" if tf is not None else "–",
                         human_bytes((r.get("memory") or {}).get("peak_bytes")), check_text(r)]
                mine = times.get(r["kernel"]) if usable(r) else None
                cells += [fmt_ratio(ratio(times.get(b), mine)) if b != r["kernel"] else "–" for b in baselines]
            lines.append("| " + " | ".join(cells + [run_notes(r, res)]) + " |")
    legend = (f"\nvs K = {stat} time of K / {stat} time of the row's kernel, the same statistic on both sides "
              f"(> 1: faster than K); TFLOP/s from the {stat} time; median/min = median time / min time; noise = "
              f"relative stddev of the samples, {NOISE_MARK} where the run stopped on the time cap with the noise "
              "above --max-noise; check = worst measured error of the outputs against the fp64 reference and its "
              "verdict, `unchecked` where --check did not run; a run that failed its check gets no ratio (–) and "
              "none is computed against it; decode rows time a whole step (cache update + attention) on both "
              "sides; peak mem = inputs + outputs + workspace.")
    return "\n".join(lines) + "\n" + legend


# ---- the summary tables ------------------------------------------------------------------------

def summary_cell(r, base_run, stat, is_base):
    if not ok(r):
        reason = (r.get("reason") or "").lower()
        return "oom" if "memory" in reason else r.get("status", "?")
    if check_state(r) == "fail":
        return "FAIL"
    tf = tflops(r, stat)
    cell = (f"{tf:.1f}" if tf is not None else "–") + marks(r)
    if base_run is not None and not is_base:
        x = ratio(run_ms(base_run, stat), run_ms(r, stat)) if usable(base_run) else None
        cell += f" ({fmt_ratio(x)})"
    return cell


def summary_block(res, rs, baselines, stat, order, head):
    dtype, mode, D, causal = head
    key = lambda r: (shape(r)["S_k"], shape(r)["S_q"], shape(r)["B"], shape(r)["H"])  # noqa: E731
    cols = sorted({key(r) for r in rs})
    unique_s = len({c[0] for c in cols}) == len(cols)
    labels = [f"S={s_label(c[0])}" if unique_s else f"B{c[2]} H{c[3]} S{s_label(c[0])}" for c in cols]
    base = next((b for b in baselines if any(r["kernel"] == b and usable(r) for r in rs)), None)
    by = {(r["kernel"], key(r)): r for r in rs}
    note = ""
    if len(cols) > 1 and len({c[2] * c[0] for c in cols}) == 1 and len({c[3] for c in cols}) == 1:
        note = f", B·S = {cols[0][2] * cols[0][0]}, H = {cols[0][3]}"  # e.g. fa-grid: constant tokens
    title = f"**{dtype} {mode}, D = {D}{', causal' if causal else ''}{note}** — TFLOP/s from the {stat} time"
    title += f" (× = {stat} time of {base} / {stat} time)" if base else ""
    lines = [title, "", "| kernel | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for k in sorted({r["kernel"] for r in rs}, key=lambda k: order[k]):
        cells = ["" if by.get((k, c)) is None else summary_cell(by[(k, c)], by.get((base, c)) if base else None,
                                                                 stat, k == base) for c in cols]
        lines.append(f"| {k}{' ‡' if k in res.quadratic else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(res, baselines, stat="median"):
    """One table per (dtype, mode, D, causal): a row per kernel, a column per problem size, cells
    TFLOP/s (from the <stat> time) with the ratio to the first baseline that ran there; then the
    decode table."""
    blocks = {}
    grid = [r for r in res.runs if not is_decode(r)]
    for r in grid:
        s, f = shape(r), r.get("flags") or {}
        key = (DTYPE_ORDER.get(r.get("dtype"), 9), str(r.get("dtype")), r.get("mode") != "forward", str(r.get("mode")),
               s.get("D") or 0, bool(f.get("causal")))
        blocks.setdefault(key, []).append(r)
    order = {k: i for i, k in enumerate(res.kernels())}
    out = [summary_block(res, rs, baselines, stat, order, (k[1], k[3], k[4], k[5]))
           for k, rs in sorted(blocks.items(), key=lambda kv: kv[0][:3] + kv[0][4:])]
    quoted = [r for r in grid if usable(r)]
    missed = sum(noise_missed(r.get("timing")) for r in quoted)
    unchecked = sum(check_state(r) == "unchecked" for r in quoted)
    failed = sum(ok(r) and check_state(r) == "fail" for r in grid)
    foot = (f"TFLOP/s and × from the {stat} time of each run, the same statistic on both sides of every ratio. "
            f"{NOISE_MARK}: the run missed the noise rule (stopped on the time cap with the relative stddev above "
            f"--max-noise): {missed} of {len(quoted)} rows. {UNCHECKED_MARK}: not checked by --check: "
            f"{unchecked} of {len(quoted)} rows. FAIL: failed --check, not quoted and no ratio (–) against it: "
            f"{plural(failed, 'row')}. ‡ materialises the S × S scores (O(S²) memory); oom: did not fit in GPU "
            "memory; skipped: the kernel does not support the problem.")
    text = ("\n\n".join(out) + "\n\n" + foot + "\n") if out else ""
    dec = decode_table(res, stat)
    return text + ("\n" if text and dec else "") + dec


# ---- CSV --------------------------------------------------------------------------------------

CSV_COLUMNS = [
    "kernel", "mode", "status", "reason", "B", "H", "H_kv", "S_q", "S_k", "D", "dtype", "layout", "causal",
    "window_left", "window_right", "median_ms", "min_ms", "median_over_min", "max_ms", "mean_ms", "noise",
    "noise_rule_met", "stop_reason", "samples", "l2_flush", "timing_mode", "timing_method", "flush_method",
    "hold_timeouts", "batches_rerun", "sm_clock_min_mhz", "sm_clock_max_mhz", "throttled", "flops", "tflops",
    "tflops_stat", "bytes", "gbps", "peak_fraction", "inputs_bytes", "outputs_bytes", "extra_bytes", "peak_bytes",
    "check_passed", "check_worst", "decode_kv_len_max", "decode_paged", "decode_page_size", "decode_splits",
    "attention_median_ms", "attention_min_ms", "attention_noise_rule_met", "quadratic_memory", "ratio_stat",
    "device", "source"]


def csv_row(r, res, stat):
    s, f = shape(r), r.get("flags") or {}
    t, th, mem = r.get("timing") or {}, r.get("throughput") or {}, r.get("memory") or {}
    d = r.get("decode") or {}
    at = ((d.get("attention") or {}).get("timing")) or {}
    state = check_state(r)
    return {"kernel": r["kernel"], "mode": r.get("mode"), "status": r.get("status"),
            "reason": short(r.get("reason", ""), 500),
            **{k: s.get(k) for k in ("B", "H", "H_kv", "S_q", "S_k", "D")},
            "dtype": r.get("dtype"), "layout": r.get("layout"), "causal": f.get("causal"),
            "window_left": f.get("window_left"), "window_right": f.get("window_right"),
            **{k: t.get(k) for k in ("median_ms", "min_ms", "max_ms", "mean_ms", "noise_rule_met", "stop_reason",
                                     "l2_flush", "hold_timeouts", "batches_rerun", "sm_clock_min_mhz",
                                     "sm_clock_max_mhz", "throttled")},
            "median_over_min": median_over_min(t), "noise": t.get("noise", t.get("rel_stddev")),
            "samples": t.get("repeat"), "timing_mode": t.get("mode"), "timing_method": t.get("method"),
            "flush_method": t.get("flush_method"),
            **{k: th.get(k) for k in ("flops", "tflops", "bytes", "gbps", "peak_fraction")},
            "tflops_stat": tflops(r, stat) if usable(r) else None,
            **{k: mem.get(k) for k in ("inputs_bytes", "outputs_bytes", "extra_bytes", "peak_bytes")},
            "check_passed": None if state == "unchecked" else state == "ok",
            "check_worst": worst_error(r) if state != "unchecked" else None,
            "decode_kv_len_max": (d.get("kv_lengths") or {}).get("max"), "decode_paged": d.get("paged"),
            "decode_page_size": d.get("page_size") if d.get("paged") else None, "decode_splits": d.get("splits"),
            "attention_median_ms": at.get("median_ms", (d.get("attention") or {}).get("median_ms")),
            "attention_min_ms": at.get("min_ms"), "attention_noise_rule_met": at.get("noise_rule_met"),
            "quadratic_memory": r["kernel"] in res.quadratic, "ratio_stat": stat, "device": r["_device"],
            "source": os.path.basename(r["_source"])}


def csv_rows(res, baselines, stat="median"):
    for _, rs in groups_of(res.runs).items():
        times = group_times(rs, stat)
        for r in rs:
            row = csv_row(r, res, stat)
            mine = times.get(r["kernel"]) if usable(r) else None
            for b in baselines:
                row[f"vs_{b}"] = ratio(times.get(b), mine) if b != r["kernel"] else None
            yield row


def write_csv(res, baselines, path, stat="median"):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS + [f"vs_{b}" for b in baselines])
        w.writeheader()
        for row in csv_rows(res, baselines, stat):
            w.writerow(row)


# ---- README -----------------------------------------------------------------------------------

def header_lines(res, stat):
    """What the numbers are: device(s) and date, statistic, timing method, noise rule, checks."""
    quoted = [r for r in res.runs if usable(r)]
    dev = ", ".join(res.devices) or "unknown device"
    when = f" ({res.dates[0]}{' – ' + res.dates[-1] if len(res.dates) > 1 else ''})" if res.dates else ""
    lines = [f"Measured on {dev}{when} by `scripts/bench.sh`. Statistic: the **{stat}** time of each run's "
             f"repetitions, the same for our kernels and the PyTorch backends: every × is the baseline's {stat} time "
             f"/ the kernel's {stat} time, and TFLOP/s and GB/s come from the {stat} time."]
    others = {}
    for r in quoted:
        m = (r.get("timing") or {}).get("method") or "not recorded"
        if m != "held_stream":
            others[m] = others.get(m, 0) + 1
    method = f"Timing: {HELD_STREAM}"
    if others:
        method += (f" — except {sum(others.values())} of {len(quoted)} rows, timed without the held stream (method "
                   + ", ".join(f"{m}: {n}" for m, n in sorted(others.items())) + ")")
    flushed = sum((r.get("timing") or {}).get("mode") != "hot" for r in quoted)
    method += "; L2 flushed before every repetition" + ("" if flushed == len(quoted) else
                                                          f" except in the {len(quoted) - flushed} hot runs")
    noise = sorted({(r.get("timing") or {}).get("max_noise") for r in quoted} - {None})
    if noise:
        method += (f"; noise rule: relative stddev ≤ {', '.join(f'{100 * n:g}%' for n in noise)} or the time cap "
                   f"({sum(noise_missed(r.get('timing')) for r in quoted)} rows stopped on the cap, marked "
                   f"{NOISE_MARK})")
    lines.append(method + ".")
    unchecked = sum(check_state(r) == "unchecked" for r in quoted)
    failed = sum(ok(r) and check_state(r) == "fail" for r in res.runs)
    check = ("Every row was checked by `--check` (fp64 reference on sampled rows)" if not unchecked else
             f"{len(quoted) - unchecked} of {len(quoted)} rows were checked by `--check` (fp64 reference on sampled "
             f"rows); the {unchecked} unchecked rows are marked {UNCHECKED_MARK}")
    lines.append(check + (f"; {plural(failed, 'run')} failed their check and are not quoted." if failed else "."))
    if res.ceilings:
        c = res.ceilings
        lines.append(f"Measured ceilings (`flashattn --ceilings`): bf16 GEMM {c['bf16_gemm_tflops']:.0f} TFLOP/s, "
                     f"fp32 GEMM {c['fp32_gemm_tflops']:.1f} TFLOP/s, copy {c['copy_gbps']:.0f} GB/s.")
    return lines


def readme_section(res, summary_text, plot_files, readme, md, csv_path, stat="median"):
    rel = lambda p: os.path.relpath(os.path.abspath(p), os.path.dirname(os.path.abspath(readme)))  # noqa: E731
    lines = [MARK_BEGIN, ""] + header_lines(res, stat)
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


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("files", nargs="+", metavar="FILE")
    ap.add_argument("--table", action="store_true", help="print the markdown table (the default without outputs)")
    ap.add_argument("--baseline", default=None, metavar="K[,K...]|peers",
                    help="ratio columns against these kernels (default torch-flash if present, else cublas; "
                         "cublas is added when it ran)")
    ap.add_argument("--stat", choices=STATS, default="median",
                    help="the statistic of every ratio, TFLOP/s and GB/s figure, on both sides (default median)")
    ap.add_argument("--md", metavar="FILE", help="write the full markdown table here")
    ap.add_argument("--summary", metavar="FILE", help="write the per-(dtype, mode, D, causal) TFLOP/s tables and "
                                                     "the decode table here")
    ap.add_argument("--decode-md", metavar="FILE", help="write the decode table alone here")
    ap.add_argument("--csv", metavar="FILE", help="write one CSV row per run here")
    ap.add_argument("--plots", metavar="DIR", help="write PNG plots here (needs matplotlib)")
    ap.add_argument("--readme", metavar="FILE", help="replace the results section of this README")
    ap.add_argument("--no-skipped", action="store_true", help="leave skipped and failed runs out of the table")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    res = Results(args.files)
    if not res.runs:
        print("report.py: no runs in the input files", file=sys.stderr)
        return 2
    stat = args.stat
    baselines = resolve_baselines(res, args.baseline)
    if args.baseline is None and "cublas" not in baselines and res.has_ok("cublas"):
        baselines.append("cublas")
    text = table(res, baselines, skipped=not args.no_skipped, stat=stat)
    sum_text = summary(res, baselines, stat)
    outputs = any((args.md, args.summary, args.csv, args.plots, args.readme, args.decode_md))
    if args.table or not outputs:
        if res.devices:
            print("device: " + ", ".join(res.devices))
        print(text)
    if args.md:
        write_text(args.md, f"# Results\n\nDevice: {', '.join(res.devices) or 'unknown'}\n\n{text}\n")
    if args.summary:
        write_text(args.summary, sum_text)
    if args.decode_md:
        write_text(args.decode_md, decode_table(res, stat) or "No decode runs in the inputs.\n")
    if args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        write_csv(res, baselines, args.csv, stat)
    plot_files = []
    if args.plots:
        import report_plots  # noqa: E402  (matplotlib is only needed here)
        plot_files = report_plots.write_all(res, baselines[0] if baselines else None, args.plots, stat)
        for p in plot_files:
            print(f"wrote {p}", file=sys.stderr)
    if args.readme:
        readme_section(res, sum_text, plot_files, args.readme, args.md, args.csv, stat)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `report.py ... | head` ends quietly
    sys.exit(main())
