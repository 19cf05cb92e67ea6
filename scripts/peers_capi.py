"""libflashattn_capi through ctypes: what peers.py shares with flashattn (include/flashattn/capi.h).

    capi = peers_capi.load(cli_path)      # --capi PATH, FLASHATTN_CAPI, the build directories
    hold, flush = capi.hold(), capi.flush()
    capi.fill_normal(ptr, "bf16", n, seed, peers_capi.TENSOR_IDS["Q"], stream)
    check = capi.check_attention(problem, {"Q": q, "K": k, "V": v, "O": o})   # the "check" object

The library runs the driver's own code: the stream hold and L2 flush of its timing loop, the
counter-based N(0, 1) generator of `flashattn --sweep`, and `--check`'s validator. Every call that
fails raises CApiError with fa_last_error()'s text. Streams are passed as integers (CUstream
handles, e.g. torch.cuda.current_stream().cuda_stream); host tensors as numpy arrays, whose sizes
are checked against the problem here because the library only sees raw pointers.
"""

import ctypes
import json
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = "libflashattn_capi.so"
NOT_FOUND = (f"peers.py: {LIBRARY} not found (build flashattn first, or pass --capi PATH / set FLASHATTN_CAPI)")
CAPI_VERSION = 1

DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}
ITEM_SIZES = {"fp32": 4, "fp16": 2, "bf16": 2}
TENSOR_IDS = {"Q": 1, "K": 2, "V": 3, "dO": 4}  # the generator's tensor ids in flashattn's sweeps
# fa_check_attention's pointer slots, in order.
CHECK_SLOTS = ("Q", "K", "V", "dO", "O", "lse", "dQ", "dK", "dV", "seqlens_k", "mask")


class CApiError(Exception):
    """A library call failed; the message is fa_last_error()'s. (Not a RuntimeError, so that it is
    never mistaken for PyTorch refusing a problem.)"""


def candidates(cli_path=None):
    """Where the library is looked for, first match wins."""
    paths = [cli_path, os.environ.get("FLASHATTN_CAPI")]
    build = os.environ.get("FLASHATTN_BUILD_DIR")
    if build:
        paths.append(os.path.join(build, LIBRARY))
    paths += [os.path.join(ROOT, "build-gpu", LIBRARY), os.path.join(ROOT, "build", LIBRARY)]
    return [p for p in paths if p]


def find(cli_path=None):
    """The library's path, or None. An explicit --capi PATH is the only candidate when given."""
    for path in [cli_path] if cli_path else candidates():
        if os.path.isfile(path):
            return path
    return None


def load(cli_path=None):
    """The library as a CApi. CApiError with the one line to print when there is none (NOT_FOUND)
    or it does not load."""
    path = find(cli_path)
    if path is None:
        raise CApiError(NOT_FOUND)
    try:
        return CApi(path)
    except (OSError, CApiError) as e:
        raise CApiError(f"peers.py: {path}: {e}")


def _declare(lib):
    c = ctypes
    sigs = {
        "fa_capi_version": ([], c.c_int),
        "fa_last_error": ([], c.c_char_p),
        "fa_hold_create": ([], c.c_void_p),
        "fa_hold_enqueue": ([c.c_void_p, c.c_void_p, c.c_double], c.c_int),
        "fa_hold_release": ([c.c_void_p], c.c_int),
        "fa_hold_timeouts": ([c.c_void_p], c.c_longlong),
        "fa_hold_destroy": ([c.c_void_p], None),
        "fa_flush_create": ([c.c_longlong], c.c_void_p),
        "fa_flush_enqueue": ([c.c_void_p, c.c_void_p], c.c_int),
        "fa_flush_bytes": ([c.c_void_p], c.c_longlong),
        "fa_flush_destroy": ([c.c_void_p], None),
        "fa_fill_normal": ([c.c_void_p, c.c_int, c.c_longlong, c.c_ulonglong, c.c_ulonglong, c.c_void_p], c.c_int),
        # A char* kept as a void pointer: ctypes would copy a c_char_p result and lose the pointer
        # that fa_free needs.
        "fa_check_attention": ([c.c_char_p, c.POINTER(c.c_void_p)], c.c_void_p),
        "fa_free": ([c.c_void_p], None),
    }
    # A checker keeps the reference of one problem for several sets of outputs (every backend of a
    # point); optional, so an older library still works through fa_check_attention.
    optional = {
        "fa_checker_create": ([c.c_char_p, c.POINTER(c.c_void_p)], c.c_void_p),
        "fa_checker_check": ([c.c_void_p, c.POINTER(c.c_void_p)], c.c_void_p),
        "fa_checker_destroy": ([c.c_void_p], None),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    for name, (args, res) in optional.items():
        if hasattr(lib, name):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res


class CApi:
    """The loaded library. hold() and flush() make the timing loop's device objects."""

    def __init__(self, path):
        self.path = path
        self.lib = ctypes.CDLL(path)
        _declare(self.lib)
        version = self.lib.fa_capi_version()
        if version != CAPI_VERSION:
            raise CApiError(f"C API version {version}, peers.py speaks version {CAPI_VERSION} (rebuild flashattn)")

    def _error(self, what):
        msg = self.lib.fa_last_error()
        return CApiError(f"{what}: {msg.decode(errors='replace') if msg else 'failed'}")

    def _ok(self, rc, what):
        if rc != 0:
            raise self._error(what)

    def hold(self):
        handle = self.lib.fa_hold_create()
        if not handle:
            raise self._error("fa_hold_create")
        return Hold(self, handle)

    def flush(self, l2_bytes=0):
        handle = self.lib.fa_flush_create(l2_bytes)
        if not handle:
            raise self._error("fa_flush_create")
        return Flush(self, handle)

    def fill_normal(self, ptr, dtype, n, seed, tensor, stream):
        """n elements of dtype at device pointer ptr: element i of `tensor` is N(0, 1) from (seed, tensor, i)."""
        self._ok(self.lib.fa_fill_normal(ptr, DTYPE_CODES[dtype], n, seed, tensor, stream), "fa_fill_normal")

    def _pointers(self, problem, tensors):
        """The C pointer array of CHECK_SLOTS for host tensors (name -> numpy array or None), each
        checked against the problem's sizes; returns (pointers, arrays kept alive)."""
        unknown = set(tensors) - set(CHECK_SLOTS)
        if unknown:
            raise ValueError(f"check_attention: unknown tensor '{sorted(unknown)[0]}'")
        arrays = {n: np.ascontiguousarray(a) for n, a in tensors.items() if a is not None}
        for name, a in arrays.items():
            want_n, want_size = expected_size(problem, name)
            if a.size != want_n or a.itemsize != want_size:
                raise CApiError(f"check_attention: {name} has {a.size} elements of {a.itemsize} bytes, the problem "
                                f"needs {want_n} of {want_size}")
        ptrs = (ctypes.c_void_p * len(CHECK_SLOTS))(*[arrays[n].ctypes.data if n in arrays else None
                                                      for n in CHECK_SLOTS])
        return ptrs, arrays

    def _json_result(self, text, what):
        if not text:
            raise self._error(what)
        try:
            return json.loads(ctypes.string_at(text).decode())
        finally:
            self.lib.fa_free(text)

    def check_attention(self, problem, tensors):
        """--check of host tensors (name -> numpy array or None; CHECK_SLOTS) against the problem (a
        dict, capi.h's fields). Returns the parsed "check" object."""
        ptrs, _keep = self._pointers(problem, tensors)
        return self._json_result(self.lib.fa_check_attention(json.dumps(problem).encode(), ptrs), "fa_check_attention")

    def checker(self, problem, inputs):
        """A Checker for one problem's inputs (Q, K, V, dO, seqlens_k, mask), or None when the
        library has no fa_checker_* (then check_attention serves each set of outputs)."""
        if not hasattr(self.lib, "fa_checker_create"):
            return None
        ptrs, _keep = self._pointers(problem, inputs)
        handle = self.lib.fa_checker_create(json.dumps(problem).encode(), ptrs)
        if not handle:
            raise self._error("fa_checker_create")
        return Checker(self, handle, problem)


def expected_size(problem, name):
    """(element count, bytes per element) of tensor `name` for a check problem."""
    B, H, H_kv, S_q, S_k, D = (int(problem[n]) for n in ("B", "H", "H_kv", "S_q", "S_k", "D"))
    es = ITEM_SIZES[problem["dtype"]]
    if name in ("Q", "dO", "O", "dQ"):
        return B * H * S_q * D, es
    if name in ("K", "V", "dK", "dV"):
        return B * H_kv * S_k * D, es
    if name == "lse":
        return B * H * S_q, 4
    if name == "seqlens_k":
        return B, 4
    shape = problem.get("mask_shape")
    if shape is None:
        raise CApiError("check_attention: a mask needs the problem's mask_shape")
    return int(np.prod(shape)), 4


class Checker:
    """The reference and baseline of one problem, computed at the first check and reused."""

    def __init__(self, capi, handle, problem):
        self.capi, self.handle, self.problem = capi, handle, problem

    def check(self, outputs):
        ptrs, _keep = self.capi._pointers(self.problem, outputs)
        return self.capi._json_result(self.capi.lib.fa_checker_check(self.handle, ptrs), "fa_checker_check")

    def close(self):
        if self.handle:
            self.capi.lib.fa_checker_destroy(self.handle)
            self.handle = None

    def __del__(self):
        self.close()


class Hold:
    """A stream hold: enqueue() blocks the stream until release() (or timeout_s, counted)."""

    def __init__(self, capi, handle):
        self.capi, self.handle = capi, handle

    def enqueue(self, stream, timeout_s):
        self.capi._ok(self.capi.lib.fa_hold_enqueue(self.handle, stream, timeout_s), "fa_hold_enqueue")

    def release(self):
        self.capi._ok(self.capi.lib.fa_hold_release(self.handle), "fa_hold_release")

    def timeouts(self):
        n = self.capi.lib.fa_hold_timeouts(self.handle)
        if n < 0:
            raise self.capi._error("fa_hold_timeouts")
        return n

    def close(self):
        if self.handle:
            self.capi.lib.fa_hold_destroy(self.handle)
            self.handle = None


class Flush:
    """The L2 flush: write one buffer then read another, each twice the L2 size (L2 left clean)."""

    def __init__(self, capi, handle):
        self.capi, self.handle = capi, handle

    def enqueue(self, stream):
        self.capi._ok(self.capi.lib.fa_flush_enqueue(self.handle, stream), "fa_flush_enqueue")

    def nbytes(self):
        return self.capi.lib.fa_flush_bytes(self.handle)

    def close(self):
        if self.handle:
            self.capi.lib.fa_flush_destroy(self.handle)
            self.handle = None
