"""scripts/reference.py: the fp64 recomputation that checks an output directory.

The first group needs no binaries: tiny problems are solved here by a naive per-row formula,
written to a temporary output directory, and reference.py must accept them (and reject them once
corrupted). The second group runs flashattn-gen and the `cpu` kernel of a build given by
FLASHATTN_BUILD_DIR and checks that reference.py agrees with it to fp64 precision.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "reference.py"


def run_reference(data, out, *flags):
    return subprocess.run([sys.executable, str(SCRIPT), str(data), str(out), *map(str, flags)],
                          capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------------------------------
# A naive solver: one query row at a time, straight from the definitions.

def naive(q, k, v, dout=None, scale=None, causal=False, window=(-1, -1), seqlens=None, mask=None):
    B, H, S_q, D = q.shape
    H_kv, S_k = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    o, lse = np.zeros_like(q), np.full((B, H, S_q), -np.inf)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(B):
        for h in range(H):
            g = h // (H // H_kv)
            for i in range(S_q):
                s = np.full(S_k, -np.inf)
                for j in range(S_k):
                    rel = j - (i + S_k - S_q)
                    if seqlens is not None and j >= seqlens[b]:
                        continue
                    if (causal and rel > 0) or (window[0] >= 0 and rel < -window[0]) or \
                       (window[1] >= 0 and rel > window[1]):
                        continue
                    s[j] = scale * float(q[b, h, i] @ k[b, g, j])
                    if mask is not None:
                        s[j] += float(np.broadcast_to(mask, (B, H, S_q, S_k))[b, h, i, j])
                if np.all(s == -np.inf):
                    continue
                m = s.max()
                lse[b, h, i] = m + math.log(np.exp(s - m).sum())
                p = np.exp(s - lse[b, h, i])
                o[b, h, i] = p @ v[b, g]
                if dout is not None:
                    dp = v[b, g] @ dout[b, h, i]
                    ds = p * (dp - p @ dp)
                    dq[b, h, i] = scale * ds @ k[b, g]
                    dk[b, g] += scale * np.outer(ds, q[b, h, i])
                    dv[b, g] += np.outer(p, dout[b, h, i])
    return {"O": o, "lse": lse, "dQ": dq, "dK": dk, "dV": dv}


def make_inputs(B=2, H=4, H_kv=2, S_q=5, S_k=7, D=3, seed=0):
    rng = np.random.default_rng(seed)
    return {"Q": rng.standard_normal((B, H, S_q, D)), "K": rng.standard_normal((B, H_kv, S_k, D)),
            "V": rng.standard_normal((B, H_kv, S_k, D)), "dO": rng.standard_normal((B, H, S_q, D))}


def timing_json(out, dtype="fp64", layout="bhsd", causal=False, window=(-1, -1), scale=None, mask=False,
                seqlens=False, modes=("forward", "backward")):
    flags = {"causal": causal, "window_left": window[0], "window_right": window[1], "scale": scale,
             "seqlens_k": seqlens, "mask": mask}
    runs = [{"kernel": "naive-python", "mode": m, "status": "ok", "dtype": dtype, "layout": layout,
             "flags": flags} for m in modes]
    (out / "timing.json").write_text(json.dumps({"runs": runs}))


def save_all(directory, arrays):
    directory.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        np.save(directory / f"{name}.npy", a)


@pytest.fixture
def solved(tmp_path):
    """Every feature at once: GQA, causal with S_q > S_k, window, padding (one empty batch), and a
    mask with -inf entries and one fully -inf row."""
    x = make_inputs(B=2, H=4, H_kv=2, S_q=7, S_k=5, D=3)
    mask = np.random.default_rng(1).standard_normal((1, 4, 7, 5)).astype(np.float32)
    mask[0, 1, 6, :] = -np.inf
    mask[0, 2, 5, 1] = -np.inf
    seqlens = np.array([5, 0], dtype=np.int32)
    ref = naive(x["Q"], x["K"], x["V"], x["dO"], scale=0.7, causal=True, window=(3, -1), seqlens=seqlens,
                mask=mask)
    data, out = tmp_path / "data", tmp_path / "out"
    save_all(data, {**x, "mask": mask, "seqlens_k": seqlens})
    save_all(out, ref)
    timing_json(out, causal=True, window=(3, 0), scale=0.7, mask=True, seqlens=True)
    return data, out, ref


def test_naive_forward_and_backward_outputs_pass(solved):
    data, out, _ = solved
    r = run_reference(data, out)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("O", "lse", "dQ", "dK", "dV"):
        assert any(line.split()[:1] == [name] and line.endswith("PASS") for line in r.stdout.splitlines()), r.stdout


def test_one_corrupted_element_fails_with_exit_3(solved):
    data, out, ref = solved
    dk = ref["dK"].copy()
    dk[0, 1, 2, 0] += 1e-6
    np.save(out / "dK.npy", dk)
    r = run_reference(data, out)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "FAIL" in r.stdout


def test_nan_in_an_output_fails(solved):
    data, out, ref = solved
    o = ref["O"].copy()
    o[1, 0, 0, 0] = np.nan
    np.save(out / "O.npy", o)
    r = run_reference(data, out, "--max-rel-l2", "1")
    assert r.returncode == 3 and "NaN" in r.stdout


def test_lse_must_be_minus_inf_exactly_where_the_reference_is(solved):
    data, out, ref = solved
    lse = ref["lse"].copy()
    assert np.isneginf(lse[1]).all()  # batch 1 has no key
    lse[1, 0, 0] = 0.0
    np.save(out / "lse.npy", lse)
    r = run_reference(data, out, "--max-rel-l2", "1")
    assert r.returncode == 3 and "-inf" in r.stdout


def test_command_line_flags_override_timing_json(solved):
    data, out, _ = solved
    r = run_reference(data, out, "--no-causal", "--window", "3,-1")
    assert r.returncode == 3
    r = run_reference(data, out, "--causal", "--window", "3,-1")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mode_selects_the_outputs_checked(solved):
    data, out, ref = solved
    np.save(out / "dV.npy", ref["dV"] * 2)
    assert run_reference(data, out, "--mode", "forward").returncode == 0
    assert run_reference(data, out, "--mode", "backward").returncode == 3


def test_json_report_lists_every_output(solved):
    data, out, _ = solved
    r = run_reference(data, out, "--json")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["passed"] and [o["name"] for o in doc["checks"][0]["outputs"]] == ["O", "lse", "dQ", "dK", "dV"]


def test_quiet_prints_nothing_when_everything_passes(solved):
    data, out, _ = solved
    r = run_reference(data, out, "--quiet")
    assert r.returncode == 0 and r.stdout == ""


def test_generated_dO_is_read_from_the_output_directory(solved):
    data, out, _ = solved
    np.save(out / "dO.npy", np.load(data / "dO.npy"))
    (data / "dO.npy").unlink()
    assert run_reference(data, out).returncode == 0


def test_missing_input_is_exit_2_naming_the_directory(solved):
    data, out, _ = solved
    (data / "K.npy").unlink()
    r = run_reference(data, out)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and str(data) in r.stderr and "K" in r.stderr


def test_output_of_the_wrong_shape_is_exit_2_naming_the_file(solved):
    data, out, ref = solved
    np.save(out / "O.npy", ref["O"][:, :2])
    r = run_reference(data, out)
    assert r.returncode == 2 and str(out / "O.npy") in r.stderr


def test_bin_files_with_meta_json_in_bshd_layout(tmp_path):
    x = make_inputs(B=1, H=2, H_kv=1, S_q=6, S_k=4, D=5)
    ref = naive(x["Q"], x["K"], x["V"], x["dO"], causal=True)
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    for name in ("Q", "K", "V", "dO"):
        x[name].transpose(0, 2, 1, 3).astype(np.float32).tofile(data / f"{name}.bin")
    meta = {"format_version": 1, "layout": "bshd", "dtype": "fp32", "B": 1, "H": 2, "H_kv": 1, "S_q": 6,
            "S_k": 4, "D": 5}
    (data / "meta.json").write_text(json.dumps(meta))
    files = {}
    for name in ("O", "dQ", "dK", "dV"):
        a = ref[name].transpose(0, 2, 1, 3).astype(np.float32)
        a.tofile(out / f"{name}.bin")
        files[name] = {"dtype": "fp32", "shape": list(a.shape)}
    ref["lse"].astype(np.float32).tofile(out / "lse.bin")
    files["lse"] = {"dtype": "fp32", "shape": [1, 2, 6]}
    (out / "meta.json").write_text(json.dumps({"format_version": 1, "layout": "bshd", "files": files}))
    timing_json(out, dtype="fp32", layout="bshd", causal=True)
    r = run_reference(data, out)
    assert r.returncode == 0, r.stdout + r.stderr


def test_bin_files_in_a_directory_named_by_their_dims(tmp_path):
    x = make_inputs(B=1, H=2, H_kv=2, S_q=8, S_k=8, D=4)
    data, out = tmp_path / "B1_H2_S8_D4", tmp_path / "out"
    data.mkdir()
    for name in ("Q", "K", "V"):
        x[name].astype(np.float32).tofile(data / f"{name}.bin")
    x32 = {n: x[n].astype(np.float32).astype(np.float64) for n in ("Q", "K", "V")}
    ref = naive(x32["Q"], x32["K"], x32["V"])
    save_all(out, {"O": ref["O"].astype(np.float32), "lse": ref["lse"].astype(np.float32)})
    assert run_reference(data, out).returncode == 0


def test_bf16_inputs_stored_as_void2_npy(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = make_inputs(B=1, H=2, H_kv=2, S_q=9, S_k=9, D=8)
    xb = {n: a.astype(ml_dtypes.bfloat16) for n, a in x.items()}
    data, out = tmp_path / "data", tmp_path / "out"
    save_all(data, xb)  # numpy writes bfloat16 as '<V2'
    assert np.load(data / "Q.npy").dtype.str in ("<V2", "|V2")
    xd = {n: a.astype(np.float64) for n, a in xb.items()}
    ref = naive(xd["Q"], xd["K"], xd["V"], xd["dO"])
    save_all(out, {"O": ref["O"].astype(ml_dtypes.bfloat16), "lse": ref["lse"].astype(np.float32),
                   "dQ": ref["dQ"].astype(ml_dtypes.bfloat16)})
    r = run_reference(data, out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bf16" in r.stdout


def test_each_kernel_subdirectory_is_checked(solved, tmp_path):
    data, out, ref = solved
    both = tmp_path / "both"
    for kernel, scale in (("good", 1.0), ("bad", 1.5)):
        save_all(both / kernel, {"O": ref["O"] * scale, "lse": ref["lse"]})
        (both / kernel / "timing.json").write_text((out / "timing.json").read_text())
    r = run_reference(data, both)
    assert r.returncode == 3
    assert str(both / "good") in r.stdout and str(both / "bad") in r.stdout


# ---------------------------------------------------------------------------------------------
# Against the cpu kernel of a build.

BUILD = os.environ.get("FLASHATTN_BUILD_DIR", "")
DRIVER, GEN = Path(BUILD) / "flashattn", Path(BUILD) / "flashattn-gen"
needs_build = pytest.mark.skipif(
    not (BUILD and DRIVER.is_file() and GEN.is_file()),
    reason="set FLASHATTN_BUILD_DIR to a build directory containing flashattn and flashattn-gen")

CASES = {
    "plain": ([], []),
    "causal_sq_gt_sk": (["--S-q", "47", "--S-k", "33"], ["--causal"]),
    "causal_sq_lt_sk": ([], ["--causal"]),
    "window": ([], ["--window", "9,4"]),
    "gqa_h6_hkv1": (["--H", "6", "--H-kv", "1"], ["--causal"]),
    "padding": (["--seqlens-k", "47,0"], []),
    "mask": (["--mask", "random"], []),
    "bshd": (["--layout", "bshd"], ["--causal"]),
    "bin": (["--format", "bin"], ["--window", "5,-1"]),
    "everything": (["--seqlens-k", "40,13", "--mask", "random"], ["--causal", "--window", "11,-1"]),
}


def generate(tmp_path, gen_flags):
    data = tmp_path / "data"
    base = {"--B": "2", "--H": "4", "--H-kv": "2", "--S-q": "33", "--S-k": "47", "--D": "16",
            "--dtype": "fp64", "--seed": "1"}
    for flag in gen_flags[::2]:
        base.pop(flag, None)
    cmd = [str(GEN), "--out", str(data), *[t for kv in base.items() for t in kv], "--with-dO", *gen_flags]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0 and "--layout" in gen_flags:
        pytest.skip(f"flashattn-gen cannot write this layout: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    return data


def run_cpu(data, out, run_flags):
    cmd = [str(DRIVER), "--compute", "cpu", "--mode", "both", "--data", str(data), "--out", str(out),
           "--dtype", "fp64", "--quiet", *run_flags]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_build
@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_agrees_with_the_cpu_kernel_to_fp64_precision(tmp_path, case):
    gen_flags, run_flags = CASES[case]
    data, out = generate(tmp_path, gen_flags), tmp_path / "out"
    run_cpu(data, out, run_flags)
    r = run_reference(data, out, "--max-rel-l2", "1e-12")
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("O", "lse", "dQ", "dK", "dV"):
        assert any(line.split()[:1] == [name] for line in r.stdout.splitlines()), f"{name} not checked:\n{r.stdout}"


@needs_build
def test_reference_rejects_a_corrupted_cpu_kernel_output(tmp_path):
    data, out = generate(tmp_path, ["--mask", "random"]), tmp_path / "out"
    run_cpu(data, out, ["--causal"])
    dk = np.load(out / "dK.npy")
    dk.flat[dk.size // 2] += 1e-6 * np.abs(dk).max()
    np.save(out / "dK.npy", dk)
    r = run_reference(data, out)
    assert r.returncode == 3, r.stdout + r.stderr
    assert any(line.split()[:1] == ["dK"] and "FAIL" in line for line in r.stdout.splitlines())
