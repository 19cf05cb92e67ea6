"""The decode table of report.py: one block per decode point, a row per kernel, cold and hot side by
side, attention and step apart, and the ratios against each PyTorch backend like with like.

A decode run's "timing" is a whole step: for flashattn the update-cache kernel and the attention
(with its merge), for the PyTorch peers the slice-assign of the new rows into the cache and SDPA.
decode.attention holds the attention alone (flashattn: the cache already updated; PyTorch: SDPA
alone), with its own "timing". Cold (L2 flushed before every repetition) and hot runs of the same
point are separate runs (Results keeps both). Ratios: attention against PyTorch's attention, step
against PyTorch's step, cold against cold, hot against hot; never a step against an attention.
"""

from report_common import (DTYPE_ORDER, NOISE_MARK, UNCHECKED_MARK, check_state, decode_point_tag, fmt_ms, fmt_ratio,
                           is_decode, is_peer, marks, noise_missed, ok, ratio, shape, stat_ms, timing_mode, usable)

TIMING_MODES = ("cold", "hot")


def decode_runs(res):
    """The single-step decode runs (the --steps simulation has no attention-alone time)."""
    return [r for r in res.runs if is_decode(r) and not (r.get("decode") or {}).get("simulation")]


def attention_timing(r):
    """decode.attention.timing, or just its median where an older document has no timing object."""
    a = (r.get("decode") or {}).get("attention") or {}
    if a.get("timing"):
        return a["timing"]
    return {"median_ms": a["median_ms"]} if a.get("median_ms") else None


def point_key(r):
    s = shape(r)
    return (DTYPE_ORDER.get(r.get("dtype"), 9), str(r.get("dtype")), s.get("D") or 0, s.get("H_kv") or 0,
            s.get("H") or 0, s.get("B") or 0, decode_point_tag(r))


def shape_key(r):
    s = shape(r)
    return (r.get("dtype"),) + tuple(s.get(k) for k in ("B", "H", "H_kv", "D", "S_q", "S_k"))


def attach_by_shape(r, blocks):
    """A skipped or failed run carries no decode object (no KV length, no page size): it joins the
    one point of its shape measured, if there is exactly one."""
    match = [rs for rs in blocks.values() if any(x.get("decode") and shape_key(x) == shape_key(r) for x in rs)]
    if len(match) == 1:
        match[0].append(r)
    return len(match) == 1


def point_title(r):
    s, d = shape(r), r.get("decode") or {}
    L = d.get("kv_lengths") or {}
    kv = (f"{L['min']}–{L['max']}" if L.get("min") != L.get("max") else f"{L['max']}") if L.get("max") is not None \
        else f"≤ {d.get('S_max', s.get('S_k'))}"
    cache = f"{d.get('page_size')}-token pages" if d.get("paged") else "contiguous cache"
    heads = f"H{s.get('H')}" + (f"/{s.get('H_kv')}" if s.get("H_kv") != s.get("H") else "")
    return (f"**{r.get('dtype')} decode, B{s.get('B')} {heads} D{s.get('D')}, S_new = {d.get('S_new', s.get('S_q'))}, "
            f"KV length {kv}, {cache}**")


def time_cell(r, which, stat):
    """A time in ms with its marks; the run's status where it has no quotable time."""
    if r is None:
        return ""
    if not ok(r):
        return r.get("status", "?")
    if check_state(r) == "fail":
        return "FAIL"
    t = attention_timing(r) if which == "attention" else r.get("timing")
    ms = stat_ms(t, stat)
    return fmt_ms(ms) + marks(r, t) if ms else "–"


def kv_rate(r, stat, copy_gbps=None):
    """Attention GB/s from the <stat> time (kv_bytes / time), with the fraction of a measured copy:
    the run's own (--ceilings, --copy-gbps), else `copy_gbps` (a ceilings document read with it)."""
    d = r.get("decode") or {}
    ms = stat_ms(attention_timing(r), stat)
    if not usable(r) or not ms or not d.get("kv_bytes"):
        return "–"
    gbps = d["kv_bytes"] / (ms * 1e-3) / 1e9
    ref = d.get("bandwidth_reference") or {}
    copy = ref.get("gbps") if ref.get("kind") == "copy" and ref.get("gbps") else copy_gbps
    cell = f"{gbps:.0f}"
    if copy:
        cell += f" ({100 * gbps / copy:.1f} %)"
    return cell + marks(r, attention_timing(r))


def pair_ratio(by, kernel, peer, which, stat):
    """'cold / hot' ratios of peer time / kernel time for the attention or the step."""
    cells = []
    for tm in TIMING_MODES:
        r, p = by.get((kernel, tm)), by.get((peer, tm))
        x = None
        if r is not None and p is not None and usable(r) and usable(p):
            pick = attention_timing if which == "attention" else (lambda run: run.get("timing"))
            x = ratio(stat_ms(pick(p), stat), stat_ms(pick(r), stat))
        cells.append(fmt_ratio(x))
    return " / ".join(cells)


def block(runs, order, stat, copy_gbps=None):
    by = {}
    for r in runs:
        by[(r["kernel"], timing_mode(r))] = r
    kernels = sorted({r["kernel"] for r in runs}, key=lambda k: order.get(k, 1 << 20))
    peers = [k for k in kernels if is_peer(k) and any(usable(r) for r in runs if r["kernel"] == k)]

    def get(k, tm):
        return by.get((k, tm)) or by.get((k, None))  # a skipped run has no timing mode

    head = ["kernel", "splits", "attention cold ms", "attention hot ms", "step cold ms", "step hot ms",
            "attention GB/s cold (% of copy)"]
    for p in peers:
        head += [f"attention vs {p} (cold / hot)", f"step vs {p} (cold / hot)"]
    lines = [point_title(runs[0]), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in kernels:
        cold, hot = get(k, "cold"), get(k, "hot")
        any_run = cold or hot
        splits = (any_run.get("decode") or {}).get("splits") if any_run else None
        cells = [k, str(splits) if splits is not None and not is_peer(k) else "–",
                 time_cell(cold, "attention", stat), time_cell(hot, "attention", stat),
                 time_cell(cold, "step", stat), time_cell(hot, "step", stat),
                 kv_rate(cold, stat, copy_gbps) if cold is not None else ""]
        for p in peers:
            if p == k:
                cells += ["–", "–"]
            else:
                cells += [pair_ratio(by, k, p, "attention", stat), pair_ratio(by, k, p, "step", stat)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def decode_table(res, stat="median"):
    """The decode section (markdown), or '' when the inputs hold no decode runs."""
    runs = decode_runs(res)
    if not runs:
        return ""
    order = {k: i for i, k in enumerate(res.kernels())}
    blocks = {}
    for r in sorted(runs, key=lambda r: not r.get("decode")):  # measured runs first: they make the points
        if r.get("decode") or not attach_by_shape(r, blocks):
            blocks.setdefault(point_key(r), []).append(r)
    copy = (res.ceilings or {}).get("copy_gbps")
    out = [block(rs, order, stat, copy) for _, rs in sorted(blocks.items(), key=lambda kv: kv[0])]
    quoted = [r for r in runs if usable(r)]
    missed = sum(noise_missed(r.get("timing")) or noise_missed(attention_timing(r)) for r in quoted)
    unchecked = sum(check_state(r) == "unchecked" for r in quoted)
    failed = sum(ok(r) and check_state(r) == "fail" for r in runs)
    foot = (f"Decode: every time is the {stat} of the run's repetitions; × = {stat} time of the PyTorch backend / "
            f"{stat} time of the row's kernel (> 1: the row is faster), attention against PyTorch's attention (SDPA "
            "alone) and step against PyTorch's step (slice-assign of the new rows into the cache + SDPA; ours: the "
            "update-cache kernel + attention), cold against cold and hot against hot. **A speedup holds only in "
            "the mode (cold or hot) it is shown for**: cold runs flush L2 before every repetition, so they also pay "
            "for refilling it, hot runs read a cache L2 may still hold. GB/s = K and V bytes read / attention time; "
            "% of the copy rate measured by `--ceilings` (the run's own, else the ceilings file read with it). "
            f"{NOISE_MARK}: noise rule not met ({missed} of {len(quoted)} runs); {UNCHECKED_MARK}: not checked by "
            f"--check ({unchecked} of {len(quoted)} runs); FAIL: failed its check, not quoted "
            f"({failed} {'run' if failed == 1 else 'runs'}).")
    return "\n\n".join(out) + "\n\n" + foot + "\n"
