#!/usr/bin/env python3
"""Time PyTorch SDPA's backends the way flashattn times its kernels, on the same problems.

    peers.py DATA_DIR [--mode forward|backward|both] [--backends flash,cudnn,efficient,math]
             [--causal] [--window L,R] [--scale X] [--dtype fp32|fp16|bf16] [--layout bhsd|bshd]
             [--warmup N] [--repeat N] [--max-noise PCT] [--max-time SEC] [--hot] [--no-check]
             [--seed N] [--capi PATH] [--json FILE|-]
    peers.py --sweep fa-grid|FILE.json [--dtype ...] [--mode ...] [--seed N] --json FILE.jsonl
    peers.py DECODE_DIR ...                          (scripts/peers_decode.py)

Same method as flashattn, through flashattn's own code (libflashattn_capi, include/flashattn/capi.h;
found by --capi PATH, else $FLASHATTN_CAPI, else $FLASHATTN_BUILD_DIR, build-gpu/, build/):

  timing  CUDA events around each repetition; the repetitions of a batch are enqueued behind a
          stream hold that the host releases once the whole batch is enqueued, so no host time
          (Python, PyTorch's dispatch) falls inside the events; L2 flushed between repetitions
          (write one buffer, then read another, each twice the L2 size) unless --hot; at least
          --repeat samples, then more until the relative stddev is under --max-noise or --max-time
          is spent; median and min reported ("method": "held_stream"; scripts/peers_timing.py)
  checks  before timing, each backend's outputs (forward: O; backward: dQ, dK, dV) are checked by
          flashattn's validator: fp64 reference and same-dtype naive baseline on the rows --seed
          samples, the same rules as --check; the run's "check" object is flashattn's
          (scripts/peers_check.py). A failed check is recorded with its timing and a note, and
          the exit status is 3. --no-check skips the checks ("check": null)
  inputs  --sweep points: flashattn's device generator with --seed (tensor ids Q 1, K 2, V 3,
          dO 4), the same values as `flashattn --sweep --seed N`. A DATA_DIR's files, read and
          rounded to the compute dtype as scripts/reference.py does; a dO the directory lacks is
          drawn by that generator (tensor 4 of --seed), which is not the dO `flashattn --data`
          draws for itself: give the directory a dO (flashattn-gen --with-dO) to compare backwards

Same FLOP convention (4 * D * visible pairs for the forward, 2.5x that for the backward) and the
same JSON schema as `flashattn --json`, so both appear in one table (scripts/report.py). Each
backend is run as `torch-<backend>`; a backend that refuses the problem (dtype, mask, GQA, head
dim, memory) is recorded as skipped with PyTorch's reason.

--sweep runs the grid of `flashattn --sweep` (fa-grid or a preset file, same precedence rules) and
writes one session document per point: JSON Lines when --json ends in .jsonl.

fp32 runs disable TF32 everywhere (the math backend then does cuBLAS SGEMM + softmax on CUDA
cores). Causal is bottom-right aligned as in flashattn (is_causal when S_q == S_k, else
torch.nn.attention.bias.causal_lower_right). Window, key padding and the additive mask are passed
as an explicit additive mask in the compute dtype, which only some backends accept (fp16 / bf16
round the mask's values; the check, which holds the float32 mask, counts that as the peer's error).

Exit status: 0 ok, 1 a run failed, 2 bad usage or input (or no libflashattn_capi), 3 a check failed.
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
import peers_capi  # noqa: E402
import reference  # noqa: E402  (data loading and rounding shared with the fp64 reference)
from peers_check import check_notes, check_outputs  # noqa: E402
from peers_timing import HoldTimedOut, Timer, timing_notes  # noqa: E402

import numpy as np  # noqa: E402

BACKENDS = ("flash", "cudnn", "efficient", "math")
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}
SCHEMA_VERSION = 1
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CHECK = 0, 1, 2, 3


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


def torch_dtype(torch, dtype):
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def current_stream(torch):
    return torch.cuda.current_stream().cuda_stream


def causal_kwargs(p):
    """SDPA's causal arguments, bottom-right aligned as in flashattn."""
    S_q, S_k = p.dims["S_q"], p.dims["S_k"]
    if not p.causal:
        return {}
    if S_q == S_k:
        return {"is_causal": True}
    from torch.nn.attention.bias import causal_lower_right
    return {"attn_mask": causal_lower_right(S_q, S_k)}


def generate(torch, capi, name, shape, dtype, seed):
    """A device tensor filled by flashattn's generator as tensor `name` (Q, K, V, dO) of its sweeps."""
    t = torch.empty(shape, dtype=torch_dtype(torch, dtype), device="cuda")
    capi.fill_normal(t.data_ptr(), dtype, t.numel(), seed, peers_capi.TENSOR_IDS[name], current_stream(torch))
    return t


def data_inputs(torch, capi, p, modes, seed):
    """A data directory's q, k, v (and dO) as torch tensors [B, H, S, D] (views of the stored
    layout), the mask arguments, a note, and `host` (the checks' copies, filled on use)."""
    tdt = torch_dtype(torch, p.dtype)

    def dev(x):  # x: float64 bhsd numpy (already rounded to dtype)
        if p.layout == "bshd":
            return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1, 3))).to("cuda", tdt).transpose(1, 2)
        return torch.from_numpy(np.ascontiguousarray(x)).to("cuda", tdt)

    q, k, v = dev(p.q), dev(p.k), dev(p.v)
    dout = None
    if p.dout is not None:
        dout = dev(p.dout)
    elif "backward" in modes:
        dout = generate(torch, capi, "dO", tuple(q.shape), p.dtype, seed)
    S_q, S_k = p.dims["S_q"], p.dims["S_k"]
    kwargs, note = causal_kwargs(p), ""
    if p.mask is not None or p.seqlens is not None or p.window != (-1, -1):
        B, H = p.dims["B"], p.dims["H"]
        add = np.zeros((B, 1 if p.mask is None else H, S_q, S_k), dtype=np.float32)
        if p.mask is not None:
            add = add + p.mask.astype(np.float32)
        vis = np.stack([reference.visibility(p, b) for b in range(B)])[:, None]
        add = np.where(vis, add, -np.inf).astype(np.float32)
        kwargs, note = {"attn_mask": torch.from_numpy(add).to("cuda", tdt)}, "explicit additive mask"
    return types.SimpleNamespace(q=q, k=k, v=v, dout=dout, kwargs=kwargs, note=note, host={})


def generated_inputs(torch, capi, p, modes, seed):
    """q, k, v (and dO) of a --sweep point from flashattn's device generator: the values of
    `flashattn --sweep --seed N` (bhsd, compute dtype)."""
    B, H, H_kv, S_q, S_k, D = (p.dims[n] for n in ("B", "H", "H_kv", "S_q", "S_k", "D"))
    q = generate(torch, capi, "Q", (B, H, S_q, D), p.dtype, seed)
    k = generate(torch, capi, "K", (B, H_kv, S_k, D), p.dtype, seed)
    v = generate(torch, capi, "V", (B, H_kv, S_k, D), p.dtype, seed)
    dout = generate(torch, capi, "dO", (B, H, S_q, D), p.dtype, seed) if "backward" in modes else None
    return types.SimpleNamespace(q=q, k=k, v=v, dout=dout, kwargs=causal_kwargs(p), note="", host={})


def first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def costs(p):
    """Per mode: FLOPs, bytes moved, and the bytes of the inputs and of the outputs."""
    es = {"fp32": 4, "fp16": 2, "bf16": 2}[p.dtype]
    qb = p.dims["B"] * p.dims["H"] * p.dims["S_q"] * p.dims["D"] * es
    kvb = p.dims["B"] * p.dims["H_kv"] * p.dims["S_k"] * p.dims["D"] * es
    lse_b = p.dims["B"] * p.dims["H"] * p.dims["S_q"] * 4
    fwd_flops = 4.0 * p.dims["D"] * visible_pairs(p)
    return {"forward": {"flops": fwd_flops, "bytes": qb + 2 * kvb + qb + lse_b, "inputs": qb + 2 * kvb,
                        "outputs": qb},
            "backward": {"flops": 2.5 * fwd_flops, "bytes": 3 * qb + 2 * kvb + lse_b + qb + 2 * kvb,
                         "inputs": 3 * qb + 2 * kvb + lse_b, "outputs": qb + 2 * kvb}}


def unrun(kernel, mode, status, reason):
    return {"kernel": kernel, "mode": mode, "gpu": True, "status": status, "reason": reason, "notes": []}


def run_backend(torch, name, p, ctx, inputs, modes):
    """One record per mode for SDPA backend `name`. ctx: timer, capi, check (bool), seed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    kernel = f"torch-{name}"
    kwargs = dict(inputs.kwargs, enable_gqa=True) if p.dims["H"] != p.dims["H_kv"] else inputs.kwargs
    with sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[name])]):
        try:  # one forward without autograd: does the backend take this problem at all?
            # A refusal raises below with its reason; PyTorch's per-backend "not used because"
            # warnings would only repeat it on stderr for every point of a sweep.
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                F.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v, scale=p.scale, **kwargs)
            torch.cuda.synchronize()
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
            torch.cuda.empty_cache()
            return [unrun(kernel, m, "skipped", f"PyTorch refused: {first_line(e)}") for m in modes]
        return [run_mode(torch, F, p, ctx, inputs, kwargs, kernel, m) for m in modes]


def mode_call(torch, F, p, inputs, kwargs, mode):
    """fn() for one mode, returning its outputs by name: forward O, backward dQ, dK, dV."""
    q, k, v = inputs.q, inputs.k, inputs.v
    if mode == "forward":
        def forward():
            with torch.no_grad():
                return {"O": F.scaled_dot_product_attention(q, k, v, scale=p.scale, **kwargs)}
        return forward
    # The graph of one forward (built only now, so the forward timing ran without the memory it
    # holds), differentiated again at every repetition.
    qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qq, kk, vv, scale=p.scale, **kwargs)

    def backward():
        return dict(zip(("dQ", "dK", "dV"), torch.autograd.grad(out, (qq, kk, vv), inputs.dout, retain_graph=True)))
    return backward


def run_mode(torch, F, p, ctx, inputs, kwargs, kernel, mode):
    """One mode's record: the call run once and its outputs checked (unless --no-check), then timed."""
    check = None
    try:
        fn = mode_call(torch, F, p, inputs, kwargs, mode)
        if ctx.check:
            check = check_outputs(ctx.capi, torch, p, mode, ctx.seed, inputs, fn())
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        mem0 = torch.cuda.memory_allocated()
        timing = ctx.timer(fn)
    except HoldTimedOut as e:
        return unrun(kernel, mode, "failed", str(e))
    except peers_capi.CApiError as e:
        return unrun(kernel, mode, "failed", f"libflashattn_capi: {e}")
    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
        fn = None
        torch.cuda.empty_cache()
        return unrun(kernel, mode, "skipped", f"PyTorch refused: {first_line(e)}")
    # What the call allocated at its peak beyond what existed before it: its outputs, then
    # workspace and intermediates (the S x S scores for the math backend).
    transient = torch.cuda.max_memory_allocated() - mem0
    fn = None
    c = costs(p)[mode]
    extra = max(transient - c["outputs"], 0)
    sec = timing["median_ms"] * 1e-3
    rec = unrun(kernel, mode, "ok", "")
    rec.update(timing=timing, notes=([inputs.note] if inputs.note else []) + timing_notes(timing, ctx.timer.clock_note)
               + check_notes(check),
               throughput={"flops": c["flops"], "tflops": c["flops"] / sec / 1e12, "bytes": c["bytes"],
                           "gbps": c["bytes"] / sec / 1e9, "peak_fraction": None},
               memory={"inputs_bytes": c["inputs"], "outputs_bytes": c["outputs"], "workspace_bytes": None,
                       "extra_bytes": extra, "peak_bytes": c["inputs"] + c["outputs"] + extra,
                       "device_used_bytes": None},
               check=check)
    return rec


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


def check_failed(r):
    c = r.get("check")
    return isinstance(c, dict) and bool(c.get("performed")) and not c.get("passed")


def exit_status(runs):
    if any(r["status"] == "failed" for r in runs):
        return EXIT_FAILED
    return EXIT_CHECK if any(check_failed(r) for r in runs) else EXIT_OK


def generated_data(seed):
    return {"generated": "normal(0, 1)", "where": "device (flashattn generator)", "seed": seed}


def sweep_point(torch, p, modes, names, ctx):
    """The runs of one --sweep point: every backend and mode on the point's generated inputs."""
    try:
        inputs = generated_inputs(torch, ctx.capi, p, modes, ctx.seed)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
        torch.cuda.empty_cache()
        return [unrun(f"torch-{b}", m, "skipped", f"inputs do not fit: {first_line(e)}") for b in names for m in modes]
    runs = []
    for b in names:
        runs += run_backend(torch, b, p, ctx, inputs, modes)
    del inputs
    torch.cuda.empty_cache()
    return runs


def run_summary(r):
    if r["status"] != "ok":
        return f"{r['kernel']} {r['mode'][:3]} {r['status']}"
    return f"{r['kernel']} {r['mode'][:3]} {r['timing']['median_ms']:.3g} ms" + (" check FAILED" if check_failed(r) else "")


def run_sweep(torch, args, names, ctx, argv):
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
        runs = sweep_point(torch, p, pt["modes"], names, ctx)
        annotate(runs, p)
        all_runs += runs
        if jsonl:
            doc = doc_header(torch, argv, generated_data(args.seed))
            doc.update(sweep={"name": grid, "point": i + 1, "points": len(points)}, runs=runs)
            out.write(json.dumps(doc) + "\n")
            out.flush()
        elapsed = time.monotonic() - t0
        eta = elapsed * (len(points) - i - 1) / (i + 1)
        title = f"B{pt['B']} H{pt['H']} S{pt['S_q']} D{pt['D']} {pt['dtype']}" + (" causal" if pt["causal"] else "")
        print(f"[{i + 1}/{len(points)}] {title}: {', '.join(run_summary(r) for r in runs)} | {elapsed:.0f}s elapsed, "
              f"ETA {eta:.0f}s", file=sys.stderr)
    if out:
        out.close()
    elif args.json:
        doc = doc_header(torch, argv, generated_data(args.seed))
        doc.update(sweep={"name": grid, "points": len(points)}, runs=all_runs)
        if args.json == "-":
            print(json.dumps(doc, indent=2))
        else:
            write_json(args.json, json.dumps(doc, indent=2))
    else:
        print_runs(all_runs, sys.stdout)
    return exit_status(all_runs)


def run_data_dir(torch, args, names, ctx, argv):
    """Every backend and mode on a data directory's problem; one session document."""
    settings = reference.Settings()
    settings.causal = args.causal
    settings.window = args.window or (-1, -1)
    settings.scale = args.scale
    rargs = types.SimpleNamespace(layout=args.layout, dtype=args.dtype, causal=None, window=None, scale=None)
    try:
        p = reference.Problem(args.data_dir, args.data_dir, rargs, settings)
    except reference.BadInput as e:
        print(f"peers.py: {e}", file=sys.stderr)
        return EXIT_USAGE
    if p.dtype == "fp64":
        p.dtype = "fp32"
    modes = ["forward", "backward"] if args.mode == "both" else [args.mode]
    inputs = data_inputs(torch, ctx.capi, p, modes, ctx.seed)
    runs = []
    for b in names:
        runs += run_backend(torch, b, p, ctx, inputs, modes)
    annotate(runs, p)
    doc = doc_header(torch, argv, {"dir": args.data_dir, "input_dtype": p.stored_dtype,
                                   "generated_dO": p.dout is None and "backward" in modes})
    doc["runs"] = runs
    return emit(doc, args.json, lambda: print_runs(runs, sys.stdout))


def emit(doc, json_path, print_table):
    """The session document to stdout (--json -), or to its file and the table to stdout; the exit
    status of its runs."""
    text = json.dumps(doc, indent=2)
    if json_path == "-":
        print(text)
    else:
        if json_path:
            write_json(json_path, text)
        print_table()
    return exit_status(doc["runs"])


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("data_dir", metavar="DATA_DIR", nargs="?")
    ap.add_argument("--sweep", default=None, metavar="fa-grid|FILE.json",
                    help="run a grid of generated problems instead of DATA_DIR")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the generated inputs (--sweep; dO a DATA_DIR lacks) and of the checked rows")
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
    ap.add_argument("--no-check", action="store_true",
                    help="do not check the outputs (checked by default, with flashattn's validator)")
    ap.add_argument("--check", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old scripts
    ap.add_argument("--capi", default=None, metavar="PATH", help="libflashattn_capi.so (default: see below)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the JSON here (- for stdout; .jsonl: one line per point)")
    ap.add_argument("--copy-gbps", type=float, default=None, metavar="X",
                    help="decode: the measured copy rate (flashattn --ceilings), for the bandwidth fraction")
    args = ap.parse_args(argv)
    args.mode_given = args.mode is not None
    if args.mode is None:
        args.mode = "forward"
    if (args.data_dir is None) == (args.sweep is None):
        ap.error("give a DATA_DIR or --sweep (not both)")
    if args.sweep and (args.window or args.layout):
        ap.error("--window and --layout need a DATA_DIR")
    if args.repeat < 1 or args.warmup < 0 or not 0 <= args.max_noise < 100 or args.max_time <= 0:
        ap.error("--repeat >= 1, --warmup >= 0, --max-noise in [0, 100), --max-time > 0")
    return args


def is_decode(args):
    return bool(args.data_dir) and (args.mode == "decode" or any(
        os.path.isfile(os.path.join(args.data_dir, "K_cache" + e)) for e in (".npy", ".bin")))


def main(argv=None, capi=None):
    """capi: a loaded library (peers_capi.CApi or a stand-in with its methods); default: load one."""
    args = parse_args(argv)
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in names:
        if b not in BACKENDS:
            print(f"peers.py: --backends: unknown backend '{b}'", file=sys.stderr)
            return EXIT_USAGE
    if capi is None:
        try:
            capi = peers_capi.load(args.capi)
        except peers_capi.CApiError as e:
            print(e, file=sys.stderr)
            return EXIT_USAGE
    try:
        import torch
    except ImportError:
        print("peers.py: PyTorch is not importable", file=sys.stderr)
        return EXIT_USAGE
    if not torch.cuda.is_available():
        print("peers.py: PyTorch sees no CUDA device", file=sys.stderr)
        return EXIT_USAGE
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    timer = None
    try:
        timer = Timer(torch, capi, args.warmup, args.repeat, not args.no_flush, args.max_noise / 100.0, args.max_time)
        ctx = types.SimpleNamespace(timer=timer, capi=capi, check=not args.no_check, seed=args.seed)
        if is_decode(args):
            sys.modules.setdefault("peers", sys.modules[__name__])  # one module for peers_decode's helpers
            import peers_decode
            return peers_decode.run(torch, args, names, ctx, argv, sys.modules[__name__])
        if args.sweep:
            return run_sweep(torch, args, names, ctx, argv)
        return run_data_dir(torch, args, names, ctx, argv)
    except peers_capi.CApiError as e:
        print(f"peers.py: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if timer is not None:
            timer.close()


if __name__ == "__main__":
    sys.exit(main())
