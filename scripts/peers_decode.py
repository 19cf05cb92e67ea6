#!/usr/bin/env python3
"""The decode mode of peers.py: PyTorch SDPA's backends timed on a decode data directory, the
way `flashattn --mode decode` times its kernels (same held-stream timer, same checks), in the
same JSON schema.

    peers.py DECODE_DIR [--mode decode] [--backends flash,cudnn] [--repeat N] [--hot] [--no-check]
             [--seed N] [--copy-gbps X] [--capi PATH] [--json FILE|-]

Two things are timed per backend, each with peers.py's timer (cold unless --hot):
  step       PyTorch's own decode step, the counterpart of flashattn's (update-cache kernel +
             attention): k_new and v_new slice-assigned into the cache at positions [L - S_new, L)
             (K[:, :, L - S_new:L] = k_new, the same for V), then the attention below. The run's
             "timing" is the step's.
  attention  F.scaled_dot_product_attention(q, K[:, :, :L], V[:, :, :L], enable_gqa=True) alone,
             with q [B, H, S_new, D] and K/V views of the first L = cache_seqlens[b] + S_new
             positions of a contiguous cache [B, H_kv, S_max, D] that already holds the new rows:
             decode.attention, with its own "timing".
SDPA has no paged cache: a paged directory is gathered into a contiguous cache first. S_new > 1
adds the bottom-right causal mask (torch.nn.attention.bias.causal_lower_right). The lengths must
be equal across the batch (plain SDPA has no per-batch key lengths without a mask or nested
tensors): the benchmark points use equal lengths; other directories are refused with that reason.

Check (unless --no-check): one step's output, by flashattn's validator, as the forward attention it
is: S_q = S_new, S_k = L, causal (bottom-right), K/V the logical cache [B, H_kv, L, D].

GB/s counts the K and V bytes a step reads, sum_b L_b * H_kv * D * 2 * itemsize, as flashattn does;
--copy-gbps X (the copy rate `flashattn --ceilings` measured) adds the fraction of it.
"""

import math
import os
import sys
import types
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_reference  # noqa: E402
import peers_capi  # noqa: E402
import reference  # noqa: E402
from peers_check import check_notes, check_outputs  # noqa: E402
from peers_timing import HoldTimedOut, timing_notes  # noqa: E402

STEP_WHAT = "slice-assign k_new/v_new into the cache + SDPA"


def logical_cache(p, which, dtype):
    """[B, H_kv, L, D] float64 keys or values after the step (equal lengths L)."""
    return np.stack([np.stack([p.rows(which, b, g, dtype) for g in range(p.H_kv)]) for b in range(p.B)])


def build(torch, p, dtype):
    """The device tensors of the step: q, k_new, v_new, the caches kc / vc (holding the new rows
    already) and k / v, the views of their valid prefix; host: the checks' copies."""
    tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]

    def dev(x):
        return torch.from_numpy(reference.round_to(reference.to_f64(x), dtype)).to("cuda", tdt)

    L = int(p.lens[0]) + p.S_new
    shape = (p.B, p.H_kv, max(p.S_max, L), p.D)
    kc = torch.zeros(shape, dtype=tdt, device="cuda")
    vc = torch.zeros(shape, dtype=tdt, device="cuda")
    kc[:, :, :L] = torch.from_numpy(logical_cache(p, "K", dtype)).to("cuda", tdt)
    vc[:, :, :L] = torch.from_numpy(logical_cache(p, "V", dtype)).to("cuda", tdt)
    return types.SimpleNamespace(q=dev(p.arrays["q"]), k_new=dev(p.arrays["k_new"]), v_new=dev(p.arrays["v_new"]),
                                 kc=kc, vc=vc, k=kc[:, :, :L], v=vc[:, :, :L], L=L, dout=None, host={})


def check_problem(p, dtype, scale, L):
    """The step as the forward attention the validator checks (peers_check's problem fields)."""
    return types.SimpleNamespace(dims={"B": p.B, "H": p.H, "H_kv": p.H_kv, "S_q": p.S_new, "S_k": L, "D": p.D},
                                 dtype=dtype, causal=True, window=(-1, -1), scale=scale, mask=None, seqlens=None)


def time_backend(torch, ctx, cache, kwargs, check_p):
    """(step timing, attention timing, check) of the backend sdpa_kernel selected."""
    import torch.nn.functional as F
    c, L = cache.L - check_p.dims["S_q"], cache.L

    def attention():
        with torch.no_grad():
            return F.scaled_dot_product_attention(cache.q, cache.k, cache.v, **kwargs)

    def step():
        with torch.no_grad():
            cache.kc[:, :, c:L] = cache.k_new
            cache.vc[:, :, c:L] = cache.v_new
            return F.scaled_dot_product_attention(cache.q, cache.k, cache.v, **kwargs)

    with warnings.catch_warnings():  # a refusal raises with its reason; the warnings only repeat it
        warnings.simplefilter("ignore", UserWarning)
        out = step()
    torch.cuda.synchronize()
    check = check_outputs(ctx.capi, torch, check_p, "forward", ctx.seed, cache, {"O": out}) if ctx.check else None
    del out
    return ctx.timer(step), ctx.timer(attention), check


def record(base, step_t, attend_t, check, info, kv_bytes, flops, copy_gbps, clock_note):
    def rates(t):
        gbps = kv_bytes / (t["median_ms"] * 1e-3) / 1e9
        return {"median_ms": t["median_ms"], "min_ms": t["min_ms"], "gbps": gbps,
                "bandwidth_fraction": gbps / copy_gbps if copy_gbps else None}

    sec = step_t["median_ms"] * 1e-3
    info = dict(info, attention=dict(rates(attend_t), timing=attend_t), step=dict(rates(step_t), what=STEP_WHAT),
                bandwidth_reference={"kind": "copy" if copy_gbps else None, "gbps": copy_gbps})
    notes = timing_notes(step_t, clock_note) + timing_notes(attend_t, "", prefix="attention: ") + check_notes(check)
    return dict(base, timing=step_t, notes=notes, memory=None, check=check, decode=info,
                throughput={"flops": flops, "tflops": flops / sec / 1e12, "bytes": kv_bytes,
                            "gbps": kv_bytes / sec / 1e9, "peak_fraction": None})


def print_runs(runs):
    for r in runs:
        if r["status"] != "ok":
            print(f"{r['kernel']:<16} decode   {r['status']}: {r['reason']}")
            continue
        d = r["decode"]
        frac = d["step"]["bandwidth_fraction"]
        print(f"{r['kernel']:<16} decode   step {d['step']['median_ms']:10.4f} ms {d['step']['gbps']:9.1f} GB/s"
              + (f" ({100 * frac:.1f}% of copy)" if frac else "")
              + f"; attention {d['attention']['median_ms']:.4f} ms {d['attention']['gbps']:.1f} GB/s"
              + (" check FAILED" if r["check"] and not r["check"].get("passed") else ""))


def run(torch, args, names, ctx, argv, peers):
    """Every backend on the decode directory args.data_dir; ctx: timer, capi, check, seed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        p = decode_reference.DecodeData(args.data_dir)
    except reference.BadInput as e:
        print(f"peers.py: {e}", file=sys.stderr)
        return peers.EXIT_USAGE
    dtype = args.dtype or ("fp32" if p.stored_dtype == "fp64" else p.stored_dtype)
    scale = args.scale if args.scale else 1.0 / math.sqrt(p.D)
    es = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
    L_all = p.lens + p.S_new
    kv_bytes = float(L_all.sum()) * p.H_kv * p.D * 2 * es
    pairs = float(sum(int(c) * p.S_new + p.S_new * (p.S_new + 1) // 2 for c in p.lens)) * p.H
    shape = {"B": p.B, "H": p.H, "H_kv": p.H_kv, "S_q": p.S_new, "S_k": p.S_max, "D": p.D}
    flags = {"causal": True, "window_left": -1, "window_right": -1, "scale": scale, "seqlens_k": True, "mask": False}
    info = {"cache_seqlens": [int(c) for c in p.lens],
            "kv_lengths": {"min": int(L_all.min()), "max": int(L_all.max()), "mean": float(L_all.mean())},
            "S_new": p.S_new, "S_max": p.S_max, "paged": p.paged, "page_size": p.page, "kv_bytes": kv_bytes,
            "cache": "contiguous (a paged directory is gathered into one)"}
    base = {"kernel": None, "mode": "decode", "gpu": True, "status": "ok", "reason": "", "notes": [],
            "shape": shape, "dtype": dtype, "layout": "bhsd", "flags": flags}
    runs = []
    if len(set(int(x) for x in L_all)) != 1:
        reason = "cache lengths differ across the batch (plain SDPA needs equal lengths; see peers_decode.py)"
        runs = [dict(base, kernel=f"torch-{b}", status="skipped", reason=reason) for b in names]
    else:
        cache = build(torch, p, dtype)
        kwargs = {"enable_gqa": p.H != p.H_kv, "scale": scale}
        if p.S_new > 1:
            from torch.nn.attention.bias import causal_lower_right
            kwargs["attn_mask"] = causal_lower_right(p.S_new, cache.L)
        check_p = check_problem(p, dtype, scale, cache.L)
        for name in names:
            rec = dict(base, kernel=f"torch-{name}")
            with sdpa_kernel([getattr(SDPBackend, peers.SDPA_BACKENDS[name])]):
                try:
                    step_t, attend_t, check = time_backend(torch, ctx, cache, kwargs, check_p)
                except HoldTimedOut as e:
                    runs.append(dict(rec, status="failed", reason=str(e)))
                    continue
                except peers_capi.CApiError as e:
                    runs.append(dict(rec, status="failed", reason=f"libflashattn_capi: {e}"))
                    continue
                except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                    torch.cuda.empty_cache()
                    runs.append(dict(rec, status="skipped", reason=f"PyTorch refused: {peers.first_line(e)}"))
                    continue
            runs.append(record(rec, step_t, attend_t, check, info, kv_bytes, 4.0 * p.D * pairs, args.copy_gbps,
                               ctx.timer.clock_note))
    doc = peers.doc_header(torch, argv, {"dir": args.data_dir, "input_dtype": p.stored_dtype, "kind": "decode"})
    doc["runs"] = runs
    return peers.emit(doc, args.json, lambda: print_runs(runs))
