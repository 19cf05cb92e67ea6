#!/usr/bin/env python3
"""Recompute attention in fp64 from a data directory and check a flashattn output directory.

    reference.py DATA_DIR OUT_DIR [--mode forward|backward|both] [--causal] [--window L,R]
                 [--scale X] [--layout bhsd|bshd] [--dtype fp32|fp16|bf16|fp64] [--torch]
                 [--max-rel-l2 X] [--quiet] [--json]

A decode DATA_DIR (it holds K_cache) is checked by scripts/decode_reference.py: one decode step's
O and lse, and the updated caches when the run wrote them.

DATA_DIR holds Q, K, V and optionally dO, seqlens_k and mask (.npy, or .bin described by meta.json
or by a directory name B{b}_H{h}_S{s}_D{d}; see data/README.md). OUT_DIR holds what the driver
wrote: any of O, lse, dQ, dK, dV, plus timing.json (the run's dtype, layout and flags) and dO when
the driver generated it. When OUT_DIR holds no outputs but has one sub-directory per kernel, each
is checked. Command-line flags override timing.json.

The inputs are first rounded to the run's compute dtype (what the kernels see); then O, lse, dQ, dK
and dV are computed in fp64 with causal (bottom-right), window, padding, additive mask and GQA,
exactly as src/reference.h defines them. Per output it prints max abs, mean abs, MSE, max rel
(|out - ref| / max(|ref|, 1e-3 * max|ref|)) and rel L2 (||out - ref|| / ||ref||); an output passes
when rel L2 <= the limit (fp64 1e-12, fp32 1e-5, fp16 4e-3, bf16 3e-2 unless --max-rel-l2), it has
no NaN, and, for lse, -inf appears exactly where the reference is -inf (rel errors use the finite
entries).

Exit status: 0 all outputs pass, 3 an output fails, 2 bad input (one line naming the file).
"""

import argparse
import json
import math
import os
import re
import sys

import numpy as np

from reference_common import (  # noqa: F401  (re-exported: peers.py and the tests use reference.X)
    FLOAT_DTYPES, DTYPE_ALIASES, BadInput, bfloat16_type, numpy_dtype, dtype_name_of, read_npy, read_bin,
    find_file, read_json, positive_int, Directory, bhsd, stored_shape, to_f64, round_to, DEFAULT_MAX_REL_L2,
    Settings, settings_from_timing, metrics)

EXIT_OK, EXIT_INPUT, EXIT_FAIL = 0, 2, 3
FORWARD_OUTPUTS, BACKWARD_OUTPUTS = ("O", "lse"), ("dQ", "dK", "dV")


def parse_window(text):
    m = re.fullmatch(r"\s*(-?\d+)\s*,\s*(-?\d+)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"--window {text}: expected L,R (integers, -1 = unbounded)")
    return int(m.group(1)), int(m.group(2))


def dims_from_dirname(directory):
    base = os.path.basename(os.path.normpath(os.path.abspath(directory)))
    m = re.fullmatch(r"B([1-9]\d*)_H([1-9]\d*)_S([1-9]\d*)_D([1-9]\d*)", base)
    if not m:
        return None
    B, H, S, D = (int(g) for g in m.groups())
    return {"B": B, "H": H, "H_kv": H, "S_q": S, "S_k": S, "D": D}


def dims_from_meta(meta, path):
    d = {}
    for f in ("B", "H", "D"):
        d[f] = positive_int(meta, f, path)
    d["H_kv"] = positive_int(meta, "H_kv", path) if "H_kv" in meta else d["H"]
    for f in ("S_q", "S_k"):
        d[f] = positive_int(meta, f, path) if f in meta else positive_int(meta, "S", path)
    return d


class Problem:
    """Inputs as float64 bhsd arrays rounded to the compute dtype, and the settings."""

    def __init__(self, data_dir, out_dir, args, settings):
        self.data = Directory(data_dir)
        layout = self.data.meta_layout()
        if layout and args.layout and layout != args.layout:
            raise BadInput(f"{self.data.meta_path}: layout '{layout}' conflicts with --layout {args.layout}")
        self.layout = layout or args.layout or settings.layout or "bhsd"
        if self.layout not in ("bhsd", "bshd"):
            raise BadInput(f"{out_dir}/timing.json: unknown layout '{self.layout}'")

        meta_dims = None  # for .bin files without a files entry
        if self.data.meta is not None:
            meta_dims = lambda: dims_from_meta(self.data.meta, self.data.meta_path)  # noqa: E731
        elif dims_from_dirname(data_dir) is not None:
            meta_dims = lambda: dims_from_dirname(data_dir)  # noqa: E731

        def top_dtype(path):
            if self.data.meta is None or "dtype" not in self.data.meta:
                return "fp32"
            t = DTYPE_ALIASES.get(self.data.meta["dtype"])
            if t not in FLOAT_DTYPES:
                raise BadInput(f"{self.data.meta_path}: field 'dtype' must be one of fp32, fp16, bf16, fp64")
            return t

        def default(name):
            def spec(path):
                if meta_dims is None:
                    raise BadInput(f"{path}: .bin inputs need meta.json or a directory named B{{b}}_H{{h}}_S{{s}}_D{{d}}")
                if self.data.meta is None and self.layout != "bhsd":
                    raise BadInput(f"{path}: a directory named B{{b}}_H{{h}}_S{{s}}_D{{d}} holds bhsd data")
                d = meta_dims()
                if name in ("Q", "dO"):
                    return top_dtype(path), stored_shape(self.layout, d["B"], d["H"], d["S_q"], d["D"])
                if name in ("K", "V"):
                    return top_dtype(path), stored_shape(self.layout, d["B"], d["H_kv"], d["S_k"], d["D"])
                if name == "seqlens_k":
                    return "int32", [d["B"]]
                return "fp32", [d["B"], d["H"], d["S_q"], d["S_k"]]  # mask
            return spec

        arrays, paths = {}, {}
        for name in ("Q", "K", "V"):
            arrays[name], paths[name] = self.data.read(name, default(name))
            if arrays[name] is None:
                raise BadInput(f"{data_dir}: missing {name} (expected {name}.npy or {name}.bin)")
            if arrays[name].ndim != 4:
                raise BadInput(f"{paths[name]}: expected rank 4 ({self.layout}), got shape {list(arrays[name].shape)}")
            if dtype_name_of(arrays[name], paths[name]) not in FLOAT_DTYPES:
                raise BadInput(f"{paths[name]}: dtype {arrays[name].dtype} is not a float dtype")
        q, k, v = (bhsd(arrays[n], self.layout) for n in ("Q", "K", "V"))
        B, H, S_q, D = q.shape
        _, H_kv, S_k, _ = k.shape
        if k.shape != v.shape:
            raise BadInput(f"{paths['V']}: shape {list(arrays['V'].shape)} differs from K's {list(arrays['K'].shape)}")
        if k.shape[0] != B or k.shape[3] != D:
            raise BadInput(f"{paths['K']}: shape {list(arrays['K'].shape)} does not match Q's {list(arrays['Q'].shape)}")
        if H % H_kv != 0:
            raise BadInput(f"{paths['K']}: H_kv = {H_kv} does not divide H = {H}")
        self.dims = dict(B=B, H=H, H_kv=H_kv, S_q=S_q, S_k=S_k, D=D)
        self.stored_dtype = dtype_name_of(arrays["Q"], paths["Q"])
        self.dtype = args.dtype or settings.dtype or self.stored_dtype
        if self.dtype not in FLOAT_DTYPES:
            raise BadInput(f"--dtype {self.dtype}: not a compute dtype")
        self.q, self.k, self.v = (round_to(to_f64(t), self.dtype) for t in (q, k, v))

        # dO: the data's, else the one the driver generated into OUT_DIR.
        self.dout, self.dout_path = None, None
        dout, dpath = self.data.read("dO", default("dO"))
        if dout is None:
            out = Directory(out_dir)
            dout, dpath = out.read("dO", lambda p: (self.dtype, stored_shape(self.layout, B, H, S_q, D)))
        if dout is not None:
            if list(dout.shape) != list(arrays["Q"].shape):
                raise BadInput(f"{dpath}: shape {list(dout.shape)} differs from Q's {list(arrays['Q'].shape)}")
            self.dout, self.dout_path = round_to(to_f64(bhsd(dout, self.layout)), self.dtype), dpath

        self.seqlens = None
        seqlens, spath = self.data.read("seqlens_k", default("seqlens_k"))
        if seqlens is not None and settings.use_seqlens is not False:
            if seqlens.dtype.kind != "i" or list(seqlens.shape) != [B]:
                raise BadInput(f"{spath}: expected int32/int64 of shape [{B}], got {seqlens.dtype} {list(seqlens.shape)}")
            bad = np.nonzero((seqlens < 0) | (seqlens > S_k))[0]
            if bad.size:
                raise BadInput(f"{spath}: seqlens_k[{bad[0]}] = {seqlens[bad[0]]} is outside [0, S_k] = [0, {S_k}]")
            self.seqlens = seqlens.astype(np.int64)
        elif seqlens is None and settings.use_seqlens:
            raise BadInput(f"{data_dir}: the run used seqlens_k (timing.json) but there is no seqlens_k file")

        self.mask = None
        mask, mpath = self.data.read("mask", default("mask"))
        if mask is not None and settings.use_mask is not False:
            if dtype_name_of(mask, mpath) not in FLOAT_DTYPES:
                raise BadInput(f"{mpath}: dtype {mask.dtype} is not a float dtype")
            target = (B, H, S_q, S_k)
            if not 1 <= mask.ndim <= 4 or any(m not in (1, t) for m, t in zip(mask.shape[::-1], target[::-1])):
                raise BadInput(f"{mpath}: mask shape {list(mask.shape)} does not broadcast to [B, H, S_q, S_k] = {list(target)}")
            m32 = mask.astype(np.float32)  # the driver hands kernels a float32 mask
            if np.isnan(m32).any() or np.isposinf(m32).any():
                raise BadInput(f"{mpath}: NaN or +inf in the mask (use -inf to mask a key out)")
            self.mask = np.broadcast_to(m32.astype(np.float64), target)
        elif mask is None and settings.use_mask:
            raise BadInput(f"{data_dir}: the run used a mask (timing.json) but there is no mask file")

        self.causal = settings.causal if args.causal is None else args.causal
        self.window = args.window if args.window is not None else settings.window
        self.scale = args.scale if args.scale is not None else settings.scale
        if self.scale is None:
            self.scale = 1.0 / math.sqrt(D)


# ---------------------------------------------------------------------------------------------
# The fp64 computation, written once over a tiny array API that numpy and torch both provide.

class NumpyOps:
    name = "numpy"

    def array(self, a, dtype=np.float64):
        return np.ascontiguousarray(a, dtype=dtype)

    def numpy(self, x):
        return x

    def zeros(self, shape):
        return np.zeros(shape, dtype=np.float64)

    def rowmax(self, x):
        return x.max(axis=1)

    def rowsum(self, x):
        return x.sum(axis=1)

    def where(self, c, a, b):
        return np.where(c, a, b)

    exp = staticmethod(np.exp)
    log = staticmethod(np.log)


class TorchOps:
    def __init__(self, torch):
        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.name = f"torch ({self.device})"

    def array(self, a, dtype=np.float64):
        a = np.ascontiguousarray(a, dtype=dtype)
        return self.torch.from_numpy(a).to(self.device)

    def numpy(self, x):
        return x.cpu().numpy()

    def zeros(self, shape):
        return self.torch.zeros(shape, dtype=self.torch.float64, device=self.device)

    def rowmax(self, x):
        return self.torch.amax(x, dim=1)

    def rowsum(self, x):
        return x.sum(dim=1)

    def where(self, c, a, b):
        t = self.torch
        a = a if t.is_tensor(a) else t.tensor(a, dtype=t.float64, device=self.device)
        b = b if t.is_tensor(b) else t.tensor(b, dtype=t.float64, device=self.device)
        return t.where(c, a, b)

    def exp(self, x):
        return self.torch.exp(x)

    def log(self, x):
        return self.torch.log(x)


def visibility(p, b):
    """Boolean [S_q, S_k]: key j visible to query i of batch b (reference.h's definition)."""
    S_q, S_k = p.dims["S_q"], p.dims["S_k"]
    i = np.arange(S_q)[:, None]
    j = np.arange(S_k)[None, :]
    diag = i + (S_k - S_q)  # bottom-right alignment
    vis = np.broadcast_to(j < (S_k if p.seqlens is None else p.seqlens[b]), (S_q, S_k))
    wl, wr = p.window
    if p.causal:
        vis = vis & (j <= diag)
    if wl >= 0:
        vis = vis & (j >= diag - wl)
    if wr >= 0:
        vis = vis & (j <= diag + wr)
    return vis


def compute(p, ops, forward, backward):
    """O, lse, dQ, dK, dV (bhsd float64 numpy arrays; None where not asked)."""
    B, H, H_kv, S_q, S_k, D = (p.dims[n] for n in ("B", "H", "H_kv", "S_q", "S_k", "D"))
    G = H // H_kv
    o = np.zeros((B, H, S_q, D)) if forward or backward else None
    lse = np.zeros((B, H, S_q))
    dq = np.zeros((B, H, S_q, D)) if backward else None
    dk = np.zeros((B, H_kv, S_k, D)) if backward else None
    dv = np.zeros((B, H_kv, S_k, D)) if backward else None
    block = max(1, (1 << 21) // max(S_k, 1))  # query rows per step: bounds the score block's memory
    for b in range(B):
        vis_b = visibility(p, b)
        for g in range(H_kv):
            k, v = ops.array(p.k[b, g]), ops.array(p.v[b, g])
            dk_g, dv_g = (ops.zeros((S_k, D)), ops.zeros((S_k, D))) if backward else (None, None)
            for h in range(g * G, (g + 1) * G):
                for i0 in range(0, S_q, block):
                    i1 = min(S_q, i0 + block)
                    q = ops.array(p.q[b, h, i0:i1])
                    s = p.scale * (q @ k.T)
                    if p.mask is not None:
                        s = s + ops.array(p.mask[b, h, i0:i1])
                    s = ops.where(ops.array(vis_b[i0:i1], dtype=bool), s, -math.inf)
                    m = ops.rowmax(s)
                    empty = m == -math.inf  # no visible key, or only -inf scores
                    m = ops.where(empty, 0.0, m)
                    e = ops.exp(s - m[:, None])
                    total = ops.where(empty, 1.0, ops.rowsum(e))
                    row_lse = ops.where(empty, -math.inf, m + ops.log(total))
                    P = e / total[:, None]  # all zero on empty rows
                    o_blk = P @ v
                    o[b, h, i0:i1] = ops.numpy(o_blk)
                    lse[b, h, i0:i1] = ops.numpy(row_lse)
                    if backward:
                        dO = ops.array(p.dout[b, h, i0:i1])
                        dP = dO @ v.T
                        Di = ops.rowsum(dO * o_blk)
                        dS = P * (dP - Di[:, None])
                        dq[b, h, i0:i1] = ops.numpy(p.scale * (dS @ k))
                        dk_g = dk_g + dS.T @ q
                        dv_g = dv_g + P.T @ dO
            if backward:
                dk[b, g] = ops.numpy(p.scale * dk_g)
                dv[b, g] = ops.numpy(dv_g)
    return {"O": o, "lse": lse, "dQ": dq, "dK": dk, "dV": dv}


# ---------------------------------------------------------------------------------------------
# Comparison

def check_out_dir(data_dir, out_dir, args, ops):
    settings, timing_path = settings_from_timing(out_dir)
    p = Problem(data_dir, out_dir, args, settings)
    out = Directory(out_dir)
    if out.meta_layout() and out.meta_layout() != p.layout:
        raise BadInput(f"{out.meta_path}: outputs are {out.meta_layout()} but the inputs are {p.layout}")
    B, H, H_kv, S_q, S_k, D = (p.dims[n] for n in ("B", "H", "H_kv", "S_q", "S_k", "D"))
    expected = {
        "O": (p.dtype, stored_shape(p.layout, B, H, S_q, D)),
        "dQ": (p.dtype, stored_shape(p.layout, B, H, S_q, D)),
        "dK": (p.dtype, stored_shape(p.layout, B, H_kv, S_k, D)),
        "dV": (p.dtype, stored_shape(p.layout, B, H_kv, S_k, D)),
        "lse": ("fp64" if p.dtype == "fp64" else "fp32", [B, H, S_q]),
    }
    if args.mode == "forward":
        names = FORWARD_OUTPUTS
    elif args.mode == "backward":
        names = BACKWARD_OUTPUTS
    else:
        names = FORWARD_OUTPUTS + BACKWARD_OUTPUTS
    outputs = {}
    for name in names:
        arr, path = out.read(name, lambda path, n=name: expected[n])
        if arr is None:
            continue
        if list(arr.shape) != expected[name][1]:
            raise BadInput(f"{path}: shape {list(arr.shape)}, expected {expected[name][1]} ({p.layout})")
        if dtype_name_of(arr, path) not in FLOAT_DTYPES:
            raise BadInput(f"{path}: dtype {arr.dtype} is not a float dtype")
        outputs[name] = to_f64(arr if name == "lse" else bhsd(arr, p.layout))
    if not outputs:
        raise BadInput(f"{out_dir}: no outputs to check (expected any of {', '.join(n + '.npy|.bin' for n in names)})")
    backward = any(n in outputs for n in BACKWARD_OUTPUTS)
    if backward and p.dout is None:
        raise BadInput(f"{data_dir}: backward outputs need dO (none in the data or output directory)")
    ref = compute(p, ops, forward=any(n in outputs for n in FORWARD_OUTPUTS), backward=backward)
    limit = args.max_rel_l2 if args.max_rel_l2 is not None else DEFAULT_MAX_REL_L2[p.dtype]
    results = [metrics(n, outputs[n], ref[n], limit) for n in names if n in outputs]
    return {"data": data_dir, "out": out_dir, "timing": timing_path, "kernel": settings.kernel,
            "dtype": p.dtype, "layout": p.layout, "dims": p.dims, "causal": p.causal,
            "window": list(p.window), "scale": p.scale, "mask": p.mask is not None,
            "seqlens_k": p.seqlens is not None, "dO": p.dout_path, "reference": f"{ops.name} fp64",
            "outputs": results, "passed": all(r["passed"] for r in results)}


def describe(rep):
    parts = [rep["kernel"] or "outputs", rep["dtype"], rep["layout"]]
    d = rep["dims"]
    parts.append(f"B={d['B']} H={d['H']} H_kv={d['H_kv']} S_q={d['S_q']} S_k={d['S_k']} D={d['D']}")
    if rep["causal"]:
        parts.append("causal")
    if rep["window"] != [-1, -1]:
        parts.append(f"window=({rep['window'][0]},{rep['window'][1]})")
    parts.append(f"scale={rep['scale']:.6g}")
    if rep["mask"]:
        parts.append("mask")
    if rep["seqlens_k"]:
        parts.append("seqlens_k")
    return f"{rep['out']}: " + " ".join(parts) + f" vs {rep['reference']}"


def print_report(rep, quiet):
    rows = rep["outputs"] if not quiet else [r for r in rep["outputs"] if not r["passed"]]
    if quiet and not rows:
        return
    print(describe(rep))
    print(f"  {'output':<6} {'max_abs':>10} {'mean_abs':>10} {'mse':>10} {'max_rel':>10} {'rel_l2':>10} "
          f"{'limit':>8}  result")
    for r in rows:
        verdict = "PASS" if r["passed"] else "FAIL (" + "; ".join(r["failures"]) + ")"
        print(f"  {r['name']:<6} {r['max_abs']:10.3e} {r['mean_abs']:10.3e} {r['mse']:10.3e} "
              f"{r['max_rel']:10.3e} {r['rel_l2']:10.3e} {r['limit']:8.1e}  {verdict}")


def output_dirs(out_dir):
    """OUT_DIR itself, or its per-kernel sub-directories when it holds no outputs."""
    names = FORWARD_OUTPUTS + BACKWARD_OUTPUTS
    if not os.path.isdir(out_dir):
        raise BadInput(f"{out_dir}: no such directory")
    if any(find_file(out_dir, n) for n in names):
        return [out_dir]
    subs = sorted(os.path.join(out_dir, e) for e in os.listdir(out_dir)
                  if os.path.isdir(os.path.join(out_dir, e)))
    subs = [s for s in subs if any(find_file(s, n) for n in names)]
    return subs or [out_dir]


def make_ops(use_torch, quiet):
    if not use_torch:
        return NumpyOps()
    try:
        import torch
    except ImportError:
        if not quiet:
            print("reference.py: torch is not importable; computing with numpy", file=sys.stderr)
        return NumpyOps()
    return TorchOps(torch)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("data_dir", metavar="DATA_DIR")
    ap.add_argument("out_dir", metavar="OUT_DIR")
    ap.add_argument("--mode", choices=("forward", "backward", "both"), default="both",
                    help="which outputs to check (default: every output present)")
    ap.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                    help="bottom-right causal mask (default: from timing.json)")
    ap.add_argument("--window", type=parse_window, default=None, metavar="L,R",
                    help="sliding window, -1 = unbounded (default: from timing.json)")
    ap.add_argument("--scale", type=float, default=None, help="softmax scale (default: timing.json, else 1/sqrt(D))")
    ap.add_argument("--layout", choices=("bhsd", "bshd"), default=None, help="layout of .npy inputs without meta.json")
    ap.add_argument("--dtype", choices=FLOAT_DTYPES, default=None,
                    help="compute dtype the inputs are rounded to (default: timing.json, else the data's)")
    ap.add_argument("--torch", action="store_true", help="compute with torch float64 (cuda if available)")
    ap.add_argument("--max-rel-l2", type=float, default=None, metavar="X", help="pass limit on rel L2 for every output")
    ap.add_argument("--quiet", action="store_true", help="print only failing outputs")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = ap.parse_args(argv)

    try:
        ops = make_ops(args.torch, args.quiet or args.json)
        if any(os.path.isfile(os.path.join(args.data_dir, "K_cache" + e)) for e in (".npy", ".bin")):
            # A decode directory (data/README.md): the decode branch (it shares reference_common, not this
            # module, so the two import no cycle).
            import decode_reference
            reports = [decode_reference.check_out_dir(args.data_dir, d, args) for d in output_dirs(args.out_dir)]
        else:
            reports = [check_out_dir(args.data_dir, d, args, ops) for d in output_dirs(args.out_dir)]
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INPUT
    passed = all(r["passed"] for r in reports)
    if args.json:
        json.dump({"passed": passed, "checks": reports}, sys.stdout, indent=2, default=str)
        print()
    else:
        for rep in reports:
            print_report(rep, args.quiet)
        if not args.quiet:
            print("PASS" if passed else "FAIL")
    return EXIT_OK if passed else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
