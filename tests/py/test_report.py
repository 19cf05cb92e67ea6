"""scripts/report.py on synthetic results: the markdown table and its ratios, the summary tables,
CSV, the README section, the plots, and loading results into pandas (skipped where matplotlib or
pandas is not installed)."""
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import report  # noqa: E402


def run_rec(kernel, mode="forward", B=2, H=4, S=1024, D=64, dtype="bf16", causal=False, ms=1.0, status="ok",
            reason="", extra_per_score=0.0, noise=0.002):
    """One run in the schema of flashattn --json (only the fields report.py reads, plus a few)."""
    es = 4 if dtype == "fp32" else 2
    q = B * H * S * D * es
    flops = 4.0 * D * B * H * S * S * (2.5 if mode == "backward" else 1.0)
    r = {"kernel": kernel, "mode": mode, "status": status, "reason": reason, "gpu": True,
         "shape": {"B": B, "H": H, "H_kv": H, "S_q": S, "S_k": S, "D": D}, "dtype": dtype, "layout": "bhsd",
         "flags": {"causal": causal, "window_left": -1, "window_right": -1, "scale": 0.125, "seqlens_k": False,
                   "mask": False}}
    if status == "ok":
        extra = int(extra_per_score * B * H * S * S) + B * H * S * 4
        r.update(timing={"unit": "ms", "mode": "cold", "median_ms": ms, "min_ms": ms, "max_ms": ms, "mean_ms": ms,
                         "rel_stddev": noise, "noise": noise, "max_noise": 0.005, "noise_rule_met": noise <= 0.005,
                         "stop_reason": "noise" if noise <= 0.005 else "max_time", "repeat": 20, "l2_flush": True,
                         "samples_ms": [ms] * 3, "throttled": False, "throttle_reasons": []},
                 throughput={"flops": flops, "tflops": flops / (ms * 1e-3) / 1e12, "bytes": 4.0 * q,
                             "gbps": 4.0 * q / (ms * 1e-3) / 1e9, "peak_fraction": None},
                 memory={"inputs_bytes": 3 * q, "outputs_bytes": q, "workspace_bytes": 0, "extra_bytes": extra,
                         "peak_bytes": 4 * q + extra, "device_used_bytes": None},
                 check=None, notes=[])
    return r


def doc(runs, **extra):
    d = {"schema_version": 1, "tool": {"name": "flashattn"},
         "device": {"present": True, "name": "Test GPU", "memory_bytes": 80 << 30,
                    "peak": {"fp32_tflops": 60.0, "tensor_fp16_bf16_tflops": 900.0, "dram_gbps": 3000.0}},
         "runs": runs}
    d.update(extra)
    return d


def write_json(path, d):
    path.write_text(json.dumps(d, indent=2))
    return str(path)


def write_jsonl(path, docs):
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return str(path)


@pytest.fixture
def grid(tmp_path):
    """A small sweep: 3 sequence lengths x 2 modes, our two kernels in one JSON Lines file, PyTorch
    in another, and a ceilings document."""
    ours, peers = [], []
    for S in (512, 1024, 2048):
        B = 4096 // S
        ours.append(doc([run_rec("cublas", m, B=B, S=S, ms=2.0 * S / 512, extra_per_score=6.0) for m in ("forward", "backward")]
                        + [run_rec("fa", m, B=B, S=S, ms=0.5 * S / 512) for m in ("forward", "backward")]))
        peers.append(doc([run_rec("torch-flash", m, B=B, S=S, ms=1.0 * S / 512) for m in ("forward", "backward")]
                         + [run_rec("torch-math", m, B=B, S=S, status="skipped", reason="PyTorch refused: CUDA out of memory")
                            for m in ("forward", "backward")]))
    files = [write_jsonl(tmp_path / "ours.jsonl", ours), write_jsonl(tmp_path / "peers.jsonl", peers),
             write_json(tmp_path / "ceilings.json",
                        doc([], ceilings={"bf16_gemm_tflops": 700.0, "fp32_gemm_tflops": 50.0, "copy_gbps": 2900.0}))]
    return files


def rows_of(text, kernel, problem=None, mode="forward"):
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 3 and cells[2] == kernel and cells[1] == mode and (problem is None or cells[0] == problem):
            out.append(cells)
    return out


def test_table_has_a_row_per_run_and_ratios_against_torch_flash_and_cublas(grid):
    res = report.Results(grid)
    base = report.resolve_baselines(res, None)
    assert base == ["torch-flash", "cublas"]
    text = report.table(res, base)
    head = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert head[-3:] == ["vs torch-flash", "vs cublas", "notes"]
    fa = rows_of(text, "fa", "B8 H4 S512 D64 bf16")[0]
    assert fa[3] == "0.5000" and fa[-3] == "2.00×" and fa[-2] == "4.00×"
    flash = rows_of(text, "torch-flash", "B8 H4 S512 D64 bf16")[0]
    assert flash[-3] == "–"  # no ratio against itself
    assert len([line for line in text.splitlines() if line.startswith("| B")]) == 3 * 2 * 4


def test_o_s2_kernels_are_detected_from_their_memory(grid):
    res = report.Results(grid)
    assert res.quadratic == {"cublas"}
    text = report.table(res, ["torch-flash"])
    assert "O(S²) memory" in rows_of(text, "cublas")[0][-1]
    assert rows_of(text, "fa")[0][-1] == ""


def test_skipped_runs_carry_their_reason_and_can_be_left_out(grid):
    res = report.Results(grid)
    text = report.table(res, ["torch-flash"])
    assert "skipped: PyTorch refused: CUDA out of memory" in rows_of(text, "torch-math")[0][-1]
    assert not rows_of(report.table(res, ["torch-flash"], skipped=False), "torch-math")


def test_json_and_jsonl_inputs_give_the_same_table(tmp_path, grid):
    docs = [json.loads(line) for line in Path(grid[0]).read_text().splitlines()]
    single = write_json(tmp_path / "one.json", doc([r for d in docs for r in d["runs"]]))
    a = report.table(report.Results([grid[0]]), ["cublas"])
    b = report.table(report.Results([single]), ["cublas"])
    assert a == b


def test_the_last_measurement_of_a_run_wins(tmp_path):
    first = write_json(tmp_path / "a.json", doc([run_rec("fa", ms=2.0)]))
    second = write_json(tmp_path / "b.json", doc([run_rec("fa", ms=1.0)]))
    res = report.Results([first, second])
    assert len(res.runs) == 1 and res.runs[0]["timing"]["median_ms"] == 1.0


def test_baseline_peers_gives_a_column_per_pytorch_backend(grid):
    res = report.Results(grid)
    assert report.resolve_baselines(res, "peers") == ["torch-flash", "torch-math"]
    assert report.resolve_baselines(res, "cublas,fa") == ["cublas", "fa"]


def test_default_baseline_falls_back_to_cublas_without_torch_flash(tmp_path):
    f = write_json(tmp_path / "a.json", doc([run_rec("cublas"), run_rec("fa", ms=0.5)]))
    assert report.resolve_baselines(report.Results([f]), None) == ["cublas"]


def test_noisy_runs_are_starred(tmp_path):
    f = write_json(tmp_path / "a.json", doc([run_rec("fa", noise=0.02)]))
    text = report.table(report.Results([f]), [])
    assert rows_of(text, "fa")[0][4] == "2.0%*"


def test_summary_has_a_table_per_dtype_mode_d_causal_with_tflops_per_length(grid):
    res = report.Results(grid)
    text = report.summary(res, report.resolve_baselines(res, None))
    assert text.count("| kernel | S=512 | S=1k | S=2k |") == 2  # forward and backward
    assert "B·S = 4096, H = 4" in text
    fa_row = next(line for line in text.splitlines() if line.startswith("| fa |"))
    assert "(2.00×)" in fa_row  # against torch-flash, the first baseline that ran there
    assert "| cublas ‡ |" in text and "oom" in text


def test_csv_has_one_row_per_run_with_ratios(tmp_path, grid):
    res = report.Results(grid)
    path = tmp_path / "r.csv"
    report.write_csv(res, ["torch-flash"], str(path))
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(res.runs) == 24
    fa = next(r for r in rows if r["kernel"] == "fa" and r["S_q"] == "512" and r["mode"] == "forward")
    assert float(fa["vs_torch-flash"]) == pytest.approx(2.0)
    assert fa["quadratic_memory"] == "False" and float(fa["median_ms"]) == 0.5
    assert set(report.CSV_COLUMNS) <= set(rows[0])


def test_command_line_writes_every_output_and_the_readme_section(tmp_path, grid):
    readme = tmp_path / "README.md"
    readme.write_text("# T\n\nbefore\n<!-- results:begin -->\nstale\n<!-- results:end -->\nafter\n")
    out = tmp_path / "docs"
    args = grid + ["--md", str(out / "results.md"), "--summary", str(out / "summary.md"), "--csv",
                   str(out / "results.csv"), "--readme", str(readme)]
    assert report.main(args) == 0
    text = readme.read_text()
    assert "stale" not in text and text.startswith("# T\n\nbefore\n") and text.endswith("after\n")
    assert "bf16 GEMM 700 TFLOP/s" in text and "(docs/results.md)" in text and "| kernel | S=512" in text
    for name in ("results.md", "summary.md", "results.csv"):
        assert (out / name).stat().st_size > 0


def test_readme_without_markers_is_an_error(tmp_path, grid):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="results:begin"):
        report.main(grid + ["--readme", str(readme)])


def test_bad_input_file_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"runs": []}\n{not json\n')
    p = subprocess.run([sys.executable, str(SCRIPTS / "report.py"), str(bad)], capture_output=True, text=True)
    assert p.returncode != 0 and "bad.jsonl:2" in p.stderr


def test_legacy_table_flag_prints_the_table(grid):
    p = subprocess.run([sys.executable, str(SCRIPTS / "report.py"), "--table"] + grid, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("device: Test GPU") and "| problem | mode | kernel |" in p.stdout


def test_plots_are_written_as_png(tmp_path, grid):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    assert report.main(grid + ["--plots", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["latency_bf16.png", "memory_bf16.png", "roofline.png", "speedup_bf16.png", "tflops_bf16.png"]
    for p in out.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_plots_of_a_few_unrelated_shapes_are_bar_charts(tmp_path):
    pytest.importorskip("matplotlib")
    import report_plots
    f = write_json(tmp_path / "a.json", doc([run_rec("fa", S=2048, B=8, dtype="fp32"),
                                              run_rec("fa", S=4096, B=4, H=8, dtype="fp32")]))
    res = report.Results([f])
    assert not report_plots.use_lines([r for r in res.runs])
    assert report.main([f, "--plots", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "tflops_fp32.png").exists()


def test_results_load_into_pandas_without_custom_code(tmp_path, grid):
    pd = pytest.importorskip("pandas")
    # JSON Lines (sweeps): one session document per line.
    runs = pd.json_normalize([r for line in open(grid[0]) for r in json.loads(line)["runs"]])
    assert {"kernel", "mode", "shape.S_q", "timing.median_ms", "throughput.tflops", "memory.peak_bytes"} <= set(runs.columns)
    assert len(runs) == 12
    # One document (.json).
    single = write_json(tmp_path / "one.json", doc([run_rec("fa"), run_rec("cublas", status="skipped", reason="x")]))
    df = pd.json_normalize(json.load(open(single))["runs"])
    assert len(df) == 2 and math.isnan(df.loc[1, "timing.median_ms"])


def test_report_script_runs_from_any_directory(tmp_path, grid):
    p = subprocess.run([sys.executable, str(SCRIPTS / "report.py")] + grid + ["--csv", "r.csv"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert os.path.exists(tmp_path / "r.csv")
