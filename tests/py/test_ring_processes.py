"""A ring of two processes, one GPU each (--ring-rank/--ring-size/--ring-id), as it would run
across nodes: rank 0 gathers, checks and reports; rank 1 computes its part and prints nothing.
Runs where two GPUs are present and the build has NCCL; skipped (saying why) elsewhere; the
options' refusals are checked everywhere. And one GPU playing both ranks of a ring
(--devices 0,0), where any GPU is present.

Needs FLASHATTN_BUILD_DIR pointing at a build directory holding flashattn and flashattn-gen.
"""
import json
import os
import pathlib
import shutil
import subprocess

import pytest

BUILD = os.environ.get("FLASHATTN_BUILD_DIR")
if not BUILD:
    pytest.skip("FLASHATTN_BUILD_DIR is not set (point it at the CMake build directory)", allow_module_level=True)
FLASHATTN = pathlib.Path(BUILD) / "flashattn"
GEN = pathlib.Path(BUILD) / "flashattn-gen"
if not (FLASHATTN.is_file() and GEN.is_file()):
    pytest.skip(f"flashattn or flashattn-gen not built in {BUILD}", allow_module_level=True)


def gpu_count():
    if not shutil.which("nvidia-smi"):
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU ")) if r.returncode == 0 else 0


@pytest.mark.parametrize("args, message", [
    (["--ring-rank", "0", "--ring-size", "2"], "give all three"),
    (["--ring-rank", "2", "--ring-size", "2", "--ring-id", "x"], "--ring-rank: 2 is not in 0..1"),
    (["--ring-rank", "0", "--ring-size", "1", "--ring-id", "x"], "--ring-size: a ring needs two"),
    (["--ring-rank", "0", "--ring-size", "2", "--ring-id", "x", "--devices", "0,1"], "conflicts with --devices"),
    (["--devices", "0,1,0"], "device 0 is listed twice"),
    (["--devices", "0,1", "--ring-baseline", "all"], "--ring-baseline: 'all' is not one of each, first"),
    (["--ring-baseline", "first"], "--ring-baseline: only with --devices or --ring-rank"),
])
def test_ring_options_are_refused_with_the_reason(args, message):
    r = subprocess.run([str(FLASHATTN), "--compute", "mma", "--data", "nowhere", *args], capture_output=True, text=True)
    assert r.returncode == 2
    assert message in r.stderr, r.stderr


def test_two_processes_check_against_the_reference(tmp_path):
    if gpu_count() < 2:
        pytest.skip(f"a ring of two processes needs two GPUs ({gpu_count()} present)")
    data = tmp_path / "data"
    subprocess.run([str(GEN), "--out", data, "--B", "2", "--H", "4", "--H-kv", "2", "--S", "301", "--D", "64",
                    "--dtype", "bf16", "--with-dO"], check=True, capture_output=True)
    ident = tmp_path / "ring.id"
    out = tmp_path / "rank0.json"
    common = ["--compute", "mma", "--mode", "both", "--causal", "--data", str(data), "--check", "--warmup", "1",
              "--repeat", "3", "--no-write", "--ring-size", "2", "--ring-id", str(ident)]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    ranks = [subprocess.Popen([str(FLASHATTN), *common, "--ring-rank", str(r), "--device", str(r),
                               *(["--json", str(out)] if r == 0 else [])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
    results = [p.communicate(timeout=300) for p in ranks]
    if "no NCCL" in results[0][1]:
        pytest.skip(results[0][1].strip())
    assert [p.returncode for p in ranks] == [0, 0], results
    assert results[1][0] == ""  # rank 1 reports nothing
    assert not ident.exists()  # rank 0 removes the id once every rank has joined
    doc = json.loads(out.read_text())
    runs = [r for r in doc["runs"] if r["kernel"] == "mma"]
    assert {r["mode"] for r in runs} == {"forward", "backward"}
    for r in runs:
        assert r["status"] == "ok" and r["check"]["passed"], r["check"]
        assert r["ring"]["size"] == 2 and r["ring"]["rank"] == 0
        assert r["ring"]["max_abs_vs_one_gpu"] is not None
        # each rank timed its own GPU alone in turn, and rank 0 has both times
        cards = r["ring"]["one_gpu_per_rank"]
        assert [(c["rank"], c["device"]) for c in cards] == [(0, 0), (1, 1)], cards
        assert all(c["median_ms"] > 0 for c in cards), cards
        assert cards[0]["median_ms"] == r["ring"]["one_gpu_median_ms"]
        assert r["ring"]["scaling_efficiency_cards"] > 0


def test_one_gpu_plays_both_ranks(tmp_path):
    if gpu_count() < 1:
        pytest.skip("no GPU present")
    data = tmp_path / "data"
    subprocess.run([str(GEN), "--out", data, "--B", "1", "--H", "4", "--H-kv", "2", "--S", "301", "--D", "64",
                    "--dtype", "bf16", "--with-dO"], check=True, capture_output=True)
    out = tmp_path / "ring.json"
    r = subprocess.run([str(FLASHATTN), "--compute", "mma", "--mode", "both", "--causal", "--data", str(data),
                        "--check", "--warmup", "1", "--repeat", "2", "--no-write", "--devices", "0,0",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    if "no NCCL" in r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    assert "ranks on GPU 0 alone" in r.stdout, r.stdout
    runs = [x for x in json.loads(out.read_text())["runs"] if x["kernel"] == "mma"]
    assert {x["mode"] for x in runs} == {"forward", "backward"}
    for x in runs:
        assert x["status"] == "ok" and x["check"]["passed"], x["check"]
        g = x["ring"]
        assert g["loopback"] and g["devices"] == [0, 0] and g["size"] == 2
        assert not g["registered_buffers"] and not g["copy_engine"]
        assert all(d["passed"] for d in g["vs_one_gpu"]), g["vs_one_gpu"]
        # one card for both ranks, timed once
        assert [(c["rank"], c["device"]) for c in g["one_gpu_per_rank"]] == [(0, 0), (1, 0)]
        assert g["one_gpu_per_rank"][0]["median_ms"] == g["one_gpu_per_rank"][1]["median_ms"] == g["one_gpu_median_ms"]
        assert abs(g["scaling_efficiency_cards"] - g["scaling_efficiency"]) < 1e-9
