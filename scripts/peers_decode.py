#!/usr/bin/env python3
"""The decode mode of peers.py: PyTorch SDPA's backends timed on a decode data directory, the
way `flashattn --mode decode` times its kernels, in the same JSON schema.

    peers.py DECODE_DIR [--mode decode] [--backends flash,cudnn] [--repeat N] [--hot] [--check]
             [--copy-gbps X] [--json FILE|-]

What is timed: F.scaled_dot_product_attention(q, K[:, :, :L], V[:, :, :L], enable_gqa=True) with q
[B, H, S_new, D] and K/V views of the first L = cache_seqlens[b] + S_new positions of a contiguous
cache [B, H_kv, S_max, D] that already holds the new rows (SDPA has no cache update and no paged
cache: a paged directory is gathered into a contiguous cache first). S_new > 1 adds the
bottom-right causal mask (torch.nn.attention.bias.causal_lower_right). The lengths must be equal
across the batch (plain SDPA has no per-batch key lengths without a mask or nested tensors): the
benchmark points use equal lengths; other directories are refused with that reason.

GB/s counts the K and V bytes a step reads, sum_b L_b * H_kv * D * 2 * itemsize, as flashattn does;
--copy-gbps X (the copy rate `flashattn --ceilings` measured) adds the fraction of it.
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_reference  # noqa: E402
import reference  # noqa: E402


def logical_cache(p, which, dtype):
    """[B, H_kv, L, D] float64 keys or values after the step (equal lengths L)."""
    return np.stack([np.stack([p.rows(which, b, g, dtype) for g in range(p.H_kv)]) for b in range(p.B)])


def build(torch, p, dtype):
    tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    L = int(p.lens[0]) + p.S_new
    q = torch.from_numpy(reference.round_to(reference.to_f64(p.arrays["q"]), dtype)).to("cuda", tdt)
    # A contiguous cache of S_max positions holding the step's rows; SDPA reads a view of its prefix.
    shape = (p.B, p.H_kv, max(p.S_max, L), p.D)
    kc = torch.zeros(shape, dtype=tdt, device="cuda")
    vc = torch.zeros(shape, dtype=tdt, device="cuda")
    kc[:, :, :L] = torch.from_numpy(logical_cache(p, "K", dtype)).to("cuda", tdt)
    vc[:, :, :L] = torch.from_numpy(logical_cache(p, "V", dtype)).to("cuda", tdt)
    return q, kc[:, :, :L], vc[:, :, :L], L


def run(torch, args, names, timer, argv, peers):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    try:
        p = decode_reference.DecodeData(args.data_dir)
    except reference.BadInput as e:
        print(f"peers.py: {e}", file=sys.stderr)
        return 2
    dtype = args.dtype or ("fp32" if p.stored_dtype == "fp64" else p.stored_dtype)
    scale = args.scale if args.scale else 1.0 / math.sqrt(p.D)
    es = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
    L_all = p.lens + p.S_new
    kv_bytes = float(L_all.sum()) * p.H_kv * p.D * 2 * es
    pairs = float(sum(int(c) * p.S_new + p.S_new * (p.S_new + 1) // 2 for c in p.lens)) * p.H
    shape = {"B": p.B, "H": p.H, "H_kv": p.H_kv, "S_q": p.S_new, "S_k": p.S_max, "D": p.D}
    flags = {"causal": True, "window_left": -1, "window_right": -1, "scale": scale, "seqlens_k": True, "mask": False}
    decode_info = {"S_new": p.S_new, "S_max": p.S_max, "cache_seqlens": [int(c) for c in p.lens], "paged": p.paged,
                   "page_size": p.page, "kv_bytes": kv_bytes,
                   "what": "SDPA over a view of the valid cache prefix (no cache update, contiguous cache)"}
    runs = []
    base = {"kernel": None, "mode": "decode", "gpu": True, "status": "ok", "reason": "", "notes": [],
            "shape": shape, "dtype": dtype, "layout": "bhsd", "flags": flags}
    if len(set(int(x) for x in L_all)) != 1:
        reason = "cache lengths differ across the batch (plain SDPA needs equal lengths; see peers_decode.py)"
        runs = [dict(base, kernel=f"torch-{b}", status="skipped", reason=reason) for b in names]
    else:
        q, k, v, L = build(torch, p, dtype)
        kwargs = {"enable_gqa": p.H != p.H_kv, "scale": scale}
        if p.S_new > 1:
            from torch.nn.attention.bias import causal_lower_right
            kwargs["attn_mask"] = causal_lower_right(p.S_new, L)
        ref = None
        if args.check:
            ref = decode_reference.compute(p, dtype, scale)[0]
        backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
        for name in names:
            rec = dict(base, kernel=f"torch-{name}")
            with sdpa_kernel([backends[name]]):
                try:
                    with torch.no_grad():
                        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
                    torch.cuda.synchronize()
                except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                    torch.cuda.empty_cache()
                    runs.append(dict(rec, status="skipped", reason=f"PyTorch refused: {peers.first_line(e)}"))
                    continue
                check = None
                if ref is not None:
                    got = out.float().cpu().numpy().astype(np.float64)
                    check = {"performed": True, "reference": "decode_reference.py fp64",
                             "outputs": {"O": {"max_abs": float(np.abs(got - ref).max()),
                                               "rel_l2": float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300))}}}

                def fn():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, **kwargs)
                timing = timer(fn)
            sec = timing["median_ms"] * 1e-3
            gbps = kv_bytes / sec / 1e9
            info = dict(decode_info, attention={"median_ms": timing["median_ms"], "gbps": gbps,
                                                "bandwidth_fraction": gbps / args.copy_gbps if args.copy_gbps else None},
                        bandwidth_reference={"kind": "copy" if args.copy_gbps else None, "gbps": args.copy_gbps})
            runs.append(dict(rec, timing=timing, notes=peers.timing_notes(timing, timer.clock_note),
                             throughput={"flops": 4.0 * p.D * pairs, "tflops": 4.0 * p.D * pairs / sec / 1e12,
                                         "bytes": kv_bytes, "gbps": gbps, "peak_fraction": None},
                             memory=None, check=check, decode=info))
    doc = peers.doc_header(torch, argv, {"dir": args.data_dir, "input_dtype": p.stored_dtype, "kind": "decode"})
    doc["runs"] = runs
    import json
    text = json.dumps(doc, indent=2)
    if args.json == "-":
        print(text)
    else:
        if args.json:
            peers.write_json(args.json, text)
        for r in runs:
            if r["status"] == "ok":
                frac = r["decode"]["attention"]["bandwidth_fraction"]
                print(f"{r['kernel']:<16} decode   {r['timing']['median_ms']:10.4f} ms {r['throughput']['gbps']:9.1f} GB/s"
                      + (f" ({100 * frac:.1f}% of copy)" if frac else ""))
            else:
                print(f"{r['kernel']:<16} decode   {r['status']}: {r['reason']}")
    return 0
