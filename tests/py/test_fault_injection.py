"""The checks must be seen to fail: FLASHATTN_INJECT_FAULT=KERNEL (test-only) adds 1.0 to element 0 of
the kernel's first output right after its checked run, and the run must then end with exit code 3
and a FAIL line, in forward, backward and decode mode. These use the cpu kernel (in bf16 and fp32,
where its outputs are checked like any kernel's), so they run on machines without a GPU."""
import json
import os
import subprocess

import pytest

from test_cli import FLASHATTN, GEN, pytestmark  # noqa: F401  (the same build and skip rule)


def run(args, fault=None):
    env = dict(os.environ)
    env.pop("FLASHATTN_INJECT_FAULT", None)
    if fault:
        env["FLASHATTN_INJECT_FAULT"] = fault
    return subprocess.run([str(FLASHATTN), *map(str, args)], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fault")
    fwd = root / "fwd"
    subprocess.run([str(GEN), "--out", str(fwd), "--B", "2", "--H", "4", "--H-kv", "2", "--S-q", "37", "--S-k", "41",
                    "--D", "16", "--dtype", "bf16", "--seed", "5", "--with-dO"], check=True, capture_output=True)
    dec = root / "dec"
    subprocess.run([str(GEN), "--decode", "--out", str(dec), "--B", "2", "--H", "4", "--H-kv", "2", "--D", "16",
                    "--S-max", "80", "--cache-seqlens", "33", "--dtype", "bf16", "--seed", "6"],
                   check=True, capture_output=True)
    return {"forward": fwd, "decode": dec}


@pytest.mark.parametrize("mode,output", [("forward", "O"), ("backward", "dQ")])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_perturbed_forward_or_backward_output_fails_the_check_with_exit_3(data, mode, output, dtype):
    args = ["--compute", "cpu", "--mode", mode, "--data", data["forward"], "--dtype", dtype, "--causal", "--check",
            "--no-write", "--json", "-"]
    clean = run(args)
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["runs"][0]["check"]["passed"] is True
    bad = run(args, fault="cpu")
    assert bad.returncode == 3, bad.stderr
    assert "FAIL" in bad.stderr and "FLASHATTN_INJECT_FAULT" in bad.stderr
    check = json.loads(bad.stdout)["runs"][0]["check"]
    assert check["passed"] is False and check["outputs"][output]["passed"] is False
    assert check["outputs"][output]["max_abs"] > 0.5  # the injected 1.0, caught at row 0


def test_a_perturbed_decode_output_fails_the_check_with_exit_3(data):
    args = ["--mode", "decode", "--compute", "cpu", "--data", data["decode"], "--check", "--no-write"]
    clean = run(args)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    bad = run(args, fault="cpu")
    assert bad.returncode == 3, bad.stdout + bad.stderr
    assert "FAIL" in bad.stdout and "check cpu decode: FAILED" in bad.stdout


def test_the_fault_only_touches_the_kernel_it_names(data):
    args = ["--compute", "cpu", "--mode", "forward", "--data", data["forward"], "--check", "--no-write"]
    assert run(args, fault="naive").returncode == 0


def test_a_half_precision_check_records_the_baseline_its_bound_and_the_tolerance(data):
    p = run(["--compute", "cpu", "--mode", "both", "--data", data["forward"], "--check", "--no-write", "--json", "-"])
    assert p.returncode == 0, p.stderr
    for r in json.loads(p.stdout)["runs"]:
        c = r["check"]
        assert c["baseline"] == "cpu-naive-bf16"
        for name, o in c["outputs"].items():
            assert o["baseline"] is not None and o["baseline_passed"] is True, name
            assert o["baseline"] <= o["baseline_bound"] and o["measured"] <= o["tolerance"], name
