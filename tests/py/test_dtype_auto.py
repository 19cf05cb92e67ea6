"""--dtype auto: each kernel in its own dtype, one table, one JSON, the dtype named per run."""
import json
import os
import pathlib
import subprocess

import ml_dtypes
import numpy as np
import pytest

BUILD = os.environ.get("FLASHATTN_BUILD_DIR", "")
FLASHATTN = pathlib.Path(BUILD) / "flashattn"
pytestmark = pytest.mark.skipif(
    not (BUILD and FLASHATTN.exists()), reason="set FLASHATTN_BUILD_DIR to a build with flashattn"
)


def run(*args):
    return subprocess.run([str(FLASHATTN), *map(str, args)], capture_output=True, text=True, timeout=120)


def small_problem(tmp_path, dtype, D):
    """Q, K, V [1, 2, 8, D] as .npy in tmp_path/data."""
    d = tmp_path / "data"
    d.mkdir()
    rng = np.random.default_rng(1)
    for name in ("Q", "K", "V"):
        np.save(d / f"{name}.npy", rng.standard_normal((1, 2, 8, D)).astype(dtype))
    return d


def test_auto_runs_each_kernel_in_its_own_dtype(tmp_path):
    # D = 32: a head dim every kernel takes, so on a GPU all three run.
    qkv_dir = small_problem(tmp_path, np.float32, 32)
    out = tmp_path / "s.json"
    p = run("--compute", "cpu,naive,mma", "--mode", "forward", "--data", qkv_dir, "--dtype", "auto", "--check",
            "--no-write", "--json", out)
    # Without a GPU naive and mma are refused when named: ask for them under `all` instead.
    if p.returncode == 2 and "needs a GPU" in p.stderr:
        p = run("--compute", "all", "--mode", "forward", "--data", qkv_dir, "--dtype", "auto", "--check",
                "--no-write", "--json", out)
    assert p.returncode == 0, p.stderr
    runs = {r["kernel"]: r for r in json.loads(out.read_text())["runs"]}
    assert runs["cpu"]["dtype"] == "fp32" and runs["cpu"]["status"] == "ok"
    assert runs["naive"]["dtype"] == "fp32"
    assert runs["mma"]["dtype"] == "bf16"  # mma takes fp16 and bf16 only
    assert "mma bf16" in p.stdout and "cpu fp32" in p.stdout  # the table names each run's dtype
    assert "computing in bf16 for" in p.stderr


def test_auto_keeps_a_low_precision_input_for_every_kernel_that_takes_it(tmp_path):
    d = small_problem(tmp_path, ml_dtypes.bfloat16, 4)
    out = tmp_path / "s.json"
    p = run("--compute", "cpu", "--mode", "forward", "--data", d, "--dtype", "auto", "--no-write", "--json", out)
    assert p.returncode == 0, p.stderr
    (r,) = json.loads(out.read_text())["runs"]
    assert r["dtype"] == "bf16"
    assert "cpu bf16" not in p.stdout  # one dtype: the table stays as it was


def test_auto_is_refused_by_sweeps(tmp_path):
    p = run("--sweep", "fa-grid", "--compute", "cpu", "--dtype", "auto", "--dry-run")
    assert p.returncode == 2
    assert "--dtype auto: not with --sweep" in p.stderr


def test_a_dtype_list_runs_each_kernel_in_each_listed_dtype(tmp_path):
    qkv_dir = small_problem(tmp_path, np.float32, 32)
    out = tmp_path / "s.json"
    p = run("--compute", "cpu", "--mode", "forward", "--data", qkv_dir, "--dtype", "fp32,bf16", "--check",
            "--json", out)
    assert p.returncode == 0, p.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [(r["kernel"], r["dtype"], r["status"]) for r in runs] == [("cpu", "fp32", "ok"), ("cpu", "bf16", "ok")]
    assert "cpu fp32" in p.stdout and "cpu bf16" in p.stdout
    assert "check cpu bf16 forward: passed" in p.stdout
    # One kernel in two dtypes: one output directory per dtype, each complete.
    for t in ("fp32", "bf16"):
        d = qkv_dir / "out" / "cpu" / t
        assert (d / "O.npy").exists() and (d / "timing.json").exists()
    assert np.load(qkv_dir / "out" / "cpu" / "bf16" / "O.npy").dtype.itemsize == 2
    assert np.load(qkv_dir / "out" / "cpu" / "fp32" / "O.npy").dtype == np.float32


@pytest.mark.parametrize("words,message", [
    ("fp32,,bf16", "an empty item"),
    ("fp32,bf16,fp32", "listed twice"),
    ("fp32,fp8", "'fp8' is not one of"),
])
def test_bad_dtype_lists_are_refused_before_any_work(tmp_path, words, message):
    qkv_dir = small_problem(tmp_path, np.float32, 32)
    p = run("--compute", "cpu", "--data", qkv_dir, "--dtype", words)
    assert p.returncode == 2 and message in p.stderr
    assert not (qkv_dir / "out").exists()


def test_a_dtype_list_is_refused_by_sweeps_and_decode(tmp_path):
    p = run("--sweep", "fa-grid", "--compute", "cpu", "--dtype", "fp32,bf16", "--dry-run")
    assert p.returncode == 2 and "not with --sweep" in p.stderr
