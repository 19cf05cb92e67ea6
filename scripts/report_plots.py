"""PNG plots for report.py (matplotlib, Agg backend): one file per dtype for each of

    latency_<dtype>.png   <stat> time vs S, log-log, a panel per (mode, D, causal)
    tflops_<dtype>.png    TFLOP/s (from the <stat> time) vs S, same panels
    speedup_<dtype>.png   baseline's <stat> time / kernel's <stat> time vs S (> 1: faster)
    memory_<dtype>.png    peak memory vs S; kernels that materialise S x S dashed, runs that did
                          not fit marked x on the GPU-memory line
and roofline.png: every run at its arithmetic intensity (FLOPs / minimum bytes) under the measured
ceilings (`flashattn --ceilings`), or the datasheet peaks when no ceilings were measured.

<stat> is report.py's --stat (median or min), named in every title. Runs that failed --check are
left out entirely, and so are decode runs (report.py's decode table covers them). Kernels keep one
colour across all files; PyTorch backends are drawn with squares, ours with circles;
O(S^2)-memory kernels with dashed lines (hatched bars); runs not checked by --check with hollow
markers (hollow bars) and "unchecked" in the legend.
"""

import math
import os
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

import report_common as rc  # noqa: E402

# Ours: saturated hues; PyTorch: black and muted hues (with squares), so the two families separate.
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#e377c2", "#17becf", "#393b79", "#637939",
           "#843c39"]
PEER_PALETTE = {"torch-flash": "#000000", "torch-cudnn": "#8c564b", "torch-efficient": "#bcbd22",
                "torch-math": "#7f7f7f"}


class Style:
    """Colours, markers and labels; `unchecked` (kernel -> 'all' | 'some') is set per figure."""

    def __init__(self, res, stat="median"):
        self.res, self.stat, self.baseline, self.unchecked = res, stat, None, {}
        ours = [k for k in res.kernels() if not rc.is_peer(k)]
        self.color = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(ours)}
        for i, k in enumerate(k for k in res.kernels() if rc.is_peer(k)):
            self.color[k] = PEER_PALETTE.get(k, PALETTE[-1 - i % 3])

    def for_runs(self, runs):
        """Which kernels' plotted runs were not checked: all of them, or some (hollow points)."""
        self.unchecked = {}
        for k in {r["kernel"] for r in runs}:
            n = sum(rc.check_state(r) == "unchecked" for r in runs if r["kernel"] == k)
            if n:
                self.unchecked[k] = "all" if n == sum(r["kernel"] == k for r in runs) else "some"
        return self

    def line(self, kernel, hollow=None):
        quad = kernel in self.res.quadratic
        hollow = self.unchecked.get(kernel) == "all" if hollow is None else hollow
        return dict(color=self.color[kernel], marker="s" if rc.is_peer(kernel) else "o", markersize=5,
                    linestyle="--" if quad else "-", linewidth=1.6,
                    markerfacecolor="white" if hollow else self.color[kernel])

    def label(self, kernel):
        extra = [] if kernel not in self.res.quadratic else ["O(S²) memory"]
        state = self.unchecked.get(kernel)
        if state:
            extra.append("unchecked" if state == "all" else "hollow: unchecked")
        return kernel + (f" ({', '.join(extra)})" if extra else "")

    def handles(self, kernels):
        return [Line2D([], [], label=self.label(k), **self.line(k)) for k in kernels]

    def bar(self, kernel, hollow=None):
        # O(S^2)-memory kernels hatched; PyTorch backends outlined in black; unchecked runs hollow.
        hollow = self.unchecked.get(kernel) == "all" if hollow is None else hollow
        edge = self.color[kernel] if hollow else "black" if rc.is_peer(kernel) else "white"
        return dict(color="white" if hollow else self.color[kernel], edgecolor=edge, linewidth=1.2 if hollow else 0.6,
                    hatch="////" if kernel in self.res.quadratic else None)

    def patches(self, kernels):
        return [Patch(label=self.label(k), **{("facecolor" if key == "color" else key): v
                                               for key, v in self.bar(k).items()}) for k in kernels]


def s_ticks(ax, values):
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(values)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: rc.s_label(int(round(v)))))


def log_y(ax, suffix=""):
    """Log y axis with plain 1-2-5 tick labels ("0.2", "5", "100") instead of powers of ten."""
    ax.set_yscale("log")
    ax.relim()
    ax.autoscale_view()
    lo, hi = ax.get_ylim()
    lo, hi = lo / 1.2, hi * 1.2  # headroom: bars and markers clear of the frame
    ax.set_ylim(lo, hi)
    decades = math.log10(max(hi, 1e-12) / max(lo, 1e-12))
    mantissas = (1, 1.5, 2, 3, 5, 7) if decades <= 1.5 else (1, 2, 5) if decades <= 3.5 else (1,)
    ticks = [m * 10.0**e for e in range(-6, 7) for m in mantissas]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}{suffix}"))


def panels_of(runs):
    """Panels (mode, D, causal): rows are modes (forward first), columns (D, causal)."""
    modes = sorted({r["mode"] for r in runs}, key=lambda m: m != "forward")
    cols = sorted({(rc.shape(r)["D"], bool((r.get("flags") or {}).get("causal"))) for r in runs})
    return modes, cols


def panel_title(mode, D, causal):
    return f"{mode} · D = {D}" + (" · causal" if causal else "")


def family_note(runs):
    """'B·S = 16384, H·D = 2048' when every problem keeps tokens and width constant (fa-grid)."""
    bs = {rc.shape(r)["B"] * rc.shape(r)["S_k"] for r in runs}
    hd = {rc.shape(r)["H"] * rc.shape(r)["D"] for r in runs}
    if len(bs) == 1 and len(hd) == 1 and len({rc.shape(r)["S_k"] for r in runs}) > 1:
        return f"B·S = {bs.pop()}, H·D = {hd.pop()}"
    return ""


def problem_cat(r):
    s = rc.shape(r)
    return (s["S_k"], s["S_q"], s["B"], s["H"])


def cat_label(c):
    return f"B{c[2]} H{c[3]}\nS={rc.s_label(c[0])}" + (f"x{rc.s_label(c[1])}" if c[1] != c[0] else "")


def in_panel(r, mode, D, causal):
    return r["mode"] == mode and rc.shape(r)["D"] == D and bool((r.get("flags") or {}).get("causal")) == causal


def use_lines(runs):
    """Lines over S when every panel has at least 3 sizes, one problem each (a sweep such as
    fa-grid); grouped bars per problem otherwise (a handful of unrelated shapes)."""
    panels = {}
    for r in runs:
        panels.setdefault((r["mode"], rc.shape(r)["D"], bool((r.get("flags") or {}).get("causal"))), set()).add(
            problem_cat(r))
    return all(len(c) >= 3 and len({x[0] for x in c}) == len(c) for c in panels.values())


def panel_figure(res, style, runs, path, title, subtitle, value, ylabel, yscale="linear", refline=None,
                 lost=(), cap=None, extra_handles=()):
    """A panel per (mode, D, causal): rows are modes, columns (D, causal). `value(r)` is plotted
    per run, as lines over S or as grouped bars per problem; `lost` runs are marked x at `cap`."""
    style.for_runs(runs)
    modes, cols = panels_of(list(runs) + list(lost))
    lines = use_lines(runs)
    kernels = [k for k in res.kernels() if any(r["kernel"] == k for r in runs)]
    all_s = {rc.shape(r)["S_k"] for r in list(runs) + list(lost)}
    width_per_panel = 3.6 if lines else max(3.6, 0.35 * len(kernels) * max(
        len({problem_cat(r) for r in runs if in_panel(r, m, D, c)}) for m in modes for (D, c) in cols))
    fig, axes = plt.subplots(len(modes), len(cols), figsize=(width_per_panel * len(cols) + 2.6, 3.0 * len(modes) + 1.0),
                             squeeze=False)
    wrap = max(40, int(fig.get_figwidth() * 11))  # characters per line at this font size
    fig.suptitle("\n".join(textwrap.wrap(title, wrap) + textwrap.wrap(subtitle or "", wrap)), fontsize=11)
    for i, mode in enumerate(modes):
        for j, (D, causal) in enumerate(cols):
            ax = axes[i][j]
            mine = [r for r in runs if in_panel(r, mode, D, causal)]
            gone = [r for r in lost if in_panel(r, mode, D, causal)]
            if not mine and not gone:
                ax.set_visible(False)
                continue
            if lines:
                for k in kernels:
                    pts = sorted((r for r in mine if r["kernel"] == k), key=problem_cat)
                    if pts:
                        ax.plot([rc.shape(r)["S_k"] for r in pts], [value(r) for r in pts], **style.line(k))
                        hollow = [r for r in pts if rc.check_state(r) == "unchecked"]
                        if hollow:  # unchecked points hollow, drawn over the line's filled ones
                            ax.plot([rc.shape(r)["S_k"] for r in hollow], [value(r) for r in hollow],
                                    **dict(style.line(k, hollow=True), linestyle="none"))
                    x = [rc.shape(r)["S_k"] for r in gone if r["kernel"] == k]
                    if x and cap:
                        ax.plot(x, [cap] * len(x), linestyle="none", marker="x", markersize=8, color=style.color[k])
                s_ticks(ax, all_s)
                if i == len(modes) - 1:
                    ax.set_xlabel("sequence length S")
            else:
                cats = sorted({problem_cat(r) for r in mine + gone})
                present = [k for k in kernels if any(r["kernel"] == k for r in mine + gone)]
                w = 0.8 / max(len(present), 1)
                for n, k in enumerate(present):
                    for ci, c in enumerate(cats):
                        x = ci - 0.4 + w * (n + 0.5)
                        r = next((r for r in mine if r["kernel"] == k and problem_cat(r) == c), None)
                        if r is not None:
                            # Ratios grow up or down from the reference line; other values from 0.
                            base = refline or 0.0
                            ax.bar(x, value(r) - base, w, bottom=base,
                                   **style.bar(k, hollow=rc.check_state(r) == "unchecked"))
                        elif cap and any(g["kernel"] == k and problem_cat(g) == c for g in gone):
                            ax.plot([x], [cap], marker="x", markersize=8, color=style.color[k])
                ax.set_xticks(range(len(cats)), [cat_label(c) for c in cats], fontsize=8)
                ax.set_xlim(-0.5, len(cats) - 0.5)
            ax.set_title(panel_title(mode, D, causal), fontsize=9)
            ax.grid(True, axis="y", which="major", alpha=0.3)
            if lines:
                ax.grid(True, axis="x", which="major", alpha=0.3)
            if refline is not None:
                ax.axhline(refline, color="black", linewidth=1.0)
            if cap:
                ax.axhline(cap, color="black", linewidth=0.8, linestyle=":")
            if yscale == "log":  # after the reference lines: the ticks depend on the full range
                log_y(ax, "×" if refline == 1.0 else "")
            else:
                ax.set_ylim(bottom=0)
            if j == 0:
                ax.set_ylabel(ylabel)
    handles = (style.handles(kernels) if lines else style.patches(kernels)) + list(extra_handles)
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False, borderaxespad=0.3)
    fig.tight_layout(rect=(0, 0, 1 - 2.3 / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def subtitle_of(res, runs, what):
    parts = [", ".join(res.devices), family_note(runs), what]
    return " — ".join(p for p in parts if p)


def stat_note(style, runs):
    """The subtitle's statement of what a value is, and of the hollow marks where there are some."""
    note = f"{style.stat} time of every run, ours and PyTorch's"
    if any(rc.check_state(r) == "unchecked" for r in runs):
        note += "; hollow: unchecked"
    return note


def plot_baseline(res, baseline, dtype):
    """The speedup plots' reference for one dtype: the baseline if it ran in that dtype, else the
    first PyTorch backend (then cublas) that did."""
    for k in [baseline] + rc.PEER_ORDER + ["cublas"]:
        if k and res.has_ok(k, dtype):
            return k
    return None


def vs_s_plot(res, style, runs, dtype, path, what):
    """latency / tflops / speedup per problem. Returns the path, or None when nothing to draw."""
    stat = style.stat
    okr = [r for r in runs if rc.usable(r) and rc.run_ms(r, stat)]
    if what == "speedup":
        baseline = plot_baseline(res, style.baseline, dtype)
        if baseline is None:
            return None
        base_time = {(rc.problem_key(r), r["mode"]): rc.run_ms(r, stat) for r in okr if r["kernel"] == baseline}
        okr = [r for r in okr if r["kernel"] != baseline and (rc.problem_key(r), r["mode"]) in base_time]
        base_note = ", unchecked" if any(rc.check_state(r) == "unchecked" for r in runs if r["kernel"] == baseline
                                         and rc.usable(r)) else ""
        if not okr:
            return None
        return panel_figure(res, style, okr, path,
                            f"{dtype} attention: speedup vs {baseline} ({stat} time of {baseline} / {stat} time; "
                            "> 1: faster)", subtitle_of(res, okr, stat_note(style, okr)),
                            lambda r: rc.ratio(base_time[(rc.problem_key(r), r["mode"])], rc.run_ms(r, stat)),
                            "speedup (×)", "log", refline=1.0,
                            extra_handles=[Line2D([], [], color="black", linewidth=1.0,
                                                  label=f"{baseline} (1×{base_note})")])
    if not okr:
        return None
    if what == "latency":
        return panel_figure(res, style, okr, path, f"{dtype} attention: {stat} time (lower is better)",
                            subtitle_of(res, okr, stat_note(style, okr)), lambda r: rc.run_ms(r, stat),
                            f"{stat} time (ms)", "log")
    okr = [r for r in okr if rc.tflops(r, stat) is not None]
    if not okr:
        return None
    ys = [rc.tflops(r, stat) for r in okr]
    scale = "log" if max(ys) / max(min(ys), 1e-9) > 30 else "linear"
    return panel_figure(res, style, okr, path, f"{dtype} attention: throughput from the {stat} time (higher is better)",
                        subtitle_of(res, okr, stat_note(style, okr)), lambda r: rc.tflops(r, stat),
                        f"TFLOP/s ({stat})", scale)


def memory_plot(res, style, runs, dtype, path):
    okr = [r for r in runs if rc.usable(r) and (r.get("memory") or {}).get("peak_bytes")]
    oom = [r for r in runs if not rc.ok(r) and "memory" in (r.get("reason") or "").lower()]
    if not okr:
        return None
    cap = res.memory_bytes / 2**30 if res.memory_bytes else None
    extra = []
    if cap:
        extra = [Line2D([], [], color="black", linewidth=0.8, linestyle=":", label=f"GPU memory ({cap:.0f} GiB)"),
                 Line2D([], [], color="gray", marker="x", linestyle="none", label="did not fit")]
    return panel_figure(res, style, okr, path,
                        f"{dtype} attention: peak memory per run (inputs + outputs + workspace)",
                        subtitle_of(res, okr, "kernels with equal memory overlap"
                                    + ("; hollow: unchecked" if any(
                                        rc.check_state(r) == "unchecked" for r in okr) else "")),
                        lambda r: r["memory"]["peak_bytes"] / 2**30, "peak memory (GiB)", "log",
                        lost=oom, cap=cap, extra_handles=extra)


def ceilings_for(res, dtype):
    """(compute TFLOP/s, bandwidth GB/s, label) for a dtype's roofline, measured or datasheet."""
    c, p = res.ceilings, res.peaks
    if c:
        peak = c["fp32_gemm_tflops"] if dtype == "fp32" else c["bf16_gemm_tflops"]
        what = "fp32 cuBLAS GEMM (no TF32)" if dtype == "fp32" else "bf16 cuBLAS GEMM"
        return peak, c["copy_gbps"], f"measured: {what} {peak:.0f} TFLOP/s, copy {c['copy_gbps']:.0f} GB/s"
    if p:
        peak = p.get("fp32_tflops") if dtype == "fp32" else p.get("tensor_fp16_bf16_tflops")
        if peak and p.get("dram_gbps"):
            return peak, p["dram_gbps"], f"datasheet peaks (not measured): {peak:.0f} TFLOP/s, {p['dram_gbps']:.0f} GB/s"
    return None, None, "no ceilings in the inputs (run flashattn --ceilings)"


def roofline_plot(res, style, path):
    stat = style.stat
    okr = [r for r in res.runs if rc.usable(r) and not rc.is_decode(r) and (r.get("throughput") or {}).get("bytes")
           and rc.tflops(r, stat) is not None]
    dtypes = sorted({r["dtype"] for r in okr}, key=lambda d: rc.DTYPE_ORDER.get(d, 9))
    if not okr:
        return None
    fig, axes = plt.subplots(1, len(dtypes), figsize=(max(6.0 * len(dtypes), 9.0), 5.6), squeeze=False)
    fig.suptitle("roofline: each run at its arithmetic intensity (FLOPs / minimum bytes moved)\n"
                 + subtitle_of(res, [], f"TFLOP/s from the {stat} time of each run"), fontsize=11)
    kernels = [k for k in res.kernels() if any(r["kernel"] == k for r in okr)]
    style.for_runs(okr)
    for ax, dtype in zip(axes[0], dtypes):
        rs = [r for r in okr if r["dtype"] == dtype]
        ai = [r["throughput"]["flops"] / r["throughput"]["bytes"] for r in rs]
        tf = [rc.tflops(r, stat) for r in rs]
        peak, bw, label = ceilings_for(res, dtype)
        lo, hi = min(ai) / 3, max(ai) * 3
        if peak and bw:
            ridge = peak * 1000 / bw
            lo, hi = min(lo, ridge / 10), max(hi, ridge * 3)
            xs = [lo, ridge, hi]
            ax.plot(xs, [min(peak, x * bw / 1000) for x in xs], color="black", linewidth=1.4)
            ax.annotate(f"compute {peak:.0f} TFLOP/s", (hi, peak), xytext=(-4, 4), textcoords="offset points",
                        ha="right", fontsize=8)
            x_bw = ridge / 3
            ax.annotate(f"memory {bw:.0f} GB/s", (x_bw, x_bw * bw / 1000), xytext=(8, -4), textcoords="offset points",
                        ha="left", va="top", fontsize=8)
        for r, x, y in zip(rs, ai, tf):
            st = style.line(r["kernel"], hollow=rc.check_state(r) == "unchecked")
            ax.plot([x], [y], linestyle="none", marker="o" if r["mode"] == "forward" else "^", markersize=6,
                    color=st["color"], markerfacecolor=st["markerfacecolor"], alpha=0.85)
        ax.set_xscale("log")
        log_y(ax)
        ax.set_xlim(lo, hi)
        ax.set_xlabel("arithmetic intensity (FLOP / byte)")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{dtype} — {label}", fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
    handles = [Line2D([], [], linestyle="none", marker="o", color=style.color[k],
                      markerfacecolor=style.line(k)["markerfacecolor"], label=style.label(k)) for k in kernels]
    handles += [Line2D([], [], linestyle="none", marker="o", color="gray", label="forward"),
                Line2D([], [], linestyle="none", marker="^", color="gray", label="backward"),
                Line2D([], [], color="black", label="ceiling: min(peak, bandwidth × intensity)")]
    ncol = min(len(handles), 5)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    rows = (len(handles) + ncol - 1) // ncol
    fig.tight_layout(rect=(0, (0.2 * rows + 0.15) / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def write_all(res, baseline, outdir, stat="median"):
    """Every plot; runs that failed --check and decode runs are left out."""
    os.makedirs(outdir, exist_ok=True)
    style = Style(res, stat)
    style.baseline = baseline
    written = []
    grid = [r for r in res.runs if not rc.is_decode(r) and (rc.usable(r) or not rc.ok(r))]
    dtypes = sorted({r["dtype"] for r in grid if rc.usable(r)}, key=lambda d: rc.DTYPE_ORDER.get(d, 9))
    for dtype in dtypes:
        runs = [r for r in grid if r.get("dtype") == dtype]
        for what in ("tflops", "speedup", "latency"):
            written.append(vs_s_plot(res, style, runs, dtype, os.path.join(outdir, f"{what}_{dtype}.png"), what))
        written.append(memory_plot(res, style, runs, dtype, os.path.join(outdir, f"memory_{dtype}.png")))
    written.append(roofline_plot(res, style, os.path.join(outdir, "roofline.png")))
    return [p for p in written if p]
