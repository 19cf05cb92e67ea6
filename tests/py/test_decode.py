"""Decode mode from the outside: flashattn-gen --decode directories, scripts/reference.py's decode
branch (scripts/decode_reference.py) against a brute-force evaluation, and the refusals of
`flashattn --mode decode` that need no GPU.

Needs FLASHATTN_BUILD_DIR pointing at a build directory holding flashattn and flashattn-gen.
"""
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

BUILD = os.environ.get("FLASHATTN_BUILD_DIR")
if not BUILD:
    pytest.skip("FLASHATTN_BUILD_DIR is not set (point it at the CMake build directory)", allow_module_level=True)
GEN = pathlib.Path(BUILD) / "flashattn-gen"
FA = pathlib.Path(BUILD) / "flashattn"
if not (GEN.is_file() and FA.is_file()):
    pytest.skip(f"flashattn or flashattn-gen not built in {BUILD}", allow_module_level=True)
ml_dtypes = pytest.importorskip("ml_dtypes")

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import decode_reference  # noqa: E402
import reference  # noqa: E402

DIMS = ["--B", "3", "--H", "8", "--H-kv", "2", "--D", "16", "--S-max", "128"]


def run(tool, *args):
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True)


def gen(out, *args, ok=True):
    r = run(GEN, "--decode", "--out", out, *args)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def brute_force(d, scale):
    """O, lse of one decode step from the logical rows, loop by loop (long double free: float64)."""
    q = d["q"].astype(np.float64)
    B, H, S_new, D = q.shape
    H_kv = d["k_new"].shape[1]
    o = np.zeros((B, H, S_new, D))
    lse = np.zeros((B, H, S_new))
    for b in range(B):
        c = int(d["cache_seqlens"][b])
        for h in range(H):
            g = h // (H // H_kv)
            for i in range(S_new):
                keys, vals = [], []
                for j in range(c + i + 1):
                    if j < c:
                        if "block_table" in d:
                            page, r = d["block_table"][b, j // d["K_cache"].shape[2]], j % d["K_cache"].shape[2]
                            keys.append(d["K_cache"][page, g, r]), vals.append(d["V_cache"][page, g, r])
                        else:
                            keys.append(d["K_cache"][b, g, j]), vals.append(d["V_cache"][b, g, j])
                    else:
                        keys.append(d["k_new"][b, g, j - c]), vals.append(d["v_new"][b, g, j - c])
                s = np.array([scale * float(np.dot(q[b, h, i], k.astype(np.float64))) for k in keys])
                m = s.max()
                p = np.exp(s - m)
                lse[b, h, i] = m + math.log(p.sum())
                o[b, h, i] = (p[:, None] * np.array(vals, dtype=np.float64)).sum(0) / p.sum()
    return o, lse


def load(dir_):
    d = {}
    for name in ("q", "k_new", "v_new", "K_cache", "V_cache", "cache_seqlens", "block_table"):
        p = pathlib.Path(dir_) / f"{name}.npy"
        if p.exists():
            d[name] = np.load(p)
    return d


# ---- flashattn-gen --decode --------------------------------------------------------------------

def test_contiguous_directory_has_the_documented_files(tmp_path):
    out = tmp_path / "dec"
    r = gen(out, *DIMS, "--cache-seqlens", "5,0,100", "--S-new", "3")
    assert "wrote decode" in r.stdout
    d = load(out)
    assert d["q"].shape == (3, 8, 3, 16) and d["q"].dtype == np.float32
    assert d["k_new"].shape == d["v_new"].shape == (3, 2, 3, 16)
    assert d["K_cache"].shape == d["V_cache"].shape == (3, 2, 128, 16)
    assert d["cache_seqlens"].dtype == np.int32 and list(d["cache_seqlens"]) == [5, 0, 100]
    assert "block_table" not in d
    meta = json.loads((out / "meta.json").read_text())
    assert meta["kind"] == "decode" and meta["layout"] == "bhsd" and meta["decode"]["S_new"] == 3


def test_paged_directory_holds_the_same_logical_cache(tmp_path):
    flat, paged = tmp_path / "flat", tmp_path / "paged"
    gen(flat, *DIMS, "--cache-seqlens", "7", "--seed", "5")
    gen(paged, *DIMS, "--cache-seqlens", "7", "--seed", "5", "--page-size", "16")
    f, p = load(flat), load(paged)
    table = p["block_table"]
    assert table.shape == (3, 8) and sorted(table.ravel().tolist()) == list(range(24))
    assert p["K_cache"].shape == (24, 2, 16, 16)
    for b in range(3):
        logical = np.concatenate([p["K_cache"][table[b, k]] for k in range(8)], axis=1)  # [H_kv, 128, D]
        np.testing.assert_array_equal(logical, f["K_cache"][b])
    np.testing.assert_array_equal(f["q"], p["q"])
    assert list(f["cache_seqlens"]) == [7, 7, 7]


def test_random_lengths_leave_room_for_the_new_tokens(tmp_path):
    gen(tmp_path / "r", *DIMS, "--cache-seqlens", "random", "--S-new", "4")
    lens = np.load(tmp_path / "r" / "cache_seqlens.npy")
    assert lens.min() >= 0 and lens.max() + 4 <= 128


@pytest.mark.parametrize("args,fragment", [
    (["--cache-seqlens", "126", "--S-new", "3"], "outside [0, S_max - S_new]"),
    (["--cache-seqlens", "1,2"], "expected 1 or B = 3"),
    (["--cache-seqlens", "4", "--page-size", "24"], "--page-size: 24"),
    (["--cache-seqlens", "4", "--S", "16"], "--S: not used with --decode"),
])
def test_gen_refuses_bad_decode_options(tmp_path, args, fragment):
    r = gen(tmp_path / "x", *DIMS, *args, ok=False)
    assert r.returncode == 2 and fragment in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_gen_needs_s_max_with_decode(tmp_path):
    r = run(GEN, "--decode", "--out", tmp_path / "x", "--B", "1", "--H", "1", "--D", "8", "--cache-seqlens", "1")
    assert r.returncode == 2 and "--S-max" in r.stderr


# ---- scripts/decode_reference.py -----------------------------------------------------------------

@pytest.mark.parametrize("page", [0, 16])
def test_decode_reference_matches_brute_force(tmp_path, page):
    out = tmp_path / "d"
    extra = ["--page-size", str(page)] if page else []
    gen(out, *DIMS, "--cache-seqlens", "0,33,120", "--S-new", "3", *extra)
    p = decode_reference.DecodeData(str(out))
    o, lse = decode_reference.compute(p, "fp32", 0.25)
    bo, blse = brute_force(load(out), 0.25)
    np.testing.assert_allclose(o, bo, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(lse, blse, rtol=1e-12, atol=1e-12)


def write_outputs(dir_, o, lse, kernel="mma", dtype="fp32", scale=None, caches=None):
    dir_.mkdir(parents=True)
    np.save(dir_ / "O.npy", o.astype(np.float32))
    np.save(dir_ / "lse.npy", lse.astype(np.float32))
    for name, arr in (caches or {}).items():
        np.save(dir_ / f"{name}.npy", arr.astype(np.float32))
    flags = {"causal": True, "window_left": -1, "window_right": -1, "seqlens_k": True, "mask": False}
    if scale is not None:
        flags["scale"] = scale
    run_ = {"kernel": kernel, "mode": "decode", "status": "ok", "dtype": dtype, "layout": "bhsd", "flags": flags}
    (dir_ / "timing.json").write_text(json.dumps({"runs": [run_]}))


def reference_py(*args):
    return subprocess.run([sys.executable, str(SCRIPTS / "reference.py"), *map(str, args)], capture_output=True,
                          text=True)


def test_reference_py_checks_a_decode_output_directory(tmp_path):
    data = tmp_path / "d"
    gen(data, *DIMS, "--cache-seqlens", "9,50,3", "--S-new", "2", "--page-size", "32")
    p = decode_reference.DecodeData(str(data))
    o, lse = decode_reference.compute(p, "fp32", 0.25)
    caches = {"K_cache": decode_reference.expected_cache(p, "K", "fp32"),
              "V_cache": decode_reference.expected_cache(p, "V", "fp32")}
    write_outputs(tmp_path / "out" / "mma", o, lse, scale=0.25, caches=caches)
    r = reference_py(data, tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "K_cache" in r.stdout and "PASS" in r.stdout


def test_reference_py_fails_a_wrong_decode_output(tmp_path):
    data = tmp_path / "d"
    gen(data, *DIMS, "--cache-seqlens", "9", "--S-new", "1")
    p = decode_reference.DecodeData(str(data))
    o, lse = decode_reference.compute(p, "fp32", 0.25)
    o[1, 3, 0, 5] += 0.1
    write_outputs(tmp_path / "out", o, lse, scale=0.25)
    r = reference_py(data, tmp_path / "out")
    assert r.returncode == 3, r.stdout + r.stderr


def test_reference_py_fails_a_cache_without_the_new_rows(tmp_path):
    data = tmp_path / "d"
    gen(data, *DIMS, "--cache-seqlens", "9", "--S-new", "2")
    p = decode_reference.DecodeData(str(data))
    o, lse = decode_reference.compute(p, "fp32", 0.25)
    caches = {"K_cache": reference.to_f64(p.arrays["K_cache"]),  # not updated
              "V_cache": decode_reference.expected_cache(p, "V", "fp32")}
    write_outputs(tmp_path / "out", o, lse, scale=0.25, caches=caches)
    r = reference_py(data, tmp_path / "out", "--json")
    assert r.returncode == 3
    doc = json.loads(r.stdout)
    by_name = {x["name"]: x for x in doc["checks"][0]["outputs"]}
    assert not by_name["K_cache"]["passed"] and by_name["V_cache"]["passed"] and by_name["O"]["passed"]


# ---- flashattn --mode decode: refusals that need no GPU ----------------------------------------

def test_decode_mode_refuses_a_forward_directory(tmp_path):
    fwd = tmp_path / "f"
    subprocess.run([str(GEN), "--out", fwd, "--B", "1", "--H", "1", "--S", "4", "--D", "8"], check=True,
                   capture_output=True)
    r = run(FA, "--mode", "decode", "--compute", "mma", "--data", fwd)
    assert r.returncode == 2 and "not a decode directory" in r.stderr


def test_decode_mode_refuses_a_kernel_without_a_decode_pass(tmp_path):
    gen(tmp_path / "d", *DIMS, "--cache-seqlens", "4")
    r = run(FA, "--mode", "decode", "--compute", "cublas", "--data", tmp_path / "d")
    assert r.returncode == 2 and "has no decode pass" in r.stderr


@pytest.mark.parametrize("args,fragment", [
    (["--window", "4,0"], "--window: not available in decode mode"),
    (["--splits", "-1"], "--splits"),
    (["--prompt-len", "8"], "--prompt-len: only with --steps"),
    (["--write-cache", "--no-write"], "--write-cache: conflicts with --no-write"),
])
def test_decode_mode_refuses_bad_options(tmp_path, args, fragment):
    gen(tmp_path / "d", *DIMS, "--cache-seqlens", "4")
    r = run(FA, "--mode", "decode", "--compute", "mma", "--data", tmp_path / "d", *args)
    assert r.returncode == 2 and fragment in r.stderr, r.stderr
