#!/usr/bin/env python3
"""Time PyTorch SDPA's backends on a flashattn data directory, the way flashattn times its kernels.

    peers.py DATA_DIR [--mode forward|backward|both] [--backends flash,cudnn,efficient,math]
             [--causal] [--window L,R] [--scale X] [--dtype fp32|fp16|bf16] [--layout bhsd|bshd]
             [--warmup N] [--repeat N] [--no-flush] [--check] [--json FILE|-]

Same inputs (read and rounded to the compute dtype exactly as scripts/reference.py does), same
timing method (CUDA events around each repetition after warm-up, L2 flushed between repetitions by
writing a buffer twice its size, median reported), same FLOP convention (4 * D * visible pairs for
the forward, 2.5x that for the backward) and the same JSON schema as `flashattn --json`, so both
appear in one table (scripts/report.py). Each backend is run as `torch-<backend>`; a backend that
refuses the problem (dtype, mask, GQA, head dim) is recorded as skipped with PyTorch's reason.

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
import types

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
    """CUDA events around each repetition, L2 flushed in between (outside the events)."""

    def __init__(self, torch, warmup, repeat, flush):
        self.torch, self.warmup, self.repeat, self.flush = torch, warmup, repeat, flush
        l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 64 << 20)
        self.buf = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device="cuda") if flush else None

    def __call__(self, fn):
        t = self.torch
        for _ in range(self.warmup):
            if self.buf is not None:
                self.buf.zero_()
            fn()
        t.cuda.synchronize()
        samples = []
        start, stop = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        for _ in range(self.repeat):
            if self.buf is not None:
                self.buf.zero_()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop))
        s = sorted(samples)
        n = len(s)
        mean = sum(s) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in s) / (n - 1)) if n > 1 else 0.0
        return {"unit": "ms", "clock": "cuda_events", "warmup": self.warmup, "repeat": n,
                "l2_flush": self.buf is not None, "median_ms": s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2]),
                "min_ms": s[0], "max_ms": s[-1], "mean_ms": mean, "rel_stddev": sd / mean if mean else 0.0,
                "samples_ms": samples}


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


def run_backend(torch, name, p, args, timer, inputs, modes, ref):
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
        try:
            qq, kk, vv = (t.detach().requires_grad_("backward" in modes) for t in (q, k, v))
            out = F.scaled_dot_product_attention(qq, kk, vv, scale=p.scale, **kwargs)
            torch.cuda.synchronize()
        except RuntimeError as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return [dict(base, mode=m, status="skipped", reason=f"PyTorch refused: {reason}") for m in modes]
        check = None
        if ref is not None:
            got = out.detach().float().cpu().numpy().astype(np.float64)
            want = ref["O"]
            err = np.abs(got - want)
            check = {"performed": True, "reference": "reference.py fp64",
                     "outputs": {"O": {"max_abs": float(err.max()) if err.size else 0.0,
                                       "rel_l2": float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))}}}
        for mode in modes:
            torch.cuda.reset_peak_memory_stats()
            mem0 = torch.cuda.memory_allocated()
            if mode == "forward":
                def fn():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, scale=p.scale, **kwargs)
                flops, nbytes = fwd_flops, qb + 2 * kvb + qb + lse_b
            else:
                def fn():
                    torch.autograd.grad(out, (qq, kk, vv), dout, retain_graph=True)
                flops, nbytes = 2.5 * fwd_flops, 3 * qb + 2 * kvb + lse_b + qb + 2 * kvb
            try:
                timing = timer(fn)
            except RuntimeError as e:
                records.append(dict(base, mode=mode, status="skipped", reason=f"PyTorch refused: {str(e).splitlines()[0]}"))
                continue
            sec = timing["median_ms"] * 1e-3
            rec = dict(base, mode=mode, timing=timing,
                       throughput={"flops": flops, "tflops": flops / sec / 1e12, "bytes": nbytes,
                                   "gbps": nbytes / sec / 1e9, "peak_fraction": None},
                       memory={"peak_bytes": torch.cuda.max_memory_allocated() - mem0 + (qb + 2 * kvb)},
                       check=check if mode == "forward" else None)
            records.append(rec)
    return records


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("data_dir", metavar="DATA_DIR")
    ap.add_argument("--mode", choices=("forward", "backward", "both"), default="forward")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma list of " + ", ".join(BACKENDS))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", type=reference.parse_window, default=None, metavar="L,R")
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default=None)
    ap.add_argument("--layout", choices=("bhsd", "bshd"), default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--no-flush", action="store_true")
    ap.add_argument("--check", action="store_true", help="also report each backend's forward error vs fp64")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the JSON here (- for stdout)")
    args = ap.parse_args(argv)

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

    timer = Timer(torch, args.warmup, args.repeat, not args.no_flush)
    inputs = build_inputs(torch, p, p.dtype, p.layout)
    runs = []
    for b in names:
        runs += run_backend(torch, b, p, args, timer, inputs, modes, ref)
    shape = {n: p.dims[n] for n in ("B", "H", "H_kv", "S_q", "S_k", "D")}
    flags = {"causal": bool(p.causal), "window_left": p.window[0], "window_right": p.window[1],
             "scale": p.scale, "seqlens_k": p.seqlens is not None, "mask": p.mask is not None}
    for r in runs:
        r.update(shape=shape, dtype=p.dtype, layout=p.layout, flags=flags)
    doc = {"schema_version": SCHEMA_VERSION,
           "tool": {"name": "peers.py", "version": f"torch {torch.__version__}",
                    "cudnn": torch.backends.cudnn.version(), "git_sha": git_sha()},
           "device": device_json(torch),
           "command_line": " ".join([os.path.basename(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
           "started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "data": {"dir": args.data_dir, "input_dtype": p.stored_dtype},
           "runs": runs}
    text = json.dumps(doc, indent=2)
    if args.json == "-":
        print(text)
    else:
        if args.json:
            tmp = f"{args.json}.tmp.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(text + "\n")
            os.replace(tmp, args.json)
        for r in runs:
            if r["status"] == "ok":
                print(f"{r['kernel']:<16} {r['mode']:<8} {r['timing']['median_ms']:10.4f} ms "
                      f"{r['throughput']['tflops']:9.2f} TFLOP/s")
            else:
                print(f"{r['kernel']:<16} {r['mode']:<8} {r['status']}: {r['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
