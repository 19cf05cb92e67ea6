#!/usr/bin/env python3
"""Time PyTorch SDPA's backends the way flashattn times its kernels, on the same problems.

    peers.py DATA_DIR [--mode forward|backward|both] [--backends flash,cudnn,efficient,math]
             [--causal] [--window L,R] [--scale X] [--dtype fp32|fp16|bf16] [--layout bhsd|bshd]
             [--warmup N] [--repeat N] [--max-noise PCT] [--max-time SEC] [--hot] [--check]
             [--json FILE|-]
    peers.py --sweep fa-grid|FILE.json [--dtype ...] [--mode ...] [--seed N] --json FILE.jsonl

Same inputs (read and rounded to the compute dtype exactly as scripts/reference.py does), same
timing method (CUDA events around each repetition after warm-up, L2 flushed between repetitions by
writing a buffer twice its size unless --hot, repetitions enqueued back to back in batches, at
least --repeat samples then more until the relative stddev is under --max-noise or --max-time is
spent, median reported), same FLOP convention (4 * D * visible pairs for the forward, 2.5x that
for the backward) and the same JSON schema as `flashattn --json`, so both appear in one table
(scripts/report.py). Each backend is run as `torch-<backend>`; a backend that refuses the problem
(dtype, mask, GQA, head dim, memory) is recorded as skipped with PyTorch's reason.

--sweep runs the grid of `flashattn --sweep` (fa-grid or a preset file, same precedence rules) on
inputs drawn from N(0, 1) on the device with a torch generator seeded by --seed (the same
distribution as flashattn's generated inputs, not the same values), and writes one session
document per point: JSON Lines when --json ends in .jsonl.

fp32 runs disable TF32 everywhere (the math backend then does cuBLAS SGEMM + softmax on CUDA
cores). Causal is bottom-right aligned as in flashattn (is_causal when S_q == S_k, else
torch.nn.attention.bias.causal_lower_right). Window, key padding and the additive mask are passed
as an explicit additive mask, which only some backends accept.
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
import types
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402  (data loading and rounding shared with the fp64 reference)

import numpy as np  # noqa: E402

BACKENDS = ("flash", "cudnn", "efficient", "math")
SCHEMA_VERSION = 1


def visible_pairs(p):
    """Visible (query, key) pairs summed over every head, counted in closed form per query row."""
    B, H, S_q, S_k = (p.dims[n] for n in ("B", "H", "S_q", "S_k"))
    i = np.arange(S_q, dtype=np.int64)
    diag = i + (S_k - S_q)
    wl, wr = p.window
    if p.causal:
        wr = 0 if wr < 0 else min(wr, 0)
    total = 0
    for b in range(B):
        length = S_k if p.seqlens is None else int(p.seqlens[b])
        lo = np.zeros_like(i) if wl < 0 else np.maximum(0, diag - wl)
        hi = np.full_like(i, length - 1) if wr < 0 else np.minimum(length - 1, diag + wr)
        total += int(np.clip(hi - lo + 1, 0, None).sum())
    return float(total) * H


def git_sha():
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_json(torch):
    if not torch.cuda.is_available():
        return {"present": False, "reason": "torch sees no CUDA device"}
    i = torch.cuda.current_device()
    pr = torch.cuda.get_device_properties(i)
    return {"present": True, "index": i, "name": pr.name, "sm_count": pr.multi_processor_count,
            "compute_capability": f"{pr.major}.{pr.minor}", "memory_bytes": pr.total_memory,
            "l2_bytes": getattr(pr, "L2_cache_size", None),
            "runtime_version": torch.version.cuda}


class Timer:
    """CUDA events around each repetition, L2 flushed in between (outside the events) unless hot,
    repetitions enqueued in batches of about 2 ms of GPU time; at least `min_samples`, then more
    until the relative stddev is at most `max_noise` (a fraction; <= 0: no rule) or `max_time`
    seconds were spent in the timed loop: the rule flashattn applies (src/timing.cpp)."""

    MAX_BATCH, BATCH_MS, MAX_SAMPLES = 32, 2.0, 10000

    def __init__(self, torch, warmup, min_samples, flush, max_noise=0.005, max_time=1.0):
        self.torch, self.warmup, self.min_samples, self.flush = torch, warmup, min_samples, flush
        self.max_noise, self.max_time = max_noise, max_time
        l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 64 << 20)
        self.buf = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device="cuda") if flush else None
        self.events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in range(self.MAX_BATCH)]
        self.clock_note = ""
        try:  # torch reads the SM clock through pynvml when it is installed
            torch.cuda.clock_rate()
        except Exception as e:  # noqa: BLE001 (any failure means: no clock readings)
            self.clock_note = f"SM clock not sampled: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    def stop_reason(self, n, noise, wall):
        if n >= self.MAX_SAMPLES:
            return "max_samples"
        if n < self.min_samples:
            return ""
        if self.max_noise <= 0:
            return "min_samples"
        if n >= 2 and noise <= self.max_noise:
            return "noise"
        if wall >= self.max_time:
            return "max_time"
        return ""

    def __call__(self, fn):
        t = self.torch
        for _ in range(self.warmup):
            if self.buf is not None:
                self.buf.zero_()
            fn()
        t.cuda.synchronize()
        samples, clocks, reason, batch = [], [], "", 1
        t0 = time.monotonic()
        wall = 0.0
        while not reason:
            b = min(batch, self.MAX_SAMPLES - len(samples))
            if len(samples) < self.min_samples:
                b = min(b, self.min_samples - len(samples))
            b = max(b, 1)
            for i in range(b):
                if self.buf is not None:
                    self.buf.zero_()
                self.events[i][0].record()
                fn()
                self.events[i][1].record()
            if not self.clock_note:
                clocks.append(t.cuda.clock_rate())  # while the batch runs
            self.events[b - 1][1].synchronize()
            samples += [self.events[i][0].elapsed_time(self.events[i][1]) for i in range(b)]
            wall = time.monotonic() - t0
            reason = self.stop_reason(len(samples), rel_stddev(samples), wall)
            batch = max(1, min(self.MAX_BATCH, int(self.BATCH_MS / max(sum(samples) / len(samples), 1e-3))))
        s = sorted(samples)
        n = len(s)
        mean = sum(s) / n
        noise = rel_stddev(samples) if n > 1 else 0.0
        rule = None if self.max_noise <= 0 else bool(n >= 2 and noise <= self.max_noise)
        clocks = [c for c in clocks if c and c > 0]
        throttled = (min(clocks) < 0.9 * clocks[0]) if clocks else None
        return {"unit": "ms", "clock": "cuda_events", "mode": "cold" if self.buf is not None else "hot",
                "warmup": self.warmup, "repeat": n, "min_samples": self.min_samples,
                "l2_flush": self.buf is not None,
                "median_ms": s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2]),
                "min_ms": s[0], "max_ms": s[-1], "mean_ms": mean, "rel_stddev": noise, "noise": noise,
                "max_noise": self.max_noise if self.max_noise > 0 else None,
                "max_time_s": self.max_time if self.max_noise > 0 else None,
                "noise_rule_met": rule, "stop_reason": reason, "wall_s": wall, "samples_ms": samples,
                "sm_clock_start_mhz": clocks[0] if clocks else None, "sm_clock_end_mhz": clocks[-1] if clocks else None,
                "sm_clock_samples": len(clocks), "sm_clock_min_mhz": min(clocks) if clocks else None,
                "sm_clock_max_mhz": max(clocks) if clocks else None,
                "sm_clock_mean_mhz": sum(clocks) / len(clocks) if clocks else None,
                "throttled": throttled, "throttle_reasons": []}


def rel_stddev(samples):
    n = len(samples)
    if n < 2:
        return math.inf
    mean = sum(samples) / n
    if mean <= 0:
        return math.inf
    return math.sqrt(sum((x - mean) ** 2 for x in samples) / (n - 1)) / mean


def timing_notes(timing, clock_note):
    notes = []
    if timing["noise_rule_met"] is False:
        notes.append(f"noise {100 * timing['noise']:.2f}% above --max-noise {100 * timing['max_noise']:.2f}% "
                     f"after {timing['repeat']} samples (stopped at {timing['stop_reason']})")
    if clock_note:
        notes.append(clock_note)
    elif timing["throttled"]:
        notes.append(f"throttled: SM clock {timing['sm_clock_start_mhz']} MHz at start, "
                     f"{timing['sm_clock_min_mhz']}..{timing['sm_clock_max_mhz']} MHz during timing")
    return notes


def build_inputs(torch, p, dtype, layout):
    """q, k, v, dO as torch tensors [B, H, S, D] (views of the stored layout), plus the mask args."""
    tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]

    def dev(x):  # x: float64 bhsd numpy (already rounded to dtype)
        if layout == "bshd":
            return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1, 3))).to("cuda", tdt).transpose(1, 2)
        return torch.from_numpy(np.ascontiguousarray(x)).to("cuda", tdt)

    q, k, v = dev(p.q), dev(p.k), dev(p.v)
    if p.dout is not None:
        dout = dev(p.dout)
    else:
        g = torch.Generator(device="cuda").manual_seed(0)
        dout = torch.randn(q.shape, generator=g, device="cuda", dtype=torch.float32).to(tdt)
    S_q, S_k = p.dims["S_q"], p.dims["S_k"]
    needs_explicit = p.mask is not None or p.seqlens is not None or p.window != (-1, -1)
    kwargs, note = {}, ""
    if needs_explicit:
        B, H = p.dims["B"], p.dims["H"]
        add = np.zeros((B, 1 if p.mask is None else H, S_q, S_k), dtype=np.float32)
        if p.mask is not None:
            add = add + p.mask.astype(np.float32)
        vis = np.stack([reference.visibility(p, b) for b in range(B)])[:, None]
        add = np.where(vis, add, -np.inf).astype(np.float32)
        kwargs["attn_mask"] = torch.from_numpy(add).to("cuda", tdt)
        note = "explicit additive mask"
    elif p.causal:
        if S_q == S_k:
            kwargs["is_causal"] = True
        else:
            from torch.nn.attention.bias import causal_lower_right
            kwargs["attn_mask"] = causal_lower_right(S_q, S_k)
    return q, k, v, dout, kwargs, note


def generated_inputs(torch, p, seed):
    """N(0, 1) q, k, v, dO on the device in the compute dtype (bhsd), for --sweep points."""
    tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[p.dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    B, H, H_kv, S_q, S_k, D = (p.dims[n] for n in ("B", "H", "H_kv", "S_q", "S_k", "D"))
    q = torch.randn((B, H, S_q, D), generator=g, device="cuda", dtype=tdt)
    k = torch.randn((B, H_kv, S_k, D), generator=g, device="cuda", dtype=tdt)
    v = torch.randn((B, H_kv, S_k, D), generator=g, device="cuda", dtype=tdt)
    dout = torch.randn((B, H, S_q, D), generator=g, device="cuda", dtype=tdt)
    kwargs = {}
    if p.causal:
        if S_q == S_k:
            kwargs["is_causal"] = True
        else:
            from torch.nn.attention.bias import causal_lower_right
            kwargs["attn_mask"] = causal_lower_right(S_q, S_k)
    return q, k, v, dout, kwargs, ""


def first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def run_backend(torch, name, p, timer, inputs, modes, ref):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]
    q, k, v, dout, kwargs, note = inputs
    gqa = p.dims["H"] != p.dims["H_kv"]
    if gqa:
        kwargs = dict(kwargs, enable_gqa=True)
    records = []
    base = {"kernel": f"torch-{name}", "gpu": True, "status": "ok", "reason": "", "notes": [note] if note else []}
    fwd_flops = 4.0 * p.dims["D"] * visible_pairs(p)
    es = {"fp32": 4, "fp16": 2, "bf16": 2}[p.dtype]
    qb = p.dims["B"] * p.dims["H"] * p.dims["S_q"] * p.dims["D"] * es
    kvb = p.dims["B"] * p.dims["H_kv"] * p.dims["S_k"] * p.dims["D"] * es
    lse_b = p.dims["B"] * p.dims["H"] * p.dims["S_q"] * 4
    with sdpa_kernel([backend]):
        try:  # one forward without autograd: does the backend take this problem at all?
            # A refusal raises below with its reason; PyTorch's per-backend "not used because"
            # warnings would only repeat it on stderr for every point of a sweep.
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                probe = F.scaled_dot_product_attention(q, k, v, scale=p.scale, **kwargs)
            torch.cuda.synchronize()
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
            torch.cuda.empty_cache()
            return [dict(base, mode=m, status="skipped", reason=f"PyTorch refused: {first_line(e)}") for m in modes]
        check = None
        if ref is not None:
            got = probe.float().cpu().numpy().astype(np.float64)
            want = ref["O"]
            err = np.abs(got - want)
            check = {"performed": True, "reference": "reference.py fp64",
                     "outputs": {"O": {"max_abs": float(err.max()) if err.size else 0.0,
                                       "rel_l2": float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))}}}
        del probe
        for mode in modes:
            try:
                if mode == "forward":
                    def fn():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(q, k, v, scale=p.scale, **kwargs)
                    flops, nbytes = fwd_flops, qb + 2 * kvb + qb + lse_b
                    inputs_b, outputs_b = qb + 2 * kvb, qb
                else:
                    # The graph of one forward (built only now, so the forward timing above ran
                    # without the memory it holds), differentiated again at every repetition.
                    qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
                    out = F.scaled_dot_product_attention(qq, kk, vv, scale=p.scale, **kwargs)

                    def fn():
                        torch.autograd.grad(out, (qq, kk, vv), dout, retain_graph=True)
                    flops, nbytes = 2.5 * fwd_flops, 3 * qb + 2 * kvb + lse_b + qb + 2 * kvb
                    inputs_b, outputs_b = 3 * qb + 2 * kvb + lse_b, qb + 2 * kvb
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                mem0 = torch.cuda.memory_allocated()
                timing = timer(fn)
            except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                fn = out = None
                torch.cuda.empty_cache()
                records.append(dict(base, mode=mode, status="skipped", reason=f"PyTorch refused: {first_line(e)}"))
                continue
            # What the call allocated at its peak beyond what existed before it: its outputs, then
            # workspace and intermediates (the S x S scores for the math backend).
            transient = torch.cuda.max_memory_allocated() - mem0
            extra = max(transient - outputs_b, 0)
            fn = out = None
            sec = timing["median_ms"] * 1e-3
            rec = dict(base, mode=mode, timing=timing,
                       notes=base["notes"] + timing_notes(timing, timer.clock_note),
                       throughput={"flops": flops, "tflops": flops / sec / 1e12, "bytes": nbytes,
                                   "gbps": nbytes / sec / 1e9, "peak_fraction": None},
                       memory={"inputs_bytes": inputs_b, "outputs_bytes": outputs_b, "workspace_bytes": None,
                               "extra_bytes": extra, "peak_bytes": inputs_b + outputs_b + extra,
                               "device_used_bytes": None},
                       check=check if mode == "forward" else None)
            records.append(rec)
    return records


def load_sweep(spec, cli):
    """The points of `flashattn --sweep` (src/sweep_grid.cpp): fa-grid or a preset file, with the
    same precedence (point, command line, file defaults, built-ins). Returns (name, points)."""
    fields = {"B", "H", "H_kv", "S", "S_q", "S_k", "D", "dtype", "causal", "mode", "modes", "kernels"}
    defaults = {}
    if spec == "fa-grid":
        name = "fa-grid"
        raw = [{"B": 16384 // S, "H": 2048 // D, "S": S, "D": D, "causal": c}
               for c in (False, True) for D in (64, 128) for S in (512, 1024, 2048, 4096, 8192, 16384)]
    else:
        try:
            with open(spec) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"peers.py: {spec}: {e}")
        if isinstance(doc, list):
            raw, name = doc, os.path.basename(spec)
        else:
            raw, defaults, name = doc.get("points", []), doc.get("defaults", {}), doc.get("name") or os.path.basename(spec)
    points = []
    for i, pt in enumerate(raw):
        where = f"{spec}: point {i + 1}"
        unknown = set(pt) - fields
        if unknown:
            raise SystemExit(f"peers.py: {where}: unknown field '{sorted(unknown)[0]}'")
        f = dict(defaults)
        if cli.get("dtype"):
            f["dtype"] = cli["dtype"]
        if cli.get("mode"):
            f["mode"] = cli["mode"]
            f.pop("modes", None)
        if cli.get("causal"):
            f["causal"] = True
        f.update(pt)
        if "modes" in pt:
            f.pop("mode", None)
        mode = f.get("modes", f.get("mode", "both"))
        modes = []
        for m in ([mode] if isinstance(mode, str) else mode):
            for x in (["forward", "backward"] if m == "both" else [m]):
                if x not in ("forward", "backward"):
                    raise SystemExit(f"peers.py: {where}: mode '{x}' is not forward, backward or both")
                if x not in modes:
                    modes.append(x)
        S_q = f.get("S_q", f.get("S"))
        S_k = f.get("S_k", f.get("S"))
        for dt in (f.get("dtype", "bf16") if isinstance(f.get("dtype", "bf16"), list) else [f.get("dtype", "bf16")]):
            for c in (f.get("causal", False) if isinstance(f.get("causal", False), list) else [f.get("causal", False)]):
                points.append({"B": f["B"], "H": f["H"], "H_kv": f.get("H_kv", f["H"]), "S_q": S_q, "S_k": S_k,
                               "D": f["D"], "dtype": dt, "causal": bool(c), "modes": modes})
    return name, points


def doc_header(torch, argv, data):
    return {"schema_version": SCHEMA_VERSION,
            "tool": {"name": "peers.py", "version": f"torch {torch.__version__}",
                     "cudnn": torch.backends.cudnn.version(), "git_sha": git_sha()},
            "device": device_json(torch),
            "command_line": " ".join([os.path.basename(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
            "started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "data": data}


def annotate(runs, p):
    shape = {n: p.dims[n] for n in ("B", "H", "H_kv", "S_q", "S_k", "D")}
    flags = {"causal": bool(p.causal), "window_left": p.window[0], "window_right": p.window[1],
             "scale": p.scale, "seqlens_k": p.seqlens is not None, "mask": p.mask is not None}
    for r in runs:
        r.update(shape=shape, dtype=p.dtype, layout=p.layout, flags=flags)


def print_runs(runs, out):
    for r in runs:
        if r["status"] == "ok":
            print(f"{r['kernel']:<16} {r['mode']:<8} {r['timing']['median_ms']:10.4f} ms "
                  f"{r['throughput']['tflops']:9.2f} TFLOP/s", file=out)
        else:
            print(f"{r['kernel']:<16} {r['mode']:<8} {r['status']}: {r['reason']}", file=out)


def write_json(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def run_sweep(torch, args, names, timer, argv):
    """One session document per point of the grid; inputs generated on the device from --seed."""
    cli = {"dtype": args.dtype, "mode": args.mode if args.mode_given else None, "causal": args.causal}
    grid, points = load_sweep(args.sweep, cli)
    jsonl = bool(args.json) and args.json.endswith(".jsonl")
    out = open(args.json, "w") if jsonl else None
    all_runs, t0 = [], time.monotonic()
    for i, pt in enumerate(points):
        p = types.SimpleNamespace(dims={k: pt[k] for k in ("B", "H", "H_kv", "S_q", "S_k", "D")},
                                  dtype=pt["dtype"], layout="bhsd", causal=pt["causal"], window=(-1, -1),
                                  scale=args.scale if args.scale else 1.0 / math.sqrt(pt["D"]),
                                  mask=None, seqlens=None)
        runs = []
        try:
            inputs = generated_inputs(torch, p, args.seed)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
            inputs = None
            runs = [{"kernel": f"torch-{b}", "mode": m, "gpu": True, "status": "skipped",
                     "reason": f"inputs do not fit: {first_line(e)}", "notes": []} for b in names for m in pt["modes"]]
        if inputs is not None:
            for b in names:
                runs += run_backend(torch, b, p, timer, inputs, pt["modes"], None)
            del inputs
        torch.cuda.empty_cache()
        annotate(runs, p)
        if jsonl:
            doc = doc_header(torch, argv, {"generated": "normal(0, 1)", "where": "device (torch.randn)", "seed": args.seed})
            doc.update(sweep={"name": grid, "point": i + 1, "points": len(points)}, runs=runs)
            out.write(json.dumps(doc) + "\n")
            out.flush()
        else:
            all_runs += runs
        elapsed = time.monotonic() - t0
        eta = elapsed * (len(points) - i - 1) / (i + 1)
        title = f"B{pt['B']} H{pt['H']} S{pt['S_q']} D{pt['D']} {pt['dtype']}" + (" causal" if pt["causal"] else "")
        summary = ", ".join(f"{r['kernel']} {r['mode'][:3]} " + (f"{r['timing']['median_ms']:.3g} ms" if r["status"] == "ok"
                                                              else r["status"]) for r in runs)
        print(f"[{i + 1}/{len(points)}] {title}: {summary} | {elapsed:.0f}s elapsed, ETA {eta:.0f}s", file=sys.stderr)
    if out:
        out.close()
    elif args.json:
        doc = doc_header(torch, argv, {"generated": "normal(0, 1)", "where": "device (torch.randn)", "seed": args.seed})
        doc.update(sweep={"name": grid, "points": len(points)}, runs=all_runs)
        if args.json == "-":
            print(json.dumps(doc, indent=2))
        else:
            write_json(args.json, json.dumps(doc, indent=2))
    else:
        print_runs(all_runs, sys.stdout)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("data_dir", metavar="DATA_DIR", nargs="?")
    ap.add_argument("--sweep", default=None, metavar="fa-grid|FILE.json",
                    help="run a grid of generated problems instead of DATA_DIR")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (--sweep)")
    ap.add_argument("--mode", choices=("forward", "backward", "both", "decode"), default=None,
                    help="decode: a decode data directory (scripts/peers_decode.py; the default for one)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma list of " + ", ".join(BACKENDS))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", type=reference.parse_window, default=None, metavar="L,R")
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default=None)
    ap.add_argument("--layout", choices=("bhsd", "bshd"), default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", "--min-samples", type=int, default=20, dest="repeat",
                    help="timed repetitions, at least (default 20)")
    ap.add_argument("--max-noise", type=float, default=0.5, metavar="PCT",
                    help="then repeat until the relative stddev is at most PCT percent (0: off; default 0.5)")
    ap.add_argument("--max-time", type=float, default=1.0, metavar="SEC",
                    help="...or until SEC seconds were spent in the timed loop (default 1)")
    ap.add_argument("--no-flush", "--hot", action="store_true", dest="no_flush",
                    help="no L2 flush between repetitions (hot timing)")
    ap.add_argument("--check", action="store_true", help="also report each backend's forward error vs fp64")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the JSON here (- for stdout; .jsonl: one line per point)")
    ap.add_argument("--copy-gbps", type=float, default=None, metavar="X",
                    help="decode: the measured copy rate (flashattn --ceilings), for the bandwidth fraction")
    args = ap.parse_args(argv)
    args.mode_given = args.mode is not None
    if args.mode is None:
        args.mode = "forward"
    if (args.data_dir is None) == (args.sweep is None):
        ap.error("give a DATA_DIR or --sweep (not both)")
    if args.sweep and (args.check or args.window or args.layout):
        ap.error("--check, --window and --layout need a DATA_DIR")
    if args.repeat < 1 or args.warmup < 0 or not 0 <= args.max_noise < 100 or args.max_time <= 0:
        ap.error("--repeat >= 1, --warmup >= 0, --max-noise in [0, 100), --max-time > 0")

    try:
        import torch
    except ImportError:
        print("peers.py: PyTorch is not importable", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("peers.py: PyTorch sees no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in names:
        if b not in BACKENDS:
            print(f"peers.py: --backends: unknown backend '{b}'", file=sys.stderr)
            return 2
    timer = Timer(torch, args.warmup, args.repeat, not args.no_flush, args.max_noise / 100.0, args.max_time)
    if args.data_dir and (args.mode == "decode" or
                          any(os.path.isfile(os.path.join(args.data_dir, "K_cache" + e)) for e in (".npy", ".bin"))):
        sys.modules.setdefault("peers", sys.modules[__name__])  # one module for peers_decode's helpers
        import peers_decode
        return peers_decode.run(torch, args, names, timer, argv, sys.modules[__name__])
    if args.sweep:
        return run_sweep(torch, args, names, timer, argv)

    settings = reference.Settings()
    settings.causal = args.causal
    settings.window = args.window or (-1, -1)
    settings.scale = args.scale
    rargs = types.SimpleNamespace(layout=args.layout, dtype=args.dtype, causal=None, window=None, scale=None)
    try:
        p = reference.Problem(args.data_dir, args.data_dir, rargs, settings)
    except reference.BadInput as e:
        print(f"peers.py: {e}", file=sys.stderr)
        return 2
    if p.dtype == "fp64":
        p.dtype = "fp32"
    modes = ["forward", "backward"] if args.mode == "both" else [args.mode]
    ref = None
    if args.check:
        ref = reference.compute(p, reference.make_ops(True, True), True, False)

    inputs = build_inputs(torch, p, p.dtype, p.layout)
    runs = []
    for b in names:
        runs += run_backend(torch, b, p, timer, inputs, modes, ref)
    annotate(runs, p)
    doc = doc_header(torch, argv, {"dir": args.data_dir, "input_dtype": p.stored_dtype})
    doc["runs"] = runs
    text = json.dumps(doc, indent=2)
    if args.json == "-":
        print(text)
    else:
        if args.json:
            write_json(args.json, text)
        print_runs(runs, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
