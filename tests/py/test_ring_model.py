"""scripts/ring_model.py: the kernel-rate fit, the ring's step model and the tables it prints."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import ring_model as m  # noqa: E402


def ring_run(S, causal, ms, one_ms, tflops, passed=True, mode="forward"):
    return {"kernel": "hopper", "mode": mode, "status": "ok", "dtype": "bf16",
            "shape": {"B": 1, "H": 32, "H_kv": 32, "S_q": S, "S_k": S, "D": 128},
            "flags": {"causal": causal}, "timing": {"median_ms": ms}, "check": {"passed": passed},
            "ring": {"devices": [0, 1], "one_gpu_median_ms": one_ms, "scaling_efficiency": one_ms / (2 * ms),
                     "per_gpu": [{"device": 0, "tflops": tflops}, {"device": 1, "tflops": tflops}]}}


def test_rate_fit_recovers_a_saturating_curve():
    r_max, p_half = 700.0, 3e8
    pts = [(p, r_max * p / (p + p_half)) for p in (1e8, 1e9, 1e10)]
    fit = m.Rate(pts)
    assert fit.r_max == pytest.approx(r_max, rel=1e-9)
    assert fit.p_half == pytest.approx(p_half, rel=1e-9)
    flat = m.Rate([(1e9, 500.0), (4e9, 450.0)])  # falling rates: kept flat at the largest block's
    assert flat.r_max == 450.0 and flat.p_half == 0.0


def test_pairs_counts_causal_like_flashattn():
    assert m.pairs(4, 4, False) == 16
    assert m.pairs(4, 4, True) == 10
    assert m.pairs(2, 4, True) == 3 + 4  # bottom-right aligned: two more keys for each row
    assert m.pairs(4, 2, True) == 3


def test_transfers_bound_small_blocks_and_efficiency_grows_with_S():
    rate = m.Rate([(1e9, 600.0)])
    effs = [m.predict(rate, "forward", False, 8, S, 1, 32, 32, 128, "bf16", 360, 20, 3000)[2]
            for S in (8192, 65536, 1 << 20)]
    assert effs[0] < effs[1] < effs[2] <= 1.0
    # A slower link cannot make a ring faster; one ten times slower still hides under these
    # blocks (the own block fills the first wait), one a hundred times slower does not.
    fast, slower, slowest = (m.predict(rate, "backward", True, 4, 65536, 1, 32, 8, 128, "bf16", gbps, 20, 3000)[0]
                             for gbps in (360, 36, 3.6))
    assert fast == pytest.approx(slower) and slowest > slower


def test_cli_prints_the_measured_rings_and_ignores_failed_checks(tmp_path):
    runs = [ring_run(16384, False, 4.0, 6.0, 540.0), ring_run(32768, False, 15.5, 28.0, 565.0),
            ring_run(32768, True, 9.0, 14.0, 500.0, passed=False)]
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"device": {"peak": {"dram_gbps": 3350}}, "runs": runs}) + "\n")
    out = tmp_path / "pred.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "ring_model.py"), str(f), "--N", "2,4", "--S",
                        "32768,131072", "--json", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "| forward | B1 H32 S32768 D128 | 2 |" in r.stdout
    assert "causal" not in r.stdout.split("Predicted")[0]  # the failed run is not used
    pred = json.loads(out.read_text())
    assert len(pred["predictions"]) == 4 and len(pred["checks"]) == 2
    assert all(0 < p["efficiency"] <= 1.0 for p in pred["predictions"])


def test_compare_sets_rings_beside_the_model_without_fitting_them(tmp_path):
    fit = tmp_path / "fit.jsonl"
    fit.write_text(json.dumps({"runs": [ring_run(16384, False, 4.0, 6.0, 540.0),
                                        ring_run(32768, False, 15.5, 28.0, 565.0)]}) + "\n")
    four = dict(ring_run(65536, False, 30.0, 110.0, 400.0))  # a far slower per-GPU rate: unfitted, no effect
    four["ring"] = dict(four["ring"], devices=[0, 1, 2, 3], scaling_efficiency=110.0 / (4 * 30.0))
    more = tmp_path / "four.jsonl"
    more.write_text(json.dumps({"runs": [four]}) + "\n")
    cmd = [sys.executable, str(ROOT / "scripts" / "ring_model.py"), str(fit), "--N", "2,4", "--S", "65536"]
    alone = subprocess.run(cmd + ["--json", str(tmp_path / "a.json")], capture_output=True, text=True)
    both = subprocess.run(cmd + ["--compare", str(more), "--json", str(tmp_path / "b.json")], capture_output=True,
                          text=True)
    assert alone.returncode == 0 and both.returncode == 0, alone.stderr + both.stderr
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert a["fits"] == b["fits"] and a["predictions"] == b["predictions"]
    assert [c["in_fit"] for c in b["checks"]] == [True, True, False]
    row = [line for line in both.stdout.splitlines() if "| S65536" in line or "S65536 D128 | 4 |" in line][0]
    assert row.startswith("| forward | B1 H32 S65536 D128 | 4 |") and row.endswith("| 0.917 | no |")


def test_the_shipped_measurement_loads():
    f = ROOT / "docs" / "results" / "ring_2gpu_forward.jsonl"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "ring_model.py"), str(f), "--N", "2", "--S", "32768"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Measured rings against the model" in r.stdout


def test_report_ring_puts_both_rings_side_by_side(tmp_path):
    import report_ring

    def rec(kernel, mode, ms, one_ms, passed=True):
        f = 4.0 * 32 * 128 * 32768 ** 2 * (2.5 if mode == "backward" else 1)
        return {"kernel": kernel, "mode": mode, "status": "ok", "shape": {"B": 1, "H": 32, "H_kv": 32, "S_q": 32768,
                "S_k": 32768, "D": 128}, "flags": {"causal": False}, "timing": {"median_ms": ms},
                "throughput": {"flops": f}, "check": {"passed": passed} if kernel == "hopper" else None,
                "ring": {"size": 2, "one_gpu_median_ms": one_ms, "scaling_efficiency": one_ms / (2 * ms)}}
    ours, peers = tmp_path / "o.jsonl", tmp_path / "p.jsonl"
    ours.write_text(json.dumps({"runs": [rec("hopper", "forward", 15.0, 28.0), rec("hopper", "backward", 40.0, 80.0)]}) + "\n")
    peers.write_text(json.dumps({"runs": [rec("torch-cp-cudnn", "forward", 18.0, 30.0),
                                          rec("torch-cp-cudnn", "backward", 50.0, 85.0)]}) + "\n")
    text = report_ring.table(report_ring.load(ours), report_ring.load(peers))
    assert "| B1 H32 S32768 D128 | forward | 15.000 | 18.000 | 1.200× |" in text
    both = [line for line in text.splitlines() if "| both |" in line][0]
    assert "| 55.000 | 68.000 | 1.236× |" in both
    assert both.endswith("| 0.982 | 0.846 | – | – | – | – | – |")  # (28 + 80) / (2 x 55), (30 + 85) / (2 x 68)
    ours.write_text(json.dumps({"runs": [dict(rec("hopper", "forward", 15.0, 28.0),
                                              timing={"median_ms": 15.0, "sm_clock_mean_mhz": 1800.4},
                                              ring={"size": 2, "one_gpu_median_ms": 28.0, "scaling_efficiency": 0.93,
                                                    "one_gpu_sm_clock_mean_mhz": 1950.0,
                                                    "per_gpu": [{"device": 0, "blocks_ms": 14.5},
                                                                {"device": 1, "blocks_ms": 14.8}]})]}) + "\n")
    forward = report_ring.table(report_ring.load(ours), report_ring.load(peers)).splitlines()[2]
    assert forward.endswith("| 1800 / 1950 | GPU 1 +2.1 % | – |")  # 14.8 / 14.5


def test_report_ring_gives_each_cards_one_gpu_time(tmp_path):
    import report_ring

    def rec(kernel, mode, ms, cards=None):
        r = {"kernel": kernel, "mode": mode, "status": "ok", "shape": {"B": 1, "H": 32, "H_kv": 32, "S_q": 65536,
             "S_k": 65536, "D": 128}, "flags": {"causal": True}, "timing": {"median_ms": ms},
             "throughput": {"flops": 1e15}, "check": {"passed": True},
             "ring": {"size": 2, "one_gpu_median_ms": 2 * ms, "scaling_efficiency": 0.95}}
        if cards:
            r["ring"]["one_gpu_per_rank"] = [{"rank": i, "device": i, "median_ms": t} for i, t in enumerate(cards)]
            r["ring"]["scaling_efficiency_cards"] = 0.5  # the table recomputes it from the times
        return r
    ours, peers = tmp_path / "o.jsonl", tmp_path / "p.jsonl"
    ours.write_text(json.dumps({"runs": [rec("hopper", "forward", 27.0, [52.0, 53.25]),
                                         rec("hopper", "backward", 78.0, [148.5, 152.0])]}) + "\n")
    peers.write_text(json.dumps({"runs": [rec("torch", "forward", 32.0), rec("torch", "backward", 92.0)]}) + "\n")
    lines = report_ring.table(report_ring.load(ours), report_ring.load(peers)).splitlines()
    assert lines[0].endswith("| ours one GPU by rank's card, ms |") and lines[1].count("|---") == 14
    assert lines[2].endswith("| 52.00 / 53.25 |") and lines[3].endswith("| 148.50 / 152.00 |")
    assert lines[4].endswith("| 200.50 / 205.25 |")  # both: forward + backward on each card
    combined = 1 / ((1 / 148.5 + 1 / 152.0) * 78.0)  # the cards' combined rate over the ring's time
    assert f"| 0.950 | 0.950 | {combined:.3f} | – |" in lines[3]  # PyTorch's record has no per-rank times
    # the same cards listed the other way round: the same efficiency
    ours.write_text(json.dumps({"runs": [rec("hopper", "backward", 78.0, [152.0, 148.5])]}) + "\n")
    assert f"| {combined:.3f} | – |" in report_ring.table(report_ring.load(ours), report_ring.load(peers)).splitlines()[2]


def test_report_ring_variants_pools_rounds_and_compares_with_the_first(tmp_path):
    import report_ring_variants as rv

    def rec(ms, ends, profiled, lend=None, passed=True):
        return {"kernel": "hopper", "mode": "backward", "status": "ok",
                "shape": {"B": 1, "H": 32, "H_kv": 32, "S_q": 65536, "S_k": 65536, "D": 128},
                "flags": {"causal": True}, "timing": {"median_ms": ms}, "check": {"passed": passed},
                "ring": {"size": 2, "scaling_efficiency": 150.0 / (2 * ms), "profiled_ms": profiled,
                         "per_gpu": [{"device": 0, "blocks_ms": ends[0]}, {"device": 1, "blocks_ms": ends[1]}],
                         "lend": lend}}
    files = {}
    for name, rounds in {"base": [rec(78.0, (76.0, 77.0), 77.8), rec(78.4, (76.2, 77.4), 78.2)],
                         "lend": [rec(77.0, (76.6, 76.5), 77.4, {"rank": 1, "kv_heads": 0.25, "auto": True, "lag_ms": 0.5}),
                                  rec(77.2, (76.7, 76.6), 77.5, {"rank": 1, "kv_heads": 0.25, "auto": True, "lag_ms": 0.84}),
                                  rec(70.0, (69.0, 69.0), 70.0, passed=False)]}.items():
        for i, r in enumerate(rounds):
            f = tmp_path / f"{name}.r{i}.jsonl"
            f.write_text(json.dumps({"runs": [r]}) + "\n")
            files.setdefault(name, []).append(f)
    args = [f"{n}={f}" for i in range(3) for n in ("base", "lend") if i < len(files[n]) for f in [files[n][i]]]
    variants, failed = rv.load_variants([a.split("=", 1) for a in args])
    assert failed == 1 and [n for n, _ in variants] == ["base", "lend"]
    lines = rv.table(variants).splitlines()
    assert lines[2].startswith("| B1 H32 S65536 D128 causal | backward | base | 78.000, 78.400 | 0.962, 0.957 | "
                               "78.200 | 1.000× | 76.20 / 77.40 | 0.800 | – |")
    # the failed third round is left out: the median of 77.0 and 77.2
    assert lines[3].startswith("| B1 H32 S65536 D128 causal | backward | lend | 77.000, 77.200 |")
    assert "| 77.100 | 1.014× | 76.70 / 76.60 | 0.800 | rank 1: 0.25 kv heads (auto, lag 0.84 ms) |" in lines[3]  # the last round's
    # where the record has it, the efficiency against the cards' combined rate beside the first GPU's
    cards = rec(78.0, (76.0, 77.0), 77.8)
    cards["ring"]["scaling_efficiency_cards"] = 0.9655
    f = tmp_path / "cards.jsonl"
    f.write_text(json.dumps({"runs": [cards]}) + "\n")
    assert "| 78.000 | 0.962 (0.966) | 78.000 |" in rv.table(rv.load_variants([("base", str(f))])[0])


def test_ring_variants_refuses_a_bad_setting_before_any_work():
    for setting, message in [("a=FOO=1", "is not FLASHATTN_RING_VAR=VALUE"), ("a b a", "named twice"),
                             ("a/b", "NAME must be")]:
        r = subprocess.run(["bash", str(ROOT / "scripts" / "ring_variants.sh")], capture_output=True, text=True,
                           env=dict(os.environ, RING_VARIANTS=setting))
        assert r.returncode == 2 and message in r.stderr, (setting, r.stderr)


def test_peers_ring_reads_the_presets_as_flashattn_does():
    import peers_ring  # torch is imported only when it runs

    name, points = peers_ring.load_sweep(str(ROOT / "scripts" / "presets" / "ring.json"), {"mode": "both"})
    assert name == "ring" and len(points) == 10  # five points, causal off and on
    assert all(p["modes"] == ["forward", "backward"] and p["S_q"] == p["S_k"] for p in points)
    assert {p["H_kv"] for p in points} == {32, 8}


def test_ring_rs_cost_documents_itself_without_a_gpu():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "ring_rs_cost.py"), "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert "reduce-scatter" in r.stdout and "--sweep" in r.stdout
