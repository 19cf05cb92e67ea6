#!/usr/bin/env python3
"""The decode branch of reference.py: one decode step recomputed in fp64 from a decode data
directory (data/README.md, "Decode directories"), and the check of a decode output directory.

    reference.py DECODE_DIR OUT_DIR [--dtype ...] [--scale X] [--max-rel-l2 X] [--json]

A decode directory holds q [B, H, S_new, D], k_new and v_new [B, H_kv, S_new, D], K_cache and
V_cache (contiguous [B, H_kv, S_max, D], or a page pool [num_blocks, H_kv, page, D] with
block_table [B, max_blocks]) and cache_seqlens [B]. The step appends k_new/v_new at positions
cache_seqlens[b] .. + S_new - 1, and query i of batch b sees keys j <= cache_seqlens[b] + i.
O and lse are checked on relative L2 (the limits of reference.py); K_cache and V_cache, when the
run wrote them (--write-cache), must equal the input caches with the new rows appended, exactly.
"""

import math
import os

import numpy as np

import reference_common
from reference_common import BadInput

NAMES = ("q", "k_new", "v_new", "K_cache", "V_cache", "cache_seqlens", "block_table")


def is_decode_dir(path):
    return any(os.path.isfile(os.path.join(path, "K_cache" + ext)) for ext in (".npy", ".bin"))


class DecodeData:
    """The arrays of a decode directory as stored (rounded on use, group by group)."""

    def __init__(self, data_dir):
        self.dir = data_dir
        d = reference_common.Directory(data_dir)
        if d.meta_layout() not in (None, "bhsd"):
            raise BadInput(f"{d.meta_path}: decode directories are bhsd")

        def no_default(path):
            raise BadInput(f"{path}: a decode .bin file needs a meta.json \"files\" entry {{\"dtype\", \"shape\"}}")

        self.arrays, self.paths = {}, {}
        for name in NAMES:
            arr, path = d.read(name, no_default)
            if arr is None and name != "block_table":
                raise BadInput(f"{data_dir}: missing {name} (expected {name}.npy or {name}.bin)")
            self.arrays[name], self.paths[name] = arr, path
        q, kn, kc = self.arrays["q"], self.arrays["k_new"], self.arrays["K_cache"]
        for name in ("q", "k_new", "v_new", "K_cache", "V_cache"):
            a = self.arrays[name]
            if a.ndim != 4 or reference_common.dtype_name_of(a, self.paths[name]) not in reference_common.FLOAT_DTYPES:
                raise BadInput(f"{self.paths[name]}: expected a rank-4 float array, got {a.dtype} {list(a.shape)}")
        self.B, self.H, self.S_new, self.D = q.shape
        self.H_kv = kn.shape[1]
        if list(kn.shape) != [self.B, self.H_kv, self.S_new, self.D] or kn.shape != self.arrays["v_new"].shape:
            raise BadInput(f"{self.paths['k_new']}: shape {list(kn.shape)} does not match q's B, S_new, D")
        if self.H % self.H_kv:
            raise BadInput(f"{self.paths['k_new']}: H_kv = {self.H_kv} does not divide H = {self.H}")
        if kc.shape != self.arrays["V_cache"].shape or kc.shape[1] != self.H_kv or kc.shape[3] != self.D:
            raise BadInput(f"{self.paths['K_cache']}: shape {list(kc.shape)} does not match H_kv and D")
        self.stored_dtype = reference_common.dtype_name_of(q, self.paths["q"])
        lens = self.arrays["cache_seqlens"]
        if lens.dtype.kind != "i" or list(lens.shape) != [self.B]:
            raise BadInput(f"{self.paths['cache_seqlens']}: expected int32/int64 of shape [{self.B}]")
        self.lens = lens.astype(np.int64)
        table = self.arrays["block_table"]
        self.paged = table is not None
        if self.paged:
            self.page = kc.shape[2]
            if table.ndim != 2 or table.shape[0] != self.B:
                raise BadInput(f"{self.paths['block_table']}: expected shape [B, max_blocks], got {list(table.shape)}")
            self.table = table.astype(np.int64)
            self.S_max = table.shape[1] * self.page
        else:
            self.page, self.table, self.S_max = 0, None, kc.shape[2]
        bad = np.nonzero((self.lens < 0) | (self.lens + self.S_new > self.S_max))[0]
        if bad.size:
            b = int(bad[0])
            raise BadInput(f"{self.paths['cache_seqlens']}: cache_seqlens[{b}] = {self.lens[b]} plus S_new = "
                           f"{self.S_new} does not fit the cache's {self.S_max} positions")

    def cache_index(self, b, j):
        """(outer index, row) of logical cache positions j (an array) of batch element b."""
        if not self.paged:
            return np.full_like(j, b), j
        return self.table[b, j // self.page], j % self.page

    def rows(self, which, b, g, dtype):
        """Keys (which = 'K') or values ('V') of (b, g) after the step: [L_b, D] float64."""
        c = int(self.lens[b])
        cache = self.arrays[which + "_cache"]
        outer, row = self.cache_index(b, np.arange(c))
        old = cache[outer, g, row] if c else np.zeros((0, self.D), dtype=cache.dtype)
        new = self.arrays[which.lower() + "_new"][b, g]
        return reference_common.round_to(np.concatenate([reference_common.to_f64(old), reference_common.to_f64(new)]), dtype)


def compute(p, dtype, scale):
    """O [B, H, S_new, D] and lse [B, H, S_new], float64."""
    G = p.H // p.H_kv
    o = np.zeros((p.B, p.H, p.S_new, p.D))
    lse = np.zeros((p.B, p.H, p.S_new))
    q_all = reference_common.round_to(reference_common.to_f64(p.arrays["q"]), dtype)
    for b in range(p.B):
        c = int(p.lens[b])
        limit = c + np.arange(p.S_new)  # last key each new token sees
        for g in range(p.H_kv):
            k, v = p.rows("K", b, g, dtype), p.rows("V", b, g, dtype)
            vis = np.arange(c + p.S_new)[None, :] <= limit[:, None]  # [S_new, L]
            for h in range(g * G, (g + 1) * G):
                s = np.where(vis, scale * (q_all[b, h] @ k.T), -math.inf)
                m = s.max(axis=1)
                e = np.exp(s - m[:, None])
                total = e.sum(axis=1)
                o[b, h] = (e / total[:, None]) @ v
                lse[b, h] = m + np.log(total)
    return o, lse


def expected_cache(p, which, dtype):
    """The cache after the step (stored shape, rounded to `dtype`): new rows at the cache length."""
    out = reference_common.round_to(reference_common.to_f64(p.arrays[which + "_cache"]), dtype)
    new = reference_common.round_to(reference_common.to_f64(p.arrays[which.lower() + "_new"]), dtype)
    for b in range(p.B):
        j = int(p.lens[b]) + np.arange(p.S_new)
        outer, row = p.cache_index(b, j)
        for g in range(p.H_kv):
            out[outer, g, row] = new[b, g]
    return out


def exact(name, out, want):
    same = np.array_equal(out, want, equal_nan=True)
    n = int(np.count_nonzero(~((out == want) | (np.isnan(out) & np.isnan(want)))))
    return {"name": name, "limit": 0.0, "count": int(out.size), "max_abs": float(np.nanmax(np.abs(out - want))) if out.size else 0.0,
            "mean_abs": 0.0, "mse": 0.0, "max_rel": 0.0, "rel_l2": 0.0, "mismatches": n,
            "failures": [] if same else [f"{n} elements differ from the input cache with the new rows appended"],
            "passed": same}


def check_out_dir(data_dir, out_dir, args):
    settings, timing_path = reference_common.settings_from_timing(out_dir)
    p = DecodeData(data_dir)
    dtype = args.dtype or settings.dtype or p.stored_dtype
    if dtype == "fp64":
        dtype = "fp32"  # no decode kernel computes in fp64
    scale = args.scale if args.scale is not None else settings.scale
    if scale is None:
        scale = 1.0 / math.sqrt(p.D)
    out = reference_common.Directory(out_dir)
    expected = {"O": (dtype, [p.B, p.H, p.S_new, p.D]), "lse": ("fp32", [p.B, p.H, p.S_new]),
                "K_cache": (dtype, list(p.arrays["K_cache"].shape)), "V_cache": (dtype, list(p.arrays["V_cache"].shape))}
    outputs = {}
    for name, (dt, shape) in expected.items():
        arr, path = out.read(name, lambda path, s=(dt, shape): s)
        if arr is None:
            continue
        if list(arr.shape) != shape:
            raise BadInput(f"{path}: shape {list(arr.shape)}, expected {shape}")
        outputs[name] = reference_common.to_f64(arr)
    if "O" not in outputs and "lse" not in outputs:
        raise BadInput(f"{out_dir}: no outputs to check (expected O and lse as .npy or .bin)")
    o, lse = compute(p, dtype, scale)
    limit = args.max_rel_l2 if args.max_rel_l2 is not None else reference_common.DEFAULT_MAX_REL_L2[dtype]
    results = []
    if "O" in outputs:
        results.append(reference_common.metrics("O", outputs["O"], o, limit))
    if "lse" in outputs:
        results.append(reference_common.metrics("lse", outputs["lse"], lse, limit))
    for name in ("K_cache", "V_cache"):
        if name in outputs:
            results.append(exact(name, outputs[name], expected_cache(p, name[0], dtype)))
    dims = {"B": p.B, "H": p.H, "H_kv": p.H_kv, "S_q": p.S_new, "S_k": p.S_max, "D": p.D}
    return {"data": data_dir, "out": out_dir, "timing": timing_path, "kernel": settings.kernel, "dtype": dtype,
            "layout": "bhsd", "dims": dims, "causal": True, "window": [-1, -1], "scale": scale, "mask": False,
            "seqlens_k": True, "dO": None, "reference": "numpy fp64 (decode)",
            "decode": {"S_new": p.S_new, "S_max": p.S_max, "paged": p.paged, "page_size": p.page,
                       "cache_seqlens": [int(x) for x in p.lens]},
            "outputs": results, "passed": all(r["passed"] for r in results)}
