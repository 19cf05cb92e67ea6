"""flashattn-gen and flashattn-compare, driven as a user would drive them.

Needs FLASHATTN_BUILD_DIR pointing at a build directory holding both binaries.
"""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

BUILD = os.environ.get("FLASHATTN_BUILD_DIR")
if not BUILD:
    pytest.skip("FLASHATTN_BUILD_DIR is not set (point it at the CMake build directory)", allow_module_level=True)
GEN = pathlib.Path(BUILD) / "flashattn-gen"
COMPARE = pathlib.Path(BUILD) / "flashattn-compare"
if not (GEN.is_file() and COMPARE.is_file()):
    pytest.skip(f"flashattn-gen or flashattn-compare not built in {BUILD}", allow_module_level=True)

ml_dtypes = pytest.importorskip("ml_dtypes")

DIMS = ["--B", "2", "--H", "4", "--H-kv", "2", "--S", "16", "--D", "8"]


def run(tool, *args):
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True)


def gen(out, *args, ok=True):
    r = run(GEN, "--out", out, *args)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def files_bytes(d):
    return {p.name: p.read_bytes() for p in sorted(pathlib.Path(d).iterdir())}


# ---- flashattn-gen -------------------------------------------------------------------------

def test_npy_directory_loads_with_numpy(tmp_path):
    out = tmp_path / "d"
    r = gen(out, *DIMS, "--with-dO", "--seqlens-k", "random", "--mask", "random")
    assert r.stdout.count("\n") == 1 and "flashattn-gen: wrote" in r.stdout
    q, k, v, do = (np.load(out / f"{n}.npy") for n in ("Q", "K", "V", "dO"))
    assert q.shape == (2, 4, 16, 8) and q.dtype == np.float32
    assert k.shape == v.shape == (2, 2, 16, 8)
    assert do.shape == q.shape
    assert abs(q.mean()) < 0.2 and 0.8 < q.std() < 1.2
    seqlens = np.load(out / "seqlens_k.npy")
    assert seqlens.dtype == np.int32 and seqlens.shape == (2,)
    assert seqlens.min() >= 1 and seqlens.max() == 16
    mask = np.load(out / "mask.npy")
    assert mask.shape == (2, 4, 16, 16) and mask.dtype == np.float32
    assert 0.03 < np.isneginf(mask).mean() < 0.2 and not np.isnan(mask).any()
    assert json.loads((out / "meta.json").read_text())["layout"] == "bhsd"


# Half an ulp relative to the value: 2^-8 for bf16 (7 stored mantissa bits), 2^-11 for fp16 (10).
@pytest.mark.parametrize("dtype,rel", [("bf16", 2.0**-8), ("fp16", 2.0**-11)])
def test_low_precision_is_the_nearest_value_to_fp64(tmp_path, dtype, rel):
    gen(tmp_path / "lo", *DIMS, "--dtype", dtype)
    gen(tmp_path / "hi", *DIMS, "--dtype", "fp64")
    raw = np.load(tmp_path / "lo" / "Q.npy")
    if dtype == "bf16":
        assert raw.dtype == np.dtype("V2")  # written as '<V2', as ml_dtypes does
        lo = raw.view(ml_dtypes.bfloat16)
    else:
        assert raw.dtype == np.float16
        lo = raw
    hi = np.load(tmp_path / "hi" / "Q.npy")
    err = np.abs(lo.astype(np.float64) - hi)
    assert np.all(err <= rel * np.abs(hi) + 2.0**-25)  # within half an ulp (fp16 subnormals: absolute)


def test_bf16_written_by_numpy_reads_back_the_same(tmp_path):
    gen(tmp_path / "d", *DIMS, "--dtype", "bf16")
    a = np.load(tmp_path / "d" / "K.npy").view(ml_dtypes.bfloat16)
    np.save(tmp_path / "again.npy", a)
    r = run(COMPARE, tmp_path / "again.npy", tmp_path / "d" / "K.npy", "--max-abs", "0")
    assert r.returncode == 0, r.stdout + r.stderr


def test_bshd_holds_the_same_logical_tensors_as_bhsd(tmp_path):
    gen(tmp_path / "a", *DIMS, "--seed", "5")
    gen(tmp_path / "b", *DIMS, "--seed", "5", "--layout", "bshd")
    for name in ("Q", "K", "V"):
        a = np.load(tmp_path / "a" / f"{name}.npy")
        b = np.load(tmp_path / "b" / f"{name}.npy")
        np.testing.assert_array_equal(a, b.transpose(0, 2, 1, 3))
    assert json.loads((tmp_path / "b" / "meta.json").read_text())["layout"] == "bshd"


def test_rowidx_and_colidx_follow_the_documented_formulas(tmp_path):
    gen(tmp_path / "r", *DIMS, "--init", "rowidx", "--dtype", "fp64")
    gen(tmp_path / "c", *DIMS, "--init", "colidx", "--dtype", "fp64")
    i = np.arange(16).reshape(1, 1, 16, 1)
    d = np.arange(8).reshape(1, 1, 1, 8)
    np.testing.assert_allclose(np.load(tmp_path / "r" / "Q.npy")[1, 3], (2 * i / 16 - 1 + d / (16 * 8))[0, 0])
    np.testing.assert_allclose(np.load(tmp_path / "c" / "K.npy")[0, 1], np.broadcast_to(2 * d / 8 - 1, (1, 1, 16, 8))[0, 0])


def test_bin_directory_with_meta_json(tmp_path):
    out = tmp_path / "d"
    gen(out, *DIMS, "--format", "bin", "--dtype", "fp16", "--mask", "causal-bias", "--mask-shape", "shared",
        "--S-q", "12")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format_version"] == 1 and meta["layout"] == "bhsd" and meta["dtype"] == "fp16"
    assert (meta["B"], meta["H"], meta["H_kv"], meta["S_q"], meta["S_k"], meta["D"]) == (2, 4, 2, 12, 16, 8)
    assert meta["files"]["mask"] == {"dtype": "fp32", "shape": [12, 16]}
    q = np.fromfile(out / "Q.bin", dtype=np.float16)
    assert q.size == 2 * 4 * 12 * 8
    mask = np.fromfile(out / "mask.bin", dtype=np.float32).reshape(12, 16)
    i, j = np.indices((12, 16))
    np.testing.assert_array_equal(np.isneginf(mask), j > i + 16 - 12)  # bottom-right causal
    assert not (out / "Q.npy").exists()


def test_no_meta_directory_named_after_its_sizes(tmp_path):
    out = tmp_path / "B2_H4_S16_D8"
    gen(out, "--B", 2, "--H", 4, "--S", 16, "--D", 8, "--format", "bin", "--no-meta", "--with-dO")
    assert sorted(p.name for p in out.iterdir()) == ["K.bin", "Q.bin", "V.bin", "dO.bin"]
    assert (out / "Q.bin").stat().st_size == 2 * 4 * 16 * 8 * 4
    r = gen(tmp_path / "wrong", "--B", 2, "--H", 4, "--S", 16, "--D", 8, "--format", "bin", "--no-meta", ok=False)
    assert r.returncode == 2 and "B2_H4_S16_D8" in r.stderr
    r = gen(tmp_path / "B2_H4_S16_D8x", *DIMS, "--format", "bin", "--no-meta", ok=False)
    assert r.returncode == 2 and "H_kv = H" in r.stderr


def test_same_seed_same_bytes_and_streams_are_independent(tmp_path):
    args = [*DIMS, "--seqlens-k", "random", "--mask", "random", "--mask-empty-rows", "3"]
    gen(tmp_path / "a", *args)
    gen(tmp_path / "b", *args)
    assert files_bytes(tmp_path / "a") == files_bytes(tmp_path / "b")
    gen(tmp_path / "c", *args, "--with-dO")
    c = files_bytes(tmp_path / "c")
    for name in ("Q.npy", "K.npy", "V.npy", "mask.npy", "seqlens_k.npy"):
        assert c[name] == files_bytes(tmp_path / "a")[name]
    gen(tmp_path / "d", *args, "--seed", "1")
    assert files_bytes(tmp_path / "d")["Q.npy"] != c["Q.npy"]


def test_mask_empty_rows_and_shapes(tmp_path):
    for shape, expected in (("full", (2, 4, 16, 16)), ("batch", (2, 1, 16, 16)), ("head", (1, 4, 16, 16)),
                            ("shared", (16, 16))):
        out = tmp_path / shape
        gen(out, *DIMS, "--mask", "random", "--mask-shape", shape, "--mask-empty-rows", "2")
        mask = np.load(out / "mask.npy")
        assert mask.shape == expected
        assert np.isneginf(mask).all(axis=-1).sum() == 2


def test_explicit_seqlens_allow_zero(tmp_path):
    gen(tmp_path / "d", *DIMS, "--seqlens-k", "0,16")
    assert np.load(tmp_path / "d" / "seqlens_k.npy").tolist() == [0, 16]
    for bad in ("0,17", "1", "1,x", "1,2,3"):
        r = gen(tmp_path / f"bad{bad}", *DIMS, "--seqlens-k", bad, ok=False)
        assert r.returncode == 2 and r.stderr.startswith("--seqlens-k") and r.stderr.count("\n") == 1


def test_usage_errors_exit_2_with_one_line(tmp_path):
    r = gen(tmp_path / "d", "--B", 2, "--H", 8, "--H-kv", 3, "--S", 4, "--D", 8, ok=False)
    assert r.returncode == 2 and r.stderr == "--H-kv: H=8 is not a multiple of H_kv=3\n"
    r = gen(tmp_path / "d", "--B", 2, "--H", 8, "--S", 4, ok=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    r = gen(tmp_path / "d", *DIMS, "--dtype", "int8", ok=False)
    assert r.returncode == 2


def test_existing_directory_needs_force_which_removes_stale_files(tmp_path):
    out = tmp_path / "d"
    gen(out, *DIMS, "--mask", "random")
    r = gen(out, *DIMS, ok=False)
    assert r.returncode == 2 and "not empty" in r.stderr
    gen(out, *DIMS, "--format", "bin", "--force")
    assert sorted(p.name for p in out.iterdir()) == ["K.bin", "Q.bin", "V.bin", "meta.json"]


# ---- flashattn-compare ---------------------------------------------------------------------

def test_compare_identical_files_reports_zero_error(tmp_path):
    gen(tmp_path / "d", *DIMS)
    r = run(COMPARE, tmp_path / "d" / "Q.npy", tmp_path / "d" / "Q.npy", "--json", "--max-rel-l2", "0", "--max-abs", "0")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["max_abs"] == 0 and rep["rel_l2"] == 0 and rep["mean_abs"] == 0 and rep["pass"] is True
    assert rep["shape"] == [2, 4, 16, 8]


def test_compare_threshold_exit_3_and_metrics(tmp_path):
    a = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    b = a.copy()
    b[1, 2, 3] += 0.5
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    r = run(COMPARE, tmp_path / "a.npy", tmp_path / "b.npy", "--json")
    assert r.returncode == 0
    rep = json.loads(r.stdout)
    assert rep["max_abs"] == pytest.approx(0.5) and rep["max_abs_index"] == [1, 2, 3]
    assert rep["rel_l2"] == pytest.approx(0.5 / np.linalg.norm(b.astype(np.float64)))
    assert rep["mse"] == pytest.approx(0.25 / 24)
    assert run(COMPARE, tmp_path / "a.npy", tmp_path / "b.npy", "--max-abs", "0.6").returncode == 0
    r = run(COMPARE, tmp_path / "a.npy", tmp_path / "b.npy", "--max-abs", "0.1")
    assert r.returncode == 3 and "FAIL" in r.stdout
    assert run(COMPARE, tmp_path / "a.npy", tmp_path / "b.npy", "--max-rel-l2", "1e-3").returncode == 3


def test_compare_nan_mismatch_fails_but_matching_inf_does_not(tmp_path):
    a = np.array([1.0, -np.inf, np.nan], dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", a.copy())
    assert run(COMPARE, tmp_path / "a.npy", tmp_path / "b.npy").returncode == 0
    b = a.copy()
    b[2] = 0.0
    np.save(tmp_path / "b.npy", b)
    r = run(COMPARE, tmp_path / "a.npy", tmp_path / "b.npy", "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["nonfinite_mismatches"] == 1


def test_compare_shape_mismatch_exit_2(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 3), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((3, 2), np.float32))
    r = run(COMPARE, tmp_path / "a.npy", tmp_path / "b.npy")
    assert r.returncode == 2 and "a.npy" in r.stderr and "b.npy" in r.stderr


def test_compare_bin_uses_meta_json_or_explicit_shape(tmp_path):
    gen(tmp_path / "bin", *DIMS, "--format", "bin", "--seed", "3")
    gen(tmp_path / "npy", *DIMS, "--seed", "3")
    r = run(COMPARE, tmp_path / "bin" / "K.bin", tmp_path / "npy" / "K.npy", "--max-abs", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    nometa = tmp_path / "B2_H4_S16_D8"
    gen(nometa, "--B", 2, "--H", 4, "--S", 16, "--D", 8, "--format", "bin", "--no-meta")
    r = run(COMPARE, nometa / "Q.bin", nometa / "Q.bin")
    assert r.returncode == 2 and "--shape" in r.stderr
    r = run(COMPARE, nometa / "Q.bin", nometa / "Q.bin", "--shape", "2,4,16,8", "--dtype", "fp32")
    assert r.returncode == 0


@pytest.mark.parametrize("option, value", [("--max-abs", "nan"), ("--max-abs", "-1"), ("--max-rel-l2", "inf"),
                                           ("--max-rel-l2", "-0.5")])
def test_compare_refuses_a_threshold_that_is_not_a_finite_number_at_least_zero(tmp_path, option, value):
    a = tmp_path / "a.npy"
    np.save(a, np.arange(6, dtype=np.float32))
    r = run(COMPARE, a, a, option, value)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and option in r.stderr


def _file_size_limit(nbytes):
    import resource
    import signal

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return limit


@pytest.mark.parametrize("decode", [False, True])
def test_gen_on_a_full_disk_leaves_no_dataset_and_keeps_the_old_one(tmp_path, decode):
    args = (["--decode", "--B", "2", "--H", "4", "--H-kv", "2", "--D", "32", "--S-max", "512", "--cache-seqlens", "100"]
            if decode else ["--B", "2", "--H", "4", "--S", "256", "--D", "32"])
    # A new directory: nothing appears, not even an empty directory or a temporary one.
    fresh = tmp_path / "fresh"
    r = subprocess.run([str(GEN), "--out", str(fresh), *args], capture_output=True, text=True,
                       preexec_fn=_file_size_limit(20000))
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # An existing dataset replaced with --force: unchanged when the new one cannot be written.
    old = tmp_path / "old"
    gen(old, *(["--decode", "--B", "1", "--H", "2", "--H-kv", "2", "--D", "8", "--S-max", "16", "--cache-seqlens", "4"]
               if decode else ["--B", "1", "--H", "2", "--S", "8", "--D", "8"]))
    before = files_bytes(old)
    r = subprocess.run([str(GEN), "--out", str(old), "--force", *args], capture_output=True, text=True,
                       preexec_fn=_file_size_limit(20000))
    assert r.returncode != 0, r.stderr
    assert files_bytes(old) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
