"""The flashattn command line: exit codes, one-line errors, outputs and the JSON, on the cpu kernel
(so these run on machines without a GPU)."""
import hashlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

BUILD = os.environ.get("FLASHATTN_BUILD_DIR", "")
FLASHATTN = Path(BUILD) / "flashattn"
GEN = Path(BUILD) / "flashattn-gen"

pytestmark = pytest.mark.skipif(
    not (BUILD and FLASHATTN.exists() and GEN.exists()),
    reason="set FLASHATTN_BUILD_DIR to a build with flashattn and flashattn-gen",
)


def run(*args, check=None):
    p = subprocess.run([str(FLASHATTN), *map(str, args)], capture_output=True, text=True)
    if check is not None:
        assert p.returncode == check, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def gen(out, *args):
    subprocess.run([str(GEN), "--out", str(out), *map(str, args)], check=True, capture_output=True)
    return out


def digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(d).iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("data") / "B1_H2_S20_D8"
    return gen(d, "--B", 1, "--H", 2, "--S-q", 20, "--S-k", 24, "--D", 8, "--seed", 3, "--with-dO")


def test_version_and_help_exit_zero():
    assert "flashattn" in run("--version", check=0).stdout
    out = run("--help", check=0).stdout
    assert "Examples:" in out and "--compute" in out and "Exit codes" in out


def test_list_shows_every_registered_kernel_and_mode():
    out = run("--list", check=0).stdout
    assert "cpu" in out and "forward" in out and "backward" in out
    entries = json.loads(run("--list-json", check=0).stdout)
    names = {e["kernel"] for e in entries}
    assert {"cpu", "naive", "cublas"} <= names
    cpu = [e for e in entries if e["kernel"] == "cpu"]
    assert {e["mode"] for e in cpu} == {"forward", "backward", "decode"}


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--compute", "nosuch", "--data", "X"], "unknown kernel 'nosuch'"),
        (["--compute", "cpu", "--data", "/definitely/missing"], "/definitely/missing"),
        (["--compute", "cpu", "--data", "DATA", "--window", "3"], "--window"),
        (["--compute", "cpu", "--data", "DATA", "--window", "-5,2"], "--window"),
        (["--compute", "cpu", "--data", "DATA", "--mode", "sideways"], "--mode"),
        (["--compute", "cpu", "--data", "DATA", "--dtype", "int8"], "--dtype"),
        (["--compute", "cpu", "--data", "DATA", "--layout", "sbhd"], "--layout"),
        (["--compute", "cpu", "--data", "DATA", "--repeat", "0"], "--repeat"),
        (["--compute", "cpu", "--data", "DATA", "--scale", "-1"], "--scale"),
        (["--compute", "cpu,all", "--data", "DATA"], "'all'"),
        (["--compute", "cpu,,cpu", "--data", "DATA"], "empty name"),
        (["--compute", "cpu,", "--data", "DATA"], "empty name"),
        (["--compute=,cpu", "--data", "DATA"], "empty name"),
        (["--compute", "cpu", "--data", "DATA", "--seed", "-1"], "--seed"),
        (["--compute", "cpu", "--data", "DATA", "--seed", "18446744073709551616"], "--seed"),
        (["--compute", "cpu", "--data", "DATA", "--threads", "100000000"], "--threads"),
        (["--compute", "cpu", "--data", "DATA", "--warmup", "1000000000"], "--warmup"),
        (["--compute", "cpu", "--data", "DATA", "--device", "99999"], "--device"),
        (["--compute", "cpu", "--data", "DATA", "--splits", "4"], "--splits: only with --mode decode"),
        (["--compute", "cpu", "--data", "DATA", "--steps", "3"], "--steps: only with --mode decode"),
        (["--compute", "cpu", "--data", "DATA", "--write-cache"], "--write-cache: only with --mode decode"),
        (["--bogus-flag"], "bogus"),
    ],
)
def test_usage_errors_exit_2_with_one_line(small, args, needle):
    args = [str(small) if a == "DATA" else a for a in args]
    p = run(*args, check=2)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert needle in lines[0]


def test_cpu_forward_backward_writes_outputs_and_json(small, tmp_path):
    before = digest(small)
    out = tmp_path / "o"
    js = tmp_path / "run.json"
    run("--compute", "cpu", "--mode", "both", "--data", small, "--out", out, "--json", js, "--quiet", check=0)
    assert digest(small) == before, "inputs must never be modified"
    for name in ["O", "lse", "dQ", "dK", "dV", "timing.json"]:
        assert any(p.stem == name or p.name == name for p in out.iterdir()), name
    o = np.load(out / "O.npy")
    assert o.shape == (1, 2, 20, 8) and o.dtype == np.float32 and np.isfinite(o).all()
    lse = np.load(out / "lse.npy")
    assert lse.shape == (1, 2, 20) and lse.dtype == np.float32
    doc = json.loads(js.read_text())
    assert doc["schema_version"] == 1
    assert doc["tool"]["name"] == "flashattn"
    modes = [r["mode"] for r in doc["runs"]]
    assert modes == ["forward", "backward"]
    r = doc["runs"][0]
    assert r["shape"] == {"B": 1, "H": 2, "H_kv": 2, "S_q": 20, "S_k": 24, "D": 8}
    assert r["timing"]["median_ms"] > 0 and r["throughput"]["flops"] == 4 * 8 * 2 * 20 * 24
    assert not list(out.glob("*.tmp*")), "no temporary files left behind"


def test_json_to_stdout_is_pure_json(small):
    p = run("--compute", "cpu", "--data", small, "--no-write", "--json", "-", check=0)
    doc = json.loads(p.stdout)
    assert doc["runs"][0]["kernel"] == "cpu"


def test_generated_dO_is_written_for_the_reference(tmp_path):
    d = gen(tmp_path / "nodo", "--B", 1, "--H", 1, "--S", 9, "--D", 4)
    out = tmp_path / "o"
    run("--compute", "cpu", "--mode", "backward", "--data", d, "--out", out, "--seed", 5, "--quiet", check=0)
    assert (out / "dO.npy").exists()
    assert not (d / "dO.npy").exists()


def test_output_dir_cannot_overwrite_inputs(small):
    p = run("--compute", "cpu", "--data", small, "--out", small, check=2)
    assert "input" in p.stderr


def test_check_on_the_cpu_kernel_says_it_is_the_reference_in_fp64(small):
    p = run("--compute", "cpu", "--data", small, "--dtype", "fp64", "--no-write", "--check", check=0)
    assert "ref" in p.stdout


def test_check_on_the_cpu_kernel_in_fp32_checks_its_rounded_outputs(small):
    p = run("--compute", "cpu", "--data", small, "--no-write", "--check", "--json", "-", check=0)
    check = json.loads(p.stdout)["runs"][0]["check"]
    assert check["performed"] and check["passed"] and check["outputs"]["O"]["rel_l2"] < 1e-7
    assert check["seconds"] >= 0  # the check's own host time, apart from the kernel's timing


def test_head_dim_the_kernel_does_not_support_is_an_input_error(tmp_path):
    # Every kernel declares its head dims; the cpu kernel takes any, so probe a GPU kernel's list.
    entries = json.loads(run("--list-json", check=0).stdout)
    limited = [e for e in entries if e["head_dims"]]
    if not limited:
        pytest.skip("no registered kernel restricts its head dims")
    e = limited[0]
    d = gen(tmp_path / "d", "--B", 1, "--H", 1, "--S", 8, "--D", 7)
    dtype = next(t for t in ("fp32", "bf16", "fp16") if t in e["dtypes"])
    # Reported with or without a GPU: the support check comes before the device check.
    p = run("--compute", e["kernel"], "--mode", e["mode"], "--data", d, "--dtype", dtype, check=2)
    assert "head dim 7" in p.stderr


def test_gpu_kernel_without_a_gpu_says_so(small):
    if os.environ.get("FLASHATTN_HAS_GPU") == "1":
        pytest.skip("a GPU is present")
    p = run("--compute", "naive", "--data", small)
    if p.returncode == 0:
        pytest.skip("a GPU is present")
    assert p.returncode == 2
    assert "GPU" in p.stderr and "cpu" in p.stderr


def test_all_without_a_gpu_runs_cpu_and_reports_the_skips(small):
    p = run("--compute", "all", "--data", small, "--no-write", "--json", "-")
    assert p.returncode == 0, p.stderr
    runs = json.loads(p.stdout)["runs"]
    assert any(r["kernel"] == "cpu" and r["status"] == "ok" for r in runs)
    for r in runs:
        if r["status"] == "skipped":
            assert r["reason"]
