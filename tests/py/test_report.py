"""scripts/report.py on synthetic results: the markdown table and its ratios, the summary tables,
CSV, the README section, the plots, the decode table, and loading results into pandas (skipped
where matplotlib or pandas is not installed). Also the rules every output applies: one statistic
on both sides of a ratio, noise-rule misses marked, failed runs never quoted, unchecked runs
marked, no absolute paths."""
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
            reason="", extra_per_score=0.0, noise=0.002, min_ms=None, check="ok"):
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
        r.update(timing={"unit": "ms", "mode": "cold", "method": "held_stream", "flush_method": "write_then_read",
                         "hold_timeouts": 0, "batches_rerun": 0,
                         "median_ms": ms, "min_ms": min_ms or ms, "max_ms": ms, "mean_ms": ms,
                         "rel_stddev": noise, "noise": noise, "max_noise": 0.005, "noise_rule_met": noise <= 0.005,
                         "stop_reason": "noise" if noise <= 0.005 else "max_time", "repeat": 20, "l2_flush": True,
                         "samples_ms": [ms] * 3, "throttled": False, "throttle_reasons": []},
                 throughput={"flops": flops, "tflops": flops / (ms * 1e-3) / 1e12, "bytes": 4.0 * q,
                             "gbps": 4.0 * q / (ms * 1e-3) / 1e9, "peak_fraction": None},
                 memory={"inputs_bytes": 3 * q, "outputs_bytes": q, "workspace_bytes": 0, "extra_bytes": extra,
                         "peak_bytes": 4 * q + extra, "device_used_bytes": None},
                 check=check_rec(check), notes=[])
    return r


def check_rec(state):
    """check: 'ok', 'fail' (passed false) or None (not checked)."""
    if state is None:
        return None
    o = {"metric": "max_abs", "measured": 2e-3 if state == "ok" else 0.5, "tolerance": 4e-3,
         "passed": state == "ok"}
    return {"performed": True, "passed": state == "ok", "reference": "cpu fp64", "rows_checked": 64,
            "rows_total": 1024, "outputs": {"O": o}}


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
    assert rows_of(text, "fa")[0][6] == "2.0%*"


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


# ---- the rules every output applies ------------------------------------------------------------

def pair(tmp_path, ours=None, peer=None, name="pair.json"):
    """fa and torch-flash on one problem: fa median 1.0 / min 0.5, torch-flash median 2.0 / min 1.8."""
    ours = ours or {}
    peer = peer or {}
    runs = [run_rec("fa", **{"ms": 1.0, "min_ms": 0.5, **ours}),
            run_rec("torch-flash", **{"ms": 2.0, "min_ms": 1.8, **peer})]
    return write_json(tmp_path / name, doc(runs))


def summary_row(text, kernel):
    line = next(line for line in text.splitlines() if line.startswith(f"| {kernel} |"))
    return [c.strip() for c in line.strip("|").split("|")][1:]


@pytest.mark.parametrize("stat,expected", [("median", 2.0), ("min", 3.6)])
def test_every_ratio_uses_the_chosen_statistic_on_both_sides(tmp_path, stat, expected):
    res = report.Results([pair(tmp_path)])
    assert rows_of(report.table(res, ["torch-flash"], stat=stat), "fa")[0][-2] == f"{expected:.2f}×"
    assert f"({expected:.2f}×)" in summary_row(report.summary(res, ["torch-flash"], stat), "fa")[0]
    path = tmp_path / "r.csv"
    report.write_csv(res, ["torch-flash"], str(path), stat)
    fa = next(r for r in csv.DictReader(path.open()) if r["kernel"] == "fa")
    assert float(fa["vs_torch-flash"]) == pytest.approx(expected) and fa["ratio_stat"] == stat


def test_tflops_come_from_the_chosen_statistic(tmp_path):
    res = report.Results([pair(tmp_path)])
    r = next(r for r in res.runs if r["kernel"] == "fa")
    med = float(summary_row(report.summary(res, ["torch-flash"], "median"), "fa")[0].split()[0])
    low = float(summary_row(report.summary(res, ["torch-flash"], "min"), "fa")[0].split()[0])
    assert med == pytest.approx(r["throughput"]["tflops"], abs=0.05) and low == pytest.approx(2 * med, abs=0.1)


def test_tables_and_legends_name_the_statistic(tmp_path):
    res = report.Results([pair(tmp_path)])
    assert "× = min time of torch-flash / min time" in report.summary(res, ["torch-flash"], "min")
    assert "min time of K / min time of the row's kernel" in report.table(res, ["torch-flash"], stat="min")


def test_full_table_shows_median_min_and_their_ratio_for_peers_too(tmp_path):
    text = report.table(report.Results([pair(tmp_path)]), ["torch-flash"])
    head = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert head[3:6] == ["median ms", "min ms", "median/min"]
    assert rows_of(text, "torch-flash")[0][3:6] == ["2.000", "1.800", "1.111"]
    assert rows_of(text, "fa")[0][3:6] == ["1.000", "0.5000", "2.000"]


def test_a_peer_that_missed_the_noise_rule_is_starred_everywhere(tmp_path):
    res = report.Results([pair(tmp_path, peer={"noise": 0.02})])
    assert rows_of(report.table(res, ["torch-flash"]), "torch-flash")[0][6] == "2.0%*"
    text = report.summary(res, ["torch-flash"])
    assert summary_row(text, "torch-flash")[0].endswith("*")
    assert "*" not in summary_row(text, "fa")[0]
    assert "1 of 2 rows" in text


def test_a_failed_run_is_never_quoted_and_gives_no_ratio(tmp_path):
    res = report.Results([pair(tmp_path, peer={"check": "fail"})])
    text = report.summary(res, ["torch-flash"])
    assert summary_row(text, "torch-flash") == ["FAIL"]
    assert "×" not in summary_row(text, "fa")[0]  # no baseline left in the block: no ratio at all
    assert rows_of(report.table(res, ["torch-flash"]), "torch-flash")[0][9] == "5.0e-01 FAIL"
    path = tmp_path / "r.csv"
    report.write_csv(res, ["torch-flash"], str(path))
    rows = {r["kernel"]: r for r in csv.DictReader(path.open())}
    assert rows["fa"]["vs_torch-flash"] == "" and rows["torch-flash"]["check_passed"] == "False"


def test_a_ratio_against_a_baseline_that_failed_there_is_a_dash(tmp_path):
    runs = [run_rec("fa", S=S, B=8192 // S, ms=1.0) for S in (512, 1024)]
    runs += [run_rec("torch-flash", S=512, B=16, ms=2.0), run_rec("torch-flash", S=1024, B=8, ms=2.0, check="fail")]
    res = report.Results([write_json(tmp_path / "a.json", doc(runs))])
    cells = summary_row(report.summary(res, ["torch-flash"]), "fa")
    assert cells[0].endswith(" (2.00×)") and cells[1].endswith(" (–)")
    fa = rows_of(report.table(res, ["torch-flash"]), "fa")
    assert [r[-2] for r in fa] == ["2.00×", "–"]


def test_a_failed_run_is_not_plotted(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import report_plots
    plotted = []
    orig = report_plots.Style.for_runs
    monkeypatch.setattr(report_plots.Style, "for_runs", lambda self, runs: (plotted.extend(runs), orig(self, runs))[1])
    runs = [run_rec(k, S=S, B=8192 // S, ms=m, check="fail" if k == "bad" else "ok")
            for S in (512, 1024, 2048) for k, m in (("fa", 1.0), ("bad", 0.1), ("torch-flash", 2.0))]
    f = write_json(tmp_path / "a.json", doc(runs))
    assert report.main([f, "--plots", str(tmp_path / "p")]) == 0
    assert plotted and {r["kernel"] for r in plotted} == {"fa", "torch-flash"}


def test_an_unchecked_run_is_marked(tmp_path):
    res = report.Results([pair(tmp_path, ours={"check": None})])
    assert rows_of(report.table(res, ["torch-flash"]), "fa")[0][9] == "unchecked"
    assert rows_of(report.table(res, ["torch-flash"]), "torch-flash")[0][9] == "2.0e-03 ok"
    text = report.summary(res, ["torch-flash"])
    assert summary_row(text, "fa")[0].endswith("† (2.00×)") and "†: not checked by --check: 1 of 2 rows" in text
    assert "†" not in summary_row(text, "torch-flash")[0]
    path = tmp_path / "r.csv"
    report.write_csv(res, ["torch-flash"], str(path))
    rows = {r["kernel"]: r for r in csv.DictReader(path.open())}
    assert rows["fa"]["check_passed"] == "" and rows["torch-flash"]["check_passed"] == "True"


def test_unchecked_runs_are_hollow_and_labelled_in_plots(tmp_path):
    pytest.importorskip("matplotlib")
    import report_plots
    res = report.Results([pair(tmp_path, ours={"check": None})])
    style = report_plots.Style(res).for_runs(res.runs)
    assert style.label("fa") == "fa (unchecked)" and style.line("fa")["markerfacecolor"] == "white"
    assert style.label("torch-flash") == "torch-flash" and style.line("torch-flash")["markerfacecolor"] != "white"


def test_csv_source_is_a_base_name_and_reasons_lose_their_paths(tmp_path):
    skipped = run_rec("cublas", status="skipped", reason="/home/me/data/B2_H4/Q.npy: unsupported dtype")
    f = write_json(tmp_path / "a.json", doc([run_rec("fa"), skipped]))
    path = tmp_path / "r.csv"
    report.write_csv(report.Results([f]), [], str(path))
    text = path.read_text()
    assert str(tmp_path) not in text and "/home/me" not in text and "Q.npy: unsupported dtype" in text
    assert {r["source"] for r in csv.DictReader(path.open())} == {"a.json"}


def test_csv_has_the_timing_method_columns(tmp_path):
    path = tmp_path / "r.csv"
    report.write_csv(report.Results([pair(tmp_path)]), [], str(path))
    fa = next(r for r in csv.DictReader(path.open()) if r["kernel"] == "fa")
    assert (fa["median_over_min"], fa["timing_method"], fa["flush_method"], fa["hold_timeouts"]) == \
        ("2.0", "held_stream", "write_then_read", "0")


def test_readme_header_names_device_statistic_method_and_checks(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:begin -->\n<!-- results:end -->\n")
    f = pair(tmp_path, ours={"check": None})
    assert report.main([f, "--readme", str(readme), "--stat", "min", "--csv", str(tmp_path / "d" / "r.csv")]) == 0
    text = readme.read_text()
    assert "Test GPU" in text and "the **min** time" in text and "no host time inside the events" in text
    assert "1 of 2 rows were checked by `--check` (fp64 reference on sampled rows)" in text
    assert "(d/r.csv)" in text and str(tmp_path) not in text


def test_readme_header_says_every_row_was_checked(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:begin -->\n<!-- results:end -->\n")
    assert report.main([pair(tmp_path), "--readme", str(readme)]) == 0
    assert "Every row was checked by `--check`" in readme.read_text()


def test_table_with_peers_baseline_shows_median_and_min(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPTS / "report.py"), "--table", "--baseline", "peers", pair(tmp_path)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "| median ms | min ms | median/min |" in p.stdout and "| vs torch-flash |" in p.stdout


def test_a_hot_run_does_not_replace_a_cold_one(tmp_path):
    hot = run_rec("fa", ms=0.5)
    hot["timing"]["mode"] = "hot"
    res = report.Results([write_json(tmp_path / "a.json", doc([run_rec("fa")])),
                          write_json(tmp_path / "b.json", doc([hot]))])
    assert sorted(r["timing"]["mode"] for r in res.runs) == ["cold", "hot"]


# ---- decode ------------------------------------------------------------------------------------

def decode_rec(kernel, tmode, step_ms, attn_ms, check="ok", noise_met=True):
    """A decode run: timing = the step, decode.attention.timing = the attention alone."""
    B, H, H_kv, D, L = 16, 32, 8, 128, 8192
    kv = B * L * H_kv * D * 2 * 2

    def timing(ms):
        return {"unit": "ms", "mode": tmode, "method": "held_stream", "median_ms": ms, "min_ms": 0.9 * ms,
                "noise": 0.001, "rel_stddev": 0.001, "max_noise": 0.005, "noise_rule_met": noise_met}

    return {"kernel": kernel, "mode": "decode", "status": "ok", "gpu": True,
            "shape": {"B": B, "H": H, "H_kv": H_kv, "S_q": 1, "S_k": 8192, "D": D}, "dtype": "bf16", "layout": "bhsd",
            "flags": {"causal": True}, "timing": timing(step_ms),
            "throughput": {"flops": 4.0 * D * B * H * L, "bytes": kv, "gbps": kv / step_ms / 1e6},
            "check": check_rec(check), "notes": [],
            "decode": {"S_new": 1, "S_max": 8192, "cache_seqlens": [L - 1] * B,
                       "kv_lengths": {"min": L, "max": L, "mean": L}, "paged": False, "page_size": 0,
                       "splits": 1 if not kernel.startswith("torch-") else None, "kv_bytes": kv,
                       "step": {"median_ms": step_ms}, "bandwidth_reference": {"kind": "copy", "gbps": 3000.0},
                       "attention": {"median_ms": attn_ms, "gbps": kv / attn_ms / 1e6, "bandwidth_fraction": None,
                                     "timing": timing(attn_ms)}}}


@pytest.fixture
def decode_files(tmp_path):
    """mma and two PyTorch backends at one point, cold and hot in separate documents."""
    cold = doc([decode_rec("mma", "cold", 0.20, 0.19), decode_rec("torch-flash", "cold", 0.30, 0.21),
                decode_rec("torch-cudnn", "cold", 0.26, 0.20)])
    hot = doc([decode_rec("mma", "hot", 0.10, 0.08), decode_rec("torch-flash", "hot", 0.16, 0.12),
               decode_rec("torch-cudnn", "hot", 0.13, 0.09, check=None, noise_met=False)])
    return [write_json(tmp_path / "cold.json", cold), write_json(tmp_path / "hot.json", hot)]


def decode_row(text, kernel):
    cells = summary_row(text, kernel)
    head = next(line for line in text.splitlines() if line.startswith("| kernel | splits"))
    return dict(zip([c.strip() for c in head.strip("|").split("|")][1:], cells))


def test_cold_and_hot_decode_runs_both_survive(decode_files):
    res = report.Results(decode_files)
    assert len(res.runs) == 6
    assert sorted(r["timing"]["mode"] for r in res.runs if r["kernel"] == "mma") == ["cold", "hot"]


def test_decode_table_pairs_attention_with_attention_and_step_with_step(decode_files):
    import report_decode
    text = report_decode.decode_table(report.Results(decode_files))
    assert text.count("| kernel | splits |") == 1 and "B16 H32/8 D128, S_new = 1, KV length 8192" in text
    mma = decode_row(text, "mma")
    assert (mma["attention cold ms"], mma["attention hot ms"], mma["step cold ms"], mma["step hot ms"]) == \
        ("0.1900", "0.0800", "0.2000", "0.1000")
    # 0.21/0.19 and 0.12/0.08 (attention); 0.30/0.20 and 0.16/0.10 (step).
    assert mma["attention vs torch-flash (cold / hot)"] == "1.11× / 1.50×"
    assert mma["step vs torch-flash (cold / hot)"] == "1.50× / 1.60×"
    assert mma["attention GB/s cold (% of copy)"].startswith("2826 (94.2 %)")
    assert "holds only in the mode" in text


def test_decode_table_marks_unchecked_and_noisy_peer_runs(decode_files):
    import report_decode
    text = report_decode.decode_table(report.Results(decode_files))
    cudnn = decode_row(text, "torch-cudnn")
    assert cudnn["attention hot ms"] == "0.0900*†" and cudnn["step cold ms"] == "0.2600"
    assert decode_row(text, "mma")["step vs torch-cudnn (cold / hot)"] == "1.30× / 1.30×"


def test_decode_table_uses_the_chosen_statistic(decode_files):
    import report_decode
    text = report_decode.decode_table(report.Results(decode_files), "min")
    assert decode_row(text, "mma")["attention cold ms"] == "0.1710"  # 0.9 x 0.19
    assert decode_row(text, "mma")["attention vs torch-flash (cold / hot)"] == "1.11× / 1.50×"


def test_a_failed_decode_run_reads_fail_and_gives_no_ratio(tmp_path):
    import report_decode
    f = write_json(tmp_path / "a.json", doc([decode_rec("mma", "cold", 0.2, 0.19, check="fail"),
                                             decode_rec("torch-flash", "cold", 0.3, 0.21)]))
    mma = decode_row(report_decode.decode_table(report.Results([f])), "mma")
    assert mma["attention cold ms"] == "FAIL" and mma["step vs torch-flash (cold / hot)"] == "– / –"


def test_the_decode_table_follows_the_grid_tables_in_the_summary(tmp_path, decode_files, grid):
    res = report.Results(grid + decode_files)
    text = report.summary(res, report.resolve_baselines(res, None))
    assert text.index("| kernel | S=512") < text.index("decode, B16") and "| decode" not in text.split("decode, B16")[0]
    assert report.main(decode_files + ["--decode-md", str(tmp_path / "dec.md")]) == 0
    assert "| kernel | splits |" in (tmp_path / "dec.md").read_text()


def test_readme_header_counts_rows_timed_without_the_held_stream(tmp_path):
    old = run_rec("fa")
    del old["timing"]["method"]
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:begin -->\n<!-- results:end -->\n")
    f = write_json(tmp_path / "a.json", doc([old, run_rec("torch-flash")]))
    assert report.main([f, "--readme", str(readme)]) == 0
    assert "except 1 of 2 rows, timed without the held stream (method not recorded: 1)" in readme.read_text()


def test_a_skipped_decode_run_joins_the_point_of_its_shape(tmp_path):
    import report_decode
    skipped = {k: v for k, v in decode_rec("torch-cudnn", "cold", 1, 1).items()
               if k in ("kernel", "mode", "gpu", "shape", "dtype", "layout", "flags")}
    skipped.update(status="skipped", reason="No available kernel")
    f = write_json(tmp_path / "a.json", doc([skipped, decode_rec("mma", "cold", 0.2, 0.19),
                                             decode_rec("torch-flash", "cold", 0.3, 0.21)]))
    text = report_decode.decode_table(report.Results([f]))
    assert text.count("| kernel | splits |") == 1
    assert decode_row(text, "torch-cudnn")["attention cold ms"] == "skipped"
