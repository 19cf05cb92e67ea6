"""The bad-input catalogue: the ways a data directory, an option or the output directory can be
wrong, and what flashattn does about each. Every case builds its data directory in a temporary
directory (numpy and hand-written bytes), checksums every input file, runs flashattn on the cpu
kernel (so CI needs no GPU) and asserts:

  - the documented exit code (2: usage or input error, 1: failure while writing outputs);
  - exactly one line on stderr, naming the file (or option) and the problem;
  - every input file unchanged, and no file added to the data directory;
  - no output file, partial or temporary, left in the output directory.

The table "Bad input" in data/README.md lists the same cases by id; a test keeps the two in step.
"""
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

BUILD = os.environ.get("FLASHATTN_BUILD_DIR", "")
FLASHATTN = Path(BUILD) / "flashattn"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not (BUILD and FLASHATTN.exists()), reason="set FLASHATTN_BUILD_DIR to a build with flashattn"
)

INPUT = 2
RUNTIME = 1

# ---- building data directories ------------------------------------------------------------------

B, H, S, D = 1, 2, 8, 4


def arr(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def good(d, q=None, k=None, v=None, **extra):
    """A valid forward problem [1, 2, 8, 4] in `d`; keyword arrays replace or add files."""
    d.mkdir(parents=True, exist_ok=True)
    files = {"Q": arr((B, H, S, D), seed=1), "K": arr((B, H, S, D), seed=2), "V": arr((B, H, S, D), seed=3)}
    for name, a in [("Q", q), ("K", k), ("V", v)] + list(extra.items()):
        if a is not None:
            files[name] = a
    for name, a in files.items():
        np.save(d / f"{name}.npy", a)
    return d


def npy_bytes(header, data=b"", version=1, magic=b"\x93NUMPY"):
    """A .npy file with a hand-written header dict and data."""
    h = header.encode("utf-8") if isinstance(header, str) else header
    length = struct.pack("<H", len(h)) if version == 1 else struct.pack("<I", len(h))
    return magic + bytes([version, 0]) + length + h + data


def with_q_bytes(data):
    """A case whose Q.npy is replaced by `data` (bytes or a function of the valid file's bytes)."""

    def build(tmp):
        d = good(tmp / "data")
        valid = (d / "Q.npy").read_bytes()
        (d / "Q.npy").write_bytes(data(valid) if callable(data) else data)
        return d, []

    return build


def q_header(header, version=1, data=b"\0" * (B * H * S * D * 4)):
    return with_q_bytes(npy_bytes(header, data, version))


def with_arrays(args=(), **arrays):
    def build(tmp):
        return good(tmp / "data", **arrays), list(args)

    return build


def bin_dir(name="data", meta=None, sizes=(B, H, S, D), nbytes=None):
    """A .bin directory: fp32 bhsd Q, K, V of `sizes`, described by `meta` (a dict, raw text, or
    None for none: the directory name must then describe the shapes)."""

    def build(tmp):
        d = tmp / name
        d.mkdir(parents=True)
        n = int(np.prod(sizes)) * 4 if nbytes is None else nbytes
        for f in "QKV":
            (d / f"{f}.bin").write_bytes(b"\0" * n)
        if meta is not None:
            (d / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
        return d, []

    return build


def options(*args, data=True):
    def build(tmp):
        return (good(tmp / "data") if data else tmp / "missing"), list(args)

    return build


# ---- the catalogue ------------------------------------------------------------------------------

META = {"B": B, "H": H, "S": S, "D": D}
QF = arr((B, H, S, D), seed=1)


def q_with(index, value):
    q = QF.copy()
    q[index] = value
    return q


def fifo_q(tmp):
    d = good(tmp / "data")
    (d / "Q.npy").unlink()
    os.mkfifo(d / "Q.npy")
    return d, []


def q_is_directory(tmp):
    d = good(tmp / "data")
    (d / "Q.npy").unlink()
    (d / "Q.npy").mkdir()
    return d, []


def missing_q(tmp):
    d = good(tmp / "data")
    (d / "Q.npy").unlink()
    return d, []


def both_formats(tmp):
    d = good(tmp / "data")
    (d / "Q.bin").write_bytes(QF.tobytes())
    return d, []


def mixed_formats(tmp):
    d = good(tmp / "data")
    for f in "KV":
        (d / f"{f}.bin").write_bytes(np.load(d / f"{f}.npy").tobytes())
        (d / f"{f}.npy").unlink()
    return d, []


def data_is_file(tmp):
    f = tmp / "data"
    f.write_bytes(b"x")
    return f, []


def layout_conflict(tmp):
    d = good(tmp / "data")
    (d / "meta.json").write_text('{"layout": "bhsd"}')
    return d, ["--layout", "bshd"]


def dirname_bshd(tmp):
    d, _ = bin_dir(f"B{B}_H{H}_S{S}_D{D}")(tmp)
    return d, ["--layout", "bshd"]


def big_endian(tmp):
    return good(tmp / "data", q=QF.astype(">f4")), []


def fortran(tmp):
    d = good(tmp / "data")
    np.save(d / "Q.npy", np.asfortranarray(QF))
    return d, []


def object_array(tmp):
    d = good(tmp / "data")
    np.save(d / "Q.npy", np.array([1, "a", None], dtype=object), allow_pickle=True)
    return d, []


def structured(tmp):
    return good(tmp / "data", q=np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")])), []


def unsupported_dtype_for_kernel(tmp):
    kernel = kernel_with(lambda e: "fp64" not in e["dtypes"] and e["mode"] == "forward")
    return good(tmp / "data"), ["--compute", kernel, "--dtype", "fp64"]


def unsupported_head_dim_for_kernel(tmp):
    entry = entry_with(lambda e: e["mode"] == "forward" and (e["head_dims"] or e["max_head_dim"]))
    allowed = set(entry["head_dims"]) if entry["head_dims"] else set(range(1, entry["max_head_dim"] + 1))
    bad = next(x for x in (7, 3, 5, 9, 1000) if x not in allowed)
    a = lambda seed: arr((1, 1, 4, bad), seed=seed)  # noqa: E731
    # In a dtype the kernel takes, so that the head dim is the only problem.
    dtype = next(t for t in ("fp32", "bf16", "fp16") if t in entry["dtypes"])
    return good(tmp / "data", q=a(1), k=a(2), v=a(3)), ["--compute", entry["kernel"], "--dtype", dtype]


def out_is_input(tmp):
    d = good(tmp / "data")
    return d, ["--out", str(d)]


def out_is_input_via_symlink(tmp):
    d = good(tmp / "data")
    (tmp / "link").symlink_to(d, target_is_directory=True)
    return d, ["--out", str(tmp / "link")]


def out_under_file(tmp):
    d = good(tmp / "data")
    (tmp / "file").write_text("x")
    return d, ["--out", str(tmp / "file" / "sub")]


def out_is_file(tmp):
    d = good(tmp / "data")
    (tmp / "file").write_text("x")
    return d, ["--out", str(tmp / "file")]


def out_read_only(tmp):
    if os.geteuid() == 0:
        pytest.skip("permissions do not apply to root (out_under_file covers an unwritable --out)")
    d = good(tmp / "data")
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o500)
    return d, ["--out", str(tmp / "ro" / "out")]


def json_dir_missing(tmp):
    return good(tmp / "data"), ["--json", str(tmp / "nowhere" / "run.json")]


# (id, build(tmp) -> (data dir, extra args), exit code, substrings of the error line)
CASES = [
    # .npy files
    ("npy-wrong-magic", with_q_bytes(lambda b: b"\x93NUMPX" + b[6:]), INPUT, ["Q.npy", "bad magic"]),
    ("npy-empty-file", with_q_bytes(b""), INPUT, ["Q.npy", "truncated .npy header (0 bytes)"]),
    ("npy-truncated-header", with_q_bytes(lambda b: b[:40]), INPUT, ["Q.npy", "truncated .npy header"]),
    ("npy-header-length-lies", with_q_bytes(lambda b: b[:8] + struct.pack("<H", 60000) + b[10:]), INPUT,
     ["Q.npy", "truncated .npy header (needs 60010 bytes"]),
    ("npy-unknown-version", with_q_bytes(lambda b: b[:6] + bytes([4, 0]) + b[8:]), INPUT,
     ["Q.npy", "unsupported .npy version 4.0"]),
    ("npy-corrupt-dict", q_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 8, 4)\n"), INPUT,
     ["Q.npy", "malformed .npy header"]),
    ("npy-unknown-key", q_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 8, 4), 'x': 1}\n"),
     INPUT, ["Q.npy", "unexpected key 'x'"]),
    ("npy-v3-utf8-field-name", q_header("{'descr': [('\u00e9t\u00e9', '<f4')], 'fortran_order': False, "
                                        "'shape': (64,), }\n", version=3), INPUT,
     ["Q.npy", "structured dtypes are not supported"]),
    ("npy-v3-utf8-descr", q_header("{'descr': '<f4\u00e9', 'fortran_order': False, 'shape': (1, 2, 8, 4), }\n",
                                   version=3), INPUT, ["Q.npy", "unsupported dtype '<f4\\xc3\\xa9'"]),
    ("npy-newline-in-descr", q_header("{'descr': '<f\n4', 'fortran_order': False, 'shape': (1, 2, 8, 4), }\n"),
     INPUT, ["Q.npy", "unsupported dtype '<f\\x0a4'"]),
    ("npy-big-endian", big_endian, INPUT, ["Q.npy", "'>f4' (big-endian)"]),
    ("npy-fortran-order", fortran, INPUT, ["Q.npy", "fortran_order=True"]),
    ("npy-object-dtype", object_array, INPUT, ["Q.npy", "object arrays"]),
    ("npy-structured-dtype", structured, INPUT, ["Q.npy", "structured dtypes are not supported"]),
    ("npy-complex-dtype", with_arrays(q=QF.astype(np.complex64)), INPUT, ["Q.npy", "unsupported dtype '<c8'"]),
    ("npy-int16-dtype", with_arrays(q=QF.astype(np.int16)), INPUT, ["Q.npy", "unsupported dtype '<i2'"]),
    ("npy-negative-dim", q_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, -8, 4), }\n"), INPUT,
     ["Q.npy", "negative dimension -8"]),
    ("npy-overflowing-shape", q_header("{'descr': '<f8', 'fortran_order': False, "
                                       "'shape': (4294967296, 4294967296), }\n"), INPUT, ["Q.npy", "absurd shape"]),
    ("npy-absurd-dim", q_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 1099511627776, 4), }\n"),
     INPUT, ["Q.npy", "truncated data"]),
    ("npy-truncated-data", with_q_bytes(lambda b: b[:-4]), INPUT, ["Q.npy", "truncated data"]),
    ("npy-trailing-bytes", with_q_bytes(lambda b: b + b"\0" * 4), INPUT, ["Q.npy", "4 trailing bytes"]),
    ("npy-is-a-directory", q_is_directory, INPUT, ["Q.npy", "is a directory"]),
    ("npy-is-a-fifo", fifo_q, INPUT, ["Q.npy", "not a regular file"]),
    # shapes and dtypes across files
    ("q-rank-3", with_arrays(q=arr((B, H, S))), INPUT, ["Q.npy", "expected rank 4"]),
    ("q-integer-dtype", with_arrays(q=QF.astype(np.int32)), INPUT, ["Q.npy", "int32 is not supported for Q"]),
    ("qkv-dtype-mismatch", with_arrays(k=arr((B, H, S, D), np.float16)), INPUT,
     ["K.npy is fp16", "must have the same dtype"]),
    ("kv-shape-mismatch", with_arrays(v=arr((B, H, S + 1, D))), INPUT, ["V.npy", "K and V must have the same shape"]),
    ("qk-batch-mismatch", with_arrays(k=arr((2, H, S, D)), v=arr((2, H, S, D))), INPUT,
     ["K.npy has B=2", "batch sizes must agree"]),
    ("qk-head-dim-mismatch", with_arrays(k=arr((B, H, S, 8)), v=arr((B, H, S, 8))), INPUT,
     ["K.npy has D=8", "head dims must agree"]),
    ("h-not-multiple-of-h-kv", with_arrays(q=arr((B, 4, S, D)), k=arr((B, 3, S, D)), v=arr((B, 3, S, D))), INPUT,
     ["K.npy has H_kv=3", "H must be a multiple of H_kv"]),
    ("zero-length-sequence", with_arrays(q=arr((B, H, 0, D))), INPUT, ["Q.npy", "S_q = 0"]),
    ("dO-shape-mismatch", with_arrays(["--mode", "backward"], dO=arr((B, H, S, 2 * D))), INPUT,
     ["dO.npy", "dO must have the shape of Q"]),
    ("seqlens-out-of-range", with_arrays(seqlens_k=np.array([S + 1], np.int32)), INPUT,
     ["seqlens_k.npy", "is outside [0, S_k]"]),
    ("seqlens-wrong-shape", with_arrays(seqlens_k=np.array([1, 2], np.int32)), INPUT,
     ["seqlens_k.npy", "expected shape [B]"]),
    ("mask-not-broadcastable", with_arrays(mask=np.zeros((3, S), np.float32)), INPUT,
     ["mask.npy", "does not broadcast"]),
    ("mask-nan", with_arrays(mask=np.full((S, S), np.nan, np.float32)), INPUT, ["mask.npy", "NaN at flat index 0"]),
    ("mask-plus-inf", with_arrays(mask=np.full((S, S), np.inf, np.float32)), INPUT, ["mask.npy", "+inf"]),
    # NaN and Inf in the inputs
    ("q-nan", with_arrays(q=q_with((0, 1, 5, 2), np.nan)), INPUT,
     ["Q.npy: 1 NaN value (first at [0, 1, 5, 2])", "--allow-nonfinite"]),
    ("k-inf", with_arrays(k=q_with((0, 0, 3, 1), -np.inf)), INPUT, ["K.npy: 1 Inf value (first at [0, 0, 3, 1])"]),
    ("dO-nan-backward", with_arrays(["--mode", "backward"], dO=q_with((0, 1, 7, 3), np.nan)), INPUT,
     ["dO.npy: 1 NaN value"]),
    ("fp16-overflow", with_arrays(["--dtype", "fp16"], q=q_with((0, 0, 2, 2), 7e4)), INPUT,
     ["Q.npy: 1 value overflows fp16", "--allow-nonfinite"]),
    # which files, in which format
    ("missing-q", missing_q, INPUT, ["missing Q"]),
    ("npy-and-bin-of-q", both_formats, INPUT, ["both Q.npy and Q.bin"]),
    ("mixed-formats", mixed_formats, INPUT, ["mix formats"]),
    ("data-dir-missing", options(data=False), INPUT, ["missing", "no such directory"]),
    ("data-dir-is-a-file", data_is_file, INPUT, ["data", "not a directory"]),
    # .bin files, meta.json and directory names
    ("meta-invalid-json", bin_dir(meta='{"B": 1, "H": '), INPUT, ["meta.json", "invalid JSON"]),
    ("meta-not-an-object", bin_dir(meta="[1, 2]"), INPUT, ["meta.json", "expected a JSON object"]),
    ("meta-missing-field", bin_dir(meta={"B": B, "H": H, "S": S}), INPUT, ["meta.json", "missing field 'D'"]),
    ("meta-wrong-type", bin_dir(meta={**META, "B": "1"}), INPUT, ["meta.json", "'B' must be a positive integer"]),
    ("meta-format-version", bin_dir(meta={**META, "format_version": 2}), INPUT,
     ["meta.json", "'format_version' must be 1"]),
    ("meta-bad-layout", bin_dir(meta={**META, "layout": "sbhd"}), INPUT, ["meta.json", "'layout' must be"]),
    ("meta-layout-conflict", layout_conflict, INPUT, ["meta.json", "conflicts with --layout bshd"]),
    ("meta-absurd-sizes", bin_dir(meta={**META, "B": 2 ** 40, "H": 2 ** 40}), INPUT, ["Q.bin", "invalid shape"]),
    ("bin-size-mismatch", bin_dir(meta=META, nbytes=100), INPUT, ["Q.bin", "file has 100 bytes"]),
    ("dirname-does-not-parse", bin_dir(f"B{B}_H{H}_S{S}"), INPUT, ["need meta.json or a directory named"]),
    ("dirname-leading-zero", bin_dir(f"B0{B}_H{H}_S{S}_D{D}"), INPUT, ["need meta.json or a directory named"]),
    ("dirname-with-bshd", dirname_bshd, INPUT, ["holds bhsd data"]),
    # options
    ("unknown-kernel", options("--compute", "nosuch"), INPUT, ["--compute", "unknown kernel 'nosuch'"]),
    ("all-with-names", options("--compute", "cpu,all"), INPUT, ["--compute", "'all' cannot be combined"]),
    ("no-write-with-out", lambda tmp: (good(tmp / "data"), ["--no-write", "--out", tmp / "out"]), INPUT,
     ["--out", "conflicts with --no-write"]),
    ("baseline-not-run", options("--baseline", "nosuch"), INPUT, ["--baseline", "'nosuch'"]),
    ("device-negative", options("--device", "-1"), INPUT, ["--device", "not in range 0 to 1023"]),
    ("min-time-negative", options("--min-time", "-5"), INPUT, ["--min-time"]),
    ("json-dir-missing", json_dir_missing, INPUT, ["--json", "is not a directory"]),
    ("dtype-unsupported-by-kernel", unsupported_dtype_for_kernel, INPUT, ["does not support dtype fp64"]),
    ("head-dim-unsupported-by-kernel", unsupported_head_dim_for_kernel, INPUT, ["does not support head dim"]),
    # the output directory
    ("out-is-the-input-dir", out_is_input, INPUT, ["--out", "is the input directory"]),
    ("out-is-the-input-dir-via-symlink", out_is_input_via_symlink, INPUT, ["--out", "is the input directory"]),
    ("out-under-a-regular-file", out_under_file, INPUT, ["--out", "file is not a directory"]),
    ("out-is-a-regular-file", out_is_file, INPUT, ["--out", "file is not a directory"]),
    ("out-read-only", out_read_only, INPUT, ["--out", "Permission denied"]),
]

_list_cache = []


def registry():
    if not _list_cache:
        _list_cache.append(json.loads(subprocess.run([str(FLASHATTN), "--list-json"], capture_output=True,
                                                     text=True, check=True).stdout))
    return _list_cache[0]


def entry_with(pred):
    for e in registry():
        if e["gpu"] and pred(e):
            return e
    pytest.skip("no registered GPU kernel has that restriction")


def kernel_with(pred):
    return entry_with(pred)["kernel"]


# ---- running and checking -----------------------------------------------------------------------

def digest(d):
    """Checksums of every file under d (a missing d, or a file d, digests as such)."""
    d = Path(d)
    if d.is_file():
        return {d.name: hashlib.sha256(d.read_bytes()).hexdigest()}
    if not d.exists():
        return {}
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_fifo():
            out[str(p.relative_to(d))] = "fifo"
        elif p.is_file():
            out[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p.relative_to(d))] = "dir" if p.is_dir() else "other"
    return out


def files_under(d):
    d = Path(d)
    return sorted(str(p) for p in d.rglob("*") if not p.is_dir()) if d.is_dir() else []


def run(args, preexec_fn=None):
    # A timeout: a reader that blocks (a FIFO opened for reading) must not hang the suite.
    return subprocess.run([str(FLASHATTN), *map(str, args)], capture_output=True, timeout=60,
                          preexec_fn=preexec_fn)


def check_refused(tmp, data, extra, code, needles, preexec_fn=None, out=None):
    out = out or tmp / "out"
    before = digest(data)
    args = ["--compute", "cpu", "--data", data]
    if "--out" not in extra and "--no-write" not in extra:
        args += ["--out", out]
    if "--compute" in extra:
        args = args[2:]
    p = run(args + extra, preexec_fn)
    err = p.stderr.decode("utf-8", errors="replace")
    assert p.returncode == code, f"exit {p.returncode}, expected {code}\nstderr:\n{err}"
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and "\r" not in err, f"expected one stderr line:\n{err}"
    assert lines[0].startswith("flashattn: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert digest(data) == before, "the inputs changed"
    assert files_under(out) == [], f"output files left behind: {files_under(out)}"
    assert not list(Path(tmp).rglob("*.tmp.*")), "temporary files left behind"
    return lines[0]


@pytest.mark.parametrize("case_id, build, code, needles", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_cleanly(tmp_path, case_id, build, code, needles):
    data, extra = build(tmp_path)
    check_refused(tmp_path, data, extra, code, needles)


def test_allow_nonfinite_runs_anyway_with_a_notice(tmp_path):
    d = good(tmp_path / "data", q=q_with((0, 1, 5, 2), np.nan))
    p = run(["--compute", "cpu", "--data", d, "--out", tmp_path / "out", "--allow-nonfinite"])
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert "Q.npy: 1 NaN value (first at [0, 1, 5, 2]); running anyway (--allow-nonfinite)" in err
    o = np.load(tmp_path / "out" / "O.npy")
    assert np.isnan(o[0, 1]).any() and np.isfinite(o[0, 0]).all()


def test_nonfinite_dO_does_not_matter_in_forward_mode(tmp_path):
    d = good(tmp_path / "data", dO=q_with((0, 0, 0, 0), np.nan))
    assert run(["--compute", "cpu", "--data", d, "--no-write"]).returncode == 0


# ---- a full disk: the run fails with exit 1, naming the output file, and leaves nothing ----------

def backward_data(tmp):
    # Big enough that the outputs do not fit in the limits below: O and dQ are 32 KiB each.
    return good(tmp / "data", q=arr((1, 4, 64, 32), seed=1), k=arr((1, 4, 64, 32), seed=2),
                v=arr((1, 4, 64, 32), seed=3), dO=arr((1, 4, 64, 32), seed=4))


def test_disk_full_file_size_limit(tmp_path):
    """Portable: RLIMIT_FSIZE makes write() fail with EFBIG (SIGXFSZ ignored) past 20000 bytes."""
    data = backward_data(tmp_path)

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))

    line = check_refused(tmp_path, data, ["--mode", "both"], RUNTIME, ["O.npy", "write failed", "File too large"],
                         preexec_fn=limit)
    assert line.startswith(f"flashattn: {tmp_path / 'out' / 'O.npy'}: ")
    assert not (tmp_path / "out").exists(), "the output directory it created is removed again"


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs, where mounting is allowed (root outside a locked-down container)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_tiny_tmpfs(tmp_path, tiny_tmpfs):
    """O and lse fit in 64 KiB, dQ does not: the files already written must go too."""
    data = backward_data(tmp_path)
    out = tiny_tmpfs / "out"
    line = check_refused(tmp_path, data, ["--mode", "both", "--out", out], RUNTIME,
                         ["dQ.npy", "write failed", "No space left on device"], out=out)
    assert line.startswith(f"flashattn: {out / 'dQ.npy'}: ")
    assert os.listdir(tiny_tmpfs) == []


def test_previous_outputs_survive_a_failed_run(tmp_path):
    data = backward_data(tmp_path)
    out = tmp_path / "out"
    assert run(["--compute", "cpu", "--mode", "forward", "--data", data, "--out", out, "--quiet"]).returncode == 0
    before = digest(out)

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))

    p = run(["--compute", "cpu", "--mode", "both", "--data", data, "--out", out], preexec_fn=limit)
    assert p.returncode == RUNTIME
    assert digest(out) == before, "a failed run must not replace or add any output"


# ---- the catalogue is the documented one ---------------------------------------------------------

def test_every_case_is_in_the_documented_table():
    text = (ROOT / "data" / "README.md").read_text()
    section = text[text.index("## Bad input"):]
    documented = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            documented |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    ids = {c[0] for c in CASES} | {"disk-full"}
    assert ids - documented == set(), "undocumented cases"
    assert documented - ids == set(), "documented cases without a test"
    assert len(CASES) >= 30
