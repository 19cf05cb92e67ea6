"""What report.py, report_plots.py and report_decode.py share: reading result files, the keys runs
are grouped by, and the rules every table and plot applies the same way.

The rules (README "Sweeps, reports and profiling"):
  - one statistic (--stat: median or min) on both sides of every ratio and behind every TFLOP/s
    and GB/s figure: ratio = baseline's <stat> time / kernel's <stat> time;
  - a run whose timing.noise_rule_met is false (ours or a peer) carries NOISE_MARK;
  - a run that failed --check (check.passed false) or did not run (status failed) is never quoted,
    plotted, or used in a ratio; a run that was not checked carries UNCHECKED_MARK.
"""

import json
import os
import re

DTYPE_ORDER = {"bf16": 0, "fp16": 1, "fp32": 2, "fp64": 3}
PEER_ORDER = ["torch-flash", "torch-cudnn", "torch-efficient", "torch-math"]
STATS = ("median", "min")
NOISE_MARK, UNCHECKED_MARK = "*", "†"


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
    """Every run of the inputs (deduplicated), with what the documents say about the machine.

    Runs are keyed by (problem, mode, kernel), where the problem includes the timing mode when it is
    not the default cold one, and always for decode: a hot run never replaces a cold one. When the
    same key is read twice, the last measurement read wins."""

    def __init__(self, paths):
        self.runs, self.ceilings, self.peaks, self.devices, self.memory_bytes = [], None, None, [], None
        self.dates = []
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
                day = str(doc.get("started_at") or "")[:10]
                if day and day not in self.dates:
                    self.dates.append(day)
                for r in doc.get("runs", []):
                    # Only the file's base name is kept: nothing written may hold a machine's paths.
                    r = dict(r, _source=os.path.basename(path), _device=dev.get("name", ""))
                    key = (problem_key(r), r.get("mode"), r.get("kernel"))
                    if key in seen:
                        self.runs[seen[key]] = r
                    else:
                        seen[key] = len(self.runs)
                        self.runs.append(r)
        self.dates.sort()
        self.quadratic = quadratic_kernels(self.runs)

    def kernels(self):
        """Kernel names: ours in order of appearance, then the PyTorch backends."""
        names = []
        for r in self.runs:
            if r["kernel"] not in names:
                names.append(r["kernel"])
        peers = [k for k in PEER_ORDER if k in names] + sorted(k for k in names if is_peer(k) and k not in PEER_ORDER)
        return [k for k in names if not is_peer(k)] + peers

    def has_ok(self, kernel, dtype=None):
        """Whether the kernel has a quotable run (measured, not failed), in this dtype if given."""
        return any(r["kernel"] == kernel and usable(r) and (dtype is None or r.get("dtype") == dtype)
                   for r in self.runs)


# ---- what a run is ------------------------------------------------------------------------------

def is_peer(kernel):
    return kernel.startswith("torch-")


def is_decode(r):
    return r.get("mode") == "decode"


def ok(r):
    """Measured: status ok with a time (it may still have failed its check)."""
    return r.get("status") == "ok" and bool((r.get("timing") or {}).get("median_ms"))


def check_state(r):
    """'ok', 'fail' or 'unchecked' (check null, not performed, or without a verdict)."""
    c = r.get("check")
    if not c or not c.get("performed") or c.get("passed") is None:
        return "unchecked"
    return "ok" if c["passed"] else "fail"


def usable(r):
    """Measured and not failed: the only runs quoted, plotted or used in a ratio."""
    return ok(r) and check_state(r) != "fail"


def noise_missed(timing):
    return (timing or {}).get("noise_rule_met") is False


def marks(r, timing=None):
    """The marks after a quoted number: NOISE_MARK (rule not met), UNCHECKED_MARK (not checked)."""
    t = r.get("timing") if timing is None else timing
    return (NOISE_MARK if noise_missed(t) else "") + (UNCHECKED_MARK if check_state(r) == "unchecked" else "")


def stat_ms(timing, stat):
    """The timing's <stat> time in ms (None where it was not recorded)."""
    v = (timing or {}).get(f"{stat}_ms")
    return v if v else None


def run_ms(r, stat):
    return stat_ms(r.get("timing"), stat)


def tflops(r, stat):
    """TFLOP/s from the run's <stat> time (the JSON's throughput.tflops is from the median)."""
    th, ms = r.get("throughput") or {}, run_ms(r, stat)
    if not ms:
        return None
    if th.get("flops"):
        return th["flops"] / (ms * 1e-3) / 1e12
    med = run_ms(r, "median")
    return th["tflops"] * med / ms if th.get("tflops") is not None and med else None


def ratio(base_ms, ms):
    return base_ms / ms if base_ms and ms else None


def fmt_ratio(x):
    return f"{x:.2f}×" if x is not None else "–"


def stat_words(stat):
    return "median" if stat == "median" else "min"


# ---- keys and labels --------------------------------------------------------------------------------

def shape(r):
    return r.get("shape") or {}


def timing_mode(r):
    return (r.get("timing") or {}).get("mode")


def decode_point_tag(r):
    """The decode point without the timing mode: S_new, KV length, page size, steps."""
    d, s = r.get("decode") or {}, shape(r)
    L = d.get("kv_lengths") or {}
    tag = f" S_new{d.get('S_new', s.get('S_q'))}"
    if L.get("min") is not None and L.get("min") != L.get("max"):
        tag += f" KV{L['min']}-{L['max']}"
    elif L.get("max") is not None:
        tag += f" KV{L['max']}"
    else:
        tag += f" S_max{d.get('S_max', s.get('S_k'))}"
    if d.get("paged"):
        tag += f" paged{d.get('page_size')}"
    if d.get("simulation"):
        tag += f" steps{(d['simulation'] or {}).get('steps')}"
    return tag


def problem_key(r):
    s, f = shape(r), r.get("flags") or {}
    tag = f"B{s.get('B')} H{s.get('H')}"
    if s.get("H_kv") != s.get("H"):
        tag += f"/{s.get('H_kv')}"
    if is_decode(r):
        tag += decode_point_tag(r) + f" D{s.get('D')} {r.get('dtype')}"
        return tag + (f" {timing_mode(r)}" if timing_mode(r) else "")
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
    if timing_mode(r) == "hot":
        tag += " hot"
    return tag


def sort_key(r):
    s, f = shape(r), r.get("flags") or {}
    return (is_decode(r), DTYPE_ORDER.get(r.get("dtype"), 9), s.get("D") or 0, bool(f.get("causal")),
            s.get("S_k") or 0, s.get("S_q") or 0, s.get("B") or 0, s.get("H") or 0, problem_key(r))


def quadratic_kernels(runs):
    """Kernels whose extra memory holds the S_q x S_k scores: at least one byte per score element
    (fp32 S alone is 4) at their largest problem, where flash kernels need ~4/S_k (the lse)."""
    best = {}
    for r in runs:
        mem, s = r.get("memory") or {}, shape(r)
        if not ok(r) or is_decode(r) or mem.get("extra_bytes") is None or not s.get("S_k"):
            continue
        scores = s["B"] * s["H"] * s["S_q"] * s["S_k"]
        if r["kernel"] not in best or scores > best[r["kernel"]][0]:
            best[r["kernel"]] = (scores, mem["extra_bytes"] / scores)
    return {k for k, (_, per) in best.items() if per >= 1.0}


def s_label(S):
    return f"{S // 1024}k" if S >= 1024 and S % 1024 == 0 else str(S)


def human_bytes(b):
    if not b:  # not measured (host kernels)
        return "–"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:.1f} {unit}" if b / div < 100 else f"{b / div:.0f} {unit}"
    return f"{b} B"


def fmt_ms(ms):
    if ms is None:
        return "–"
    return f"{ms:.3f}" if ms >= 1 else f"{ms:.4f}"


_ABS_PATH = re.compile(r"(?<![\w.~-])/(?:[^\s/:;,'\"()]+/)+([^\s/:;,'\"()]+)")


def no_abs_paths(text):
    """Absolute paths in free text (a reason from the tool) reduced to their base names."""
    return _ABS_PATH.sub(lambda m: m.group(1), str(text))


def short(text, n=70):
    text = " ".join(no_abs_paths(text).split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"
