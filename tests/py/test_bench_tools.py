"""The benchmark tools on a machine without a GPU: flashattn --sweep (dry runs, and real sweeps of
the cpu kernel on generated inputs), the timing fields of the JSON, scripts/sweep.sh (resume),
scripts/profile.sh (with a stand-in ncu), ncu_summary.py, and peers.py's grid (the rest of peers.py:
test_peers.py)."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))
BUILD = os.environ.get("FLASHATTN_BUILD_DIR", "")
FLASHATTN = Path(BUILD) / "flashattn"
HAS_GPU = os.environ.get("FLASHATTN_HAS_GPU") == "1"
needs_build = pytest.mark.skipif(not (BUILD and FLASHATTN.exists()), reason="set FLASHATTN_BUILD_DIR to a build")

TINY = {"name": "tiny", "defaults": {"dtype": "fp32", "causal": [False, True]},
        "points": [{"B": 1, "H": 2, "S": 16, "D": 8}, {"B": 2, "H": 4, "H_kv": 2, "S_q": 8, "S_k": 24, "D": 16,
                                                        "mode": "forward"}]}


def flashattn(*args, check=None):
    p = subprocess.run([str(FLASHATTN), *map(str, args)], capture_output=True, text=True)
    if check is not None:
        assert p.returncode == check, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


# ---- flashattn --sweep ---------------------------------------------------------------------------

@needs_build
def test_dry_run_lists_the_fa_grid_as_a_preset_file(tmp_path):
    p = flashattn("--sweep", "fa-grid", "--dry-run", "--compute", "cublas", check=0)
    grid = json.loads(p.stdout)
    assert grid["name"] == "fa-grid" and len(grid["points"]) == 24
    assert {(pt["B"] * pt["S_q"], pt["H"] * pt["D"]) for pt in grid["points"]} == {(16384, 2048)}
    assert {pt["dtype"] for pt in grid["points"]} == {"bf16"}
    assert all(pt["modes"] == ["forward", "backward"] for pt in grid["points"])
    # The printed grid is itself a preset that expands to the same points.
    (tmp_path / "g.json").write_text(p.stdout)
    again = json.loads(flashattn("--sweep", tmp_path / "g.json", "--dry-run", check=0).stdout)
    assert again["points"] == grid["points"]


@needs_build
@pytest.mark.parametrize("preset", sorted(p.name for p in (SCRIPTS / "presets").glob("*.json")))
def test_every_shipped_preset_expands(preset):
    grid = json.loads(flashattn("--sweep", SCRIPTS / "presets" / preset, "--dry-run", check=0).stdout)
    assert grid["points"], preset
    assert all(pt["B"] > 0 and pt["S_q"] > 0 and pt["D"] > 0 for pt in grid["points"])


@needs_build
def test_peers_expands_the_same_grids_as_flashattn(tiny):
    import peers
    for spec, cli, args in (("fa-grid", {}, []), (str(tiny), {"dtype": "bf16", "mode": "backward"},
                                                  ["--dtype", "bf16", "--mode", "backward"])):
        ours = json.loads(flashattn("--sweep", spec, "--dry-run", *args, check=0).stdout)["points"]
        _, theirs = peers.load_sweep(spec, cli)
        strip = lambda pts: [{k: v for k, v in p.items() if k != "kernels"} for p in pts]  # noqa: E731
        assert strip(ours) == strip(theirs)


@needs_build
@pytest.mark.parametrize("args, needle", [
    (["--sweep", "fa-grid", "--data", "X"], "--sweep: generates its inputs"),
    (["--sweep", "fa-grid", "--out", "X"], "--sweep: writes no data files"),
    (["--sweep", "/no/such.json", "--compute", "cpu"], "/no/such.json"),
    (["--sweep", "fa-grid", "--compute", "nosuch"], "unknown kernel 'nosuch'"),
    (["--sweep", "fa-grid"], "--compute"),
    (["--compute", "cpu", "--data", "X", "--dry-run"], "--dry-run"),
    (["--sweep", "fa-grid", "--compute", "cpu", "--max-noise", "-1"], "--max-noise"),
    (["--sweep", "fa-grid", "--compute", "cpu", "--max-time", "0"], "--max-time"),
    (["--sweep", "fa-grid", "--compute", "cpu", "--json", "/definitely/missing/r.json"], "--json"),
])
def test_sweep_usage_errors_exit_2_with_one_line(args, needle):
    p = flashattn(*args, check=2)
    assert len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr, p.stderr


@needs_build
def test_sweep_writes_one_document_per_point_as_json_lines(tmp_path, tiny):
    out = tmp_path / "r.jsonl"
    p = flashattn("--sweep", tiny, "--compute", "cpu", "--json", out, "--seed", 5, check=0)
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(docs) == 4  # 2 points x causal [false, true]
    assert [d["sweep"]["point"] for d in docs] == [1, 2, 3, 4] and docs[0]["sweep"]["points"] == 4
    assert docs[0]["data"] == {"generated": "normal(0, 1)", "where": "device" if HAS_GPU else "host", "seed": 5}
    assert [len(d["runs"]) for d in docs] == [2, 2, 1, 1]
    assert docs[2]["runs"][0]["shape"] == {"B": 2, "H": 4, "H_kv": 2, "S_q": 8, "S_k": 24, "D": 16}
    assert all(r["status"] == "ok" for d in docs for r in d["runs"])
    # One progress line per point on stderr, with n/total, elapsed and ETA.
    lines = [line for line in p.stderr.splitlines() if line.startswith("[")]
    assert len(lines) == 4 and lines[0].startswith("[1/4] B1 H2 S16 D8 fp32:") and "elapsed, ETA" in lines[0]


@needs_build
def test_sweep_records_what_cannot_run_as_skipped(tmp_path, tiny):
    out = tmp_path / "r.json"
    flashattn("--sweep", tiny, "--compute", "cpu,naive", "--json", out, "--quiet", check=0)
    runs = json.loads(out.read_text())["runs"]
    naive = [r for r in runs if r["kernel"] == "naive"]
    assert len(runs) == 12 and len(naive) == 6
    if not HAS_GPU:
        assert all(r["status"] == "skipped" and r["reason"].startswith("no GPU") for r in naive)


@needs_build
@pytest.mark.skipif(HAS_GPU, reason="on a GPU machine the GPU kernels run")
def test_a_sweep_of_gpu_kernels_without_a_gpu_is_a_usage_error():
    p = flashattn("--sweep", "fa-grid", "--compute", "cublas", check=2)
    assert "need a GPU" in p.stderr


@needs_build
def test_timing_json_reports_the_stopping_rule(tmp_path):
    data = tmp_path / "d"
    subprocess.run([str(Path(BUILD) / "flashattn-gen"), "--out", str(data), "--B", "1", "--H", "2", "--S", "16",
                    "--D", "8"], check=True, capture_output=True)
    p = flashattn("--compute", "cpu", "--data", data, "--no-write", "--json", "-", "--hot", "--min-samples", 2,
                  "--quiet", check=0)
    t = json.loads(p.stdout)["runs"][0]["timing"]
    assert t["mode"] == "hot" and t["l2_flush"] is False
    for key in ("noise", "max_noise", "noise_rule_met", "stop_reason", "min_samples", "wall_s", "sm_clock_min_mhz",
                "throttled", "throttle_reasons"):
        assert key in t
    assert t["stop_reason"] == "min_samples" and t["noise_rule_met"] is None  # host kernels: a fixed count
    assert t["min_samples"] == 2


# ---- scripts/sweep.sh ------------------------------------------------------------------------------

@needs_build
def test_sweep_sh_appends_every_run_and_resumes_without_redoing_them(tmp_path):
    out = tmp_path / "r.jsonl"
    cmd = ["bash", str(SCRIPTS / "sweep.sh"), "--build", BUILD, "--out", str(out), "--kernels", "cpu",
           "--B", "1", "--H", "2", "--S", "16,24", "--D", "8", "--dtype", "fp32", "--causal", "0,1"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert len(out.read_text().splitlines()) == 8  # 2 S x 2 causal x 2 modes
    assert "[8/8]" in p.stderr and "ETA" in p.stderr
    p = subprocess.run(cmd[:-4] + ["--S", "16,24,32", "--dtype", "fp32", "--causal", "0,1"], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("done before") == 8
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(docs) == 12 and {d["runs"][0]["shape"]["S_q"] for d in docs} == {16, 24, 32}


@needs_build
def test_sweep_sh_records_unsupported_runs_as_skipped(tmp_path):
    out = tmp_path / "r.jsonl"
    p = subprocess.run(["bash", str(SCRIPTS / "sweep.sh"), "--build", BUILD, "--out", str(out), "--kernels", "naive",
                        "--B", "1", "--H", "2", "--S", "16", "--D", "8", "--dtype", "fp32", "--modes", "forward"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    run = json.loads(out.read_text())["runs"][0]
    if HAS_GPU:
        assert run["status"] == "ok"
    else:
        assert run["status"] == "skipped" and "needs a GPU" in run["reason"] and run["shape"]["S_q"] == 16
    bad = subprocess.run(["bash", str(SCRIPTS / "sweep.sh"), "--build", BUILD, "--out", str(out), "--kernels", "nosuch"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown kernel 'nosuch'" in bad.stderr


# ---- scripts/profile.sh and ncu_summary.py -------------------------------------------------------

RAW_CSV = '''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","dram__bytes_read.sum","dram__bytes_write.sum","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active","sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active","sm__warps_active.avg.pct_of_peak_sustained_active","launch__registers_per_thread","l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum","l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"
"","","","","","","","","","","","nsecond","%","byte","byte","%","%","%","register/thread","byte","byte"
"0","1","flashattn","h","gemm_kernel","1","7","(256, 1, 1)","(64, 32, 1)","0","9.0","1,000,000","45.5","2000000000","1000000000","80.1","5.0","40.2","168","0","0"
"1","1","flashattn","h","softmax_kernel","1","7","(128, 1, 1)","(4096, 1, 1)","0","9.0","500000","90.0","1500000000","1500000000","n/a","12.5","85.0","32","4096","2048"
'''


def test_ncu_summary_reads_the_raw_page_in_base_units(tmp_path):
    import ncu_summary
    path = tmp_path / "raw.csv"
    path.write_text("==PROF== Connected to process\n" + RAW_CSV)
    rows = ncu_summary.read_raw(str(path))
    assert len(rows) == 2 and rows[0]["gpu__time_duration.sum"] == pytest.approx(1e-3)
    text = ncu_summary.summarize(rows, flops=3e9)
    gemm = next(line for line in text.splitlines() if line.startswith("gemm_kernel"))
    assert "1000.0" in gemm and "3000" in gemm and "80.1" in gemm and "168" in gemm  # us, GB/s, mma %, regs
    soft = next(line for line in text.splitlines() if line.startswith("softmax_kernel"))
    assert " 4/2" in soft  # local-memory KB loaded / stored: spills
    assert text.splitlines()[-1].startswith("total: 2 kernel(s), 1500.0 us") and "2.00 TFLOP/s" in text


@needs_build
def test_profile_sh_runs_ncu_on_the_timed_range_and_prints_the_summary(tmp_path):
    fake = tmp_path / "ncu"
    # Capture: run the profiled command (everything after -o FILE) and leave a report; import:
    # print the raw page.
    fake.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "--import" ]; then cat "{tmp_path}/raw.csv"; exit 0; fi
echo "$@" > "{tmp_path}/ncu_args"
while [ $# -gt 0 ] && [ "$1" != "-o" ]; do shift; done
touch "$2.ncu-rep"; shift 2
exec "$@"
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "raw.csv").write_text(RAW_CSV)
    env = dict(os.environ, NCU=str(fake), FLASHATTN_BUILD_DIR=BUILD, PROFILE_OUT=str(tmp_path / "out"),
               PROFILE_DATA=str(tmp_path / "data"))
    p = subprocess.run(["bash", str(SCRIPTS / "profile.sh"), "cpu", "forward", "B1_H2_S32_D8_fp32_causal"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    args = (tmp_path / "ncu_args").read_text()
    assert "--set full --clock-control none --nvtx --nvtx-include timed/" in args
    assert "--warmup 0 --repeat 1 --max-noise 0" in args and "--causal" in args
    assert "total: 2 kernel(s)" in p.stdout and "TFLOP/s" in p.stdout
    bad = subprocess.run(["bash", str(SCRIPTS / "profile.sh"), "cpu", "forward", "B1_S32"], capture_output=True,
                         text=True, env=env)
    assert bad.returncode == 2 and "SHAPE" in bad.stderr
