"""Inputs that are hostile by size or encoding fail fast, with one line and exit 2, before any
work: a .npy header with hundreds of thousands of keys, a sweep point too large for any machine,
path options that are not UTF-8 (the JSON reports hold UTF-8 only). All on the cpu kernel."""
import os
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

BUILD = os.environ.get("FLASHATTN_BUILD_DIR", "")
FLASHATTN = Path(BUILD) / "flashattn"

pytestmark = pytest.mark.skipif(
    not (BUILD and FLASHATTN.exists()), reason="set FLASHATTN_BUILD_DIR to a build with flashattn"
)


def refused_fast(args, *needles, limit_s=10):
    t0 = time.monotonic()
    r = subprocess.run([str(FLASHATTN), *map(os.fsencode, map(str, args))], capture_output=True, timeout=60)
    took = time.monotonic() - t0
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2, err
    assert len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    assert took < limit_s, f"took {took:.1f} s"


@pytest.mark.parametrize("keys", [100, 300000])
def test_npy_header_with_many_keys_is_refused_fast(tmp_path, keys, qkv_dir):
    d = qkv_dir
    extra = ", ".join(f"'k{i}': 1" for i in range(keys))
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 8, 4), " + extra + ", }"
    hdr += " " * ((64 - (len(hdr) + 13) % 64) % 64) + "\n"
    body = np.zeros((1, 2, 8, 4), np.float32).tobytes()
    (d / "Q.npy").write_bytes(b"\x93NUMPY\x02\x00" + struct.pack("<I", len(hdr)) + hdr.encode() + body)
    refused_fast(["--compute", "cpu", "--data", d, "--no-write"], "Q.npy")


def test_a_sweep_point_too_large_for_any_machine_is_refused_before_work(tmp_path):
    p = tmp_path / "big.json"
    p.write_text('{"points": [{"B": 100000, "H": 1000, "S": 100000, "D": 256, "dtype": "fp32"}]}')
    refused_fast(["--sweep", p, "--compute", "cpu"], "point 1", "elements")


@pytest.mark.parametrize("option", ["--data", "--json", "--out"])
def test_path_options_that_are_not_utf8_are_refused(tmp_path, option, qkv_dir):
    d = qkv_dir
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/x\xff")
    args = {"--data": ["--compute", "cpu", "--data", bad],
            "--json": ["--compute", "cpu", "--data", d, "--no-write", "--json", bad + ".json"],
            "--out": ["--compute", "cpu", "--data", d, "--out", bad]}[option]
    refused_fast(args, option, "UTF-8")
