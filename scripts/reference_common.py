"""What the fp64 references (reference.py, decode_reference.py) and the PyTorch peers share: the
files of a data directory (.npy, .bin with meta.json), dtype names, rounding fp64 values once to a
compute dtype, the run settings a timing.json records, and the error metrics and their limits.
Imports nothing of this project, so every script can import it without a cycle.
"""

import json
import math
import os

import numpy as np

DEFAULT_MAX_REL_L2 = {"fp64": 1e-12, "fp32": 1e-5, "fp16": 4e-3, "bf16": 3e-2}
FLOAT_DTYPES = ("fp32", "fp16", "bf16", "fp64")
DTYPE_ALIASES = {"fp32": "fp32", "float32": "fp32", "f32": "fp32", "fp16": "fp16", "float16": "fp16",
                 "f16": "fp16", "bf16": "bf16", "bfloat16": "bf16", "fp64": "fp64", "float64": "fp64",
                 "f64": "fp64", "int32": "int32", "int64": "int64"}


class BadInput(Exception):
    """Bad input: the message is one line that starts with the file (or option) at fault."""


# ---------------------------------------------------------------------------------------------
# Reading files

def bfloat16_type(origin):
    try:
        import ml_dtypes
    except ImportError:
        raise BadInput(f"{origin}: bf16 data needs the ml_dtypes package (pip install ml_dtypes)")
    return np.dtype(ml_dtypes.bfloat16)


def numpy_dtype(name, origin):
    if name == "bf16":
        return bfloat16_type(origin)
    return np.dtype({"fp32": "<f4", "fp16": "<f2", "fp64": "<f8", "int32": "<i4", "int64": "<i8"}[name])


def dtype_name_of(arr, origin):
    if arr.dtype.name == "bfloat16":
        return "bf16"
    names = {"float32": "fp32", "float16": "fp16", "float64": "fp64", "int32": "int32", "int64": "int64"}
    if arr.dtype.name not in names:
        raise BadInput(f"{origin}: unsupported dtype {arr.dtype}")
    return names[arr.dtype.name]


def read_npy(path):
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as e:  # numpy raises several types for malformed files
        raise BadInput(f"{path}: cannot read as .npy ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    if arr.dtype.kind == "V" and arr.dtype.itemsize == 2 and arr.dtype.names is None:
        arr = arr.view(bfloat16_type(path))  # how numpy stores ml_dtypes.bfloat16
    if arr.dtype.byteorder == ">":
        raise BadInput(f"{path}: big-endian data is not supported")
    dtype_name_of(arr, path)
    return arr


def read_bin(path, dtype, shape):
    dt = numpy_dtype(dtype, path)
    need = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    have = os.path.getsize(path)
    if have != need:
        raise BadInput(f"{path}: {have} bytes, but {dtype} {list(shape)} needs {need}")
    return np.fromfile(path, dtype=dt).reshape(shape)


def find_file(directory, name):
    """NAME.npy or NAME.bin in directory (not both), or None."""
    npy, bin_ = os.path.join(directory, name + ".npy"), os.path.join(directory, name + ".bin")
    has_npy, has_bin = os.path.isfile(npy), os.path.isfile(bin_)
    if has_npy and has_bin:
        raise BadInput(f"{directory}: both {name}.npy and {name}.bin exist; keep one")
    return npy if has_npy else bin_ if has_bin else None


def read_json(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: invalid JSON ({str(e).splitlines()[0]})")
    if not isinstance(value, dict):
        raise BadInput(f"{path}: expected a JSON object")
    return value


def positive_int(meta, field, path):
    v = meta.get(field)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise BadInput(f"{path}: field '{field}' must be a positive integer")
    return v


class Directory:
    """A data or output directory: finds NAME.npy / NAME.bin and reads them."""

    def __init__(self, path):
        self.path = path
        meta_path = os.path.join(path, "meta.json")
        self.meta_path = meta_path
        self.meta = read_json(meta_path) if os.path.isfile(meta_path) else None
        if self.meta is not None and self.meta.get("format_version", 1) != 1:
            raise BadInput(f"{meta_path}: field 'format_version' must be 1")

    def meta_layout(self):
        if self.meta is None or "layout" not in self.meta:
            return None
        if self.meta["layout"] not in ("bhsd", "bshd"):
            raise BadInput(f"{self.meta_path}: field 'layout' must be \"bhsd\" or \"bshd\"")
        return self.meta["layout"]

    def file_spec(self, name):
        """(dtype, shape) that meta.json gives for NAME.bin, each possibly None."""
        files = (self.meta or {}).get("files", {})
        if not isinstance(files, dict):
            raise BadInput(f"{self.meta_path}: field 'files' must be an object")
        entry = files.get(name, {})
        dtype, shape = entry.get("dtype"), entry.get("shape")
        if dtype is not None:
            if dtype not in DTYPE_ALIASES:
                raise BadInput(f"{self.meta_path}: field 'files.{name}.dtype' must be a dtype name")
            dtype = DTYPE_ALIASES[dtype]
        if shape is not None and (not isinstance(shape, list) or
                                  not all(isinstance(s, int) and s >= 0 for s in shape)):
            raise BadInput(f"{self.meta_path}: field 'files.{name}.shape' must be a list of non-negative integers")
        return dtype, shape

    def read(self, name, default_spec):
        """Reads NAME (None if absent). default_spec() gives (dtype, shape) for a .bin that
        meta.json does not describe."""
        path = find_file(self.path, name)
        if path is None:
            return None, None
        if path.endswith(".npy"):
            return read_npy(path), path
        dtype, shape = self.file_spec(name)
        if dtype is None or shape is None:
            d_dtype, d_shape = default_spec(path)
            dtype, shape = dtype or d_dtype, shape if shape is not None else d_shape
        return read_bin(path, dtype, shape), path


# ---------------------------------------------------------------------------------------------
# The problem: inputs, settings

def bhsd(arr, layout):
    """[B, H, S, D] view of a tensor stored in `layout`."""
    return arr if layout == "bhsd" else arr.transpose(0, 2, 1, 3)


def stored_shape(layout, B, heads, S, D):
    return [B, heads, S, D] if layout == "bhsd" else [B, S, heads, D]


def to_f64(arr):
    return np.asarray(arr).astype(np.float64)


def round_to(x, dtype):
    """x (float64) rounded once to `dtype`, as float64."""
    if dtype == "fp64":
        return x
    if dtype == "fp32":
        return x.astype(np.float32).astype(np.float64)
    # Round to odd in float32 first: with 13+ spare bits, rounding that to nearest in fp16/bf16
    # gives the correctly rounded result of x (double -> float -> half directly can round twice).
    f = x.astype(np.float32)
    inexact = f.astype(np.float64) != x
    away = np.abs(f.astype(np.float64)) > np.abs(x)
    bits = f.view(np.uint32).copy()
    bits[inexact & away] -= 1  # one step toward zero (same sign: magnitude is in the low bits)
    bits[inexact] |= 1
    f = bits.view(np.float32)
    f = np.where(np.isnan(x), np.float32("nan"), f)
    if dtype == "fp16":
        return f.astype(np.float16).astype(np.float64)
    return f.astype(bfloat16_type("--dtype bf16")).astype(np.float64)


class Settings:
    def __init__(self):
        self.dtype = None  # compute dtype
        self.layout = None
        self.causal = False
        self.window = (-1, -1)
        self.scale = None
        self.modes = None  # set of "forward" / "backward" the run produced
        self.kernel = None
        self.use_mask = None  # None: whatever the data has
        self.use_seqlens = None


def settings_from_timing(out_dir):
    s = Settings()
    path = os.path.join(out_dir, "timing.json")
    if not os.path.isfile(path):
        return s, None
    doc = read_json(path)
    runs = doc.get("runs")
    if not isinstance(runs, list):
        raise BadInput(f"{path}: expected a top-level 'runs' list")
    runs = [r for r in runs if isinstance(r, dict) and r.get("status", "ok") == "ok"]
    if not runs:
        return s, path
    first = runs[0]
    flags = first.get("flags", {})
    try:
        s.kernel = first.get("kernel")
        if first.get("dtype") is not None:
            s.dtype = DTYPE_ALIASES[first["dtype"]]
        s.layout = first.get("layout")
        s.causal = bool(flags.get("causal", False))
        s.window = (int(flags.get("window_left", -1)), int(flags.get("window_right", -1)))
        s.scale = float(flags["scale"]) if flags.get("scale") is not None else None
        s.use_mask = flags.get("mask")
        s.use_seqlens = flags.get("seqlens_k")
        s.modes = {r.get("mode") for r in runs}
    except (KeyError, TypeError, ValueError) as e:
        raise BadInput(f"{path}: malformed run settings ({e})")
    return s, path


def metrics(name, out, ref, limit):
    """Error statistics of out against ref (float64 arrays of one shape) and the verdict."""
    r = {"name": name, "limit": limit, "failures": []}
    nan = int(np.isnan(out).sum())
    if nan:
        r["failures"].append(f"{nan} NaN")
    ref_ninf = np.isneginf(ref)
    if name == "lse":
        pattern = int((ref_ninf != np.isneginf(out)).sum())
        if pattern:
            r["failures"].append(f"{pattern} entries where -inf differs from the reference")
    sel = np.isfinite(ref) & ~np.isnan(out)
    if name == "lse":
        sel &= ~ref_ninf
    nonfinite = int((sel & ~np.isfinite(out)).sum())
    if nonfinite:
        r["failures"].append(f"{nonfinite} non-finite values where the reference is finite")
    sel &= np.isfinite(out)
    o, f = out[sel], ref[sel]
    diff = np.abs(o - f)
    r["count"] = int(sel.sum())
    r["max_abs"] = float(diff.max()) if diff.size else 0.0
    r["mean_abs"] = float(diff.mean()) if diff.size else 0.0
    r["mse"] = float((diff ** 2).mean()) if diff.size else 0.0
    ref_max = float(np.abs(f).max()) if f.size else 0.0
    floor = max(1e-3 * ref_max, np.finfo(np.float64).tiny)
    r["max_rel"] = float((diff / np.maximum(np.abs(f), floor)).max()) if diff.size else 0.0
    norm_ref, norm_diff = float(np.linalg.norm(f)), float(np.linalg.norm(diff))
    r["rel_l2"] = norm_diff / norm_ref if norm_ref > 0 else (0.0 if norm_diff == 0 else math.inf)
    if not r["rel_l2"] <= limit:
        r["failures"].append(f"rel L2 {r['rel_l2']:.3g} > {limit:.3g}")
    r["passed"] = not r["failures"]
    return r
