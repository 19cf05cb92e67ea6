"""peers.py without a GPU or PyTorch: the held-stream timer on a simulated stream, and sweeps, data
and decode directories with a stand-in torch and a stand-in C API (peers_fakes.py)."""
import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import peers  # noqa: E402
import peers_capi  # noqa: E402
import peers_timing  # noqa: E402
from peers_fakes import FakeCApi, Sim, install_fake_torch, kernel, timer_torch  # noqa: E402

TINY = {"name": "tiny", "defaults": {"dtype": "fp32", "causal": [False, True]},
        "points": [{"B": 1, "H": 2, "S": 16, "D": 8}, {"B": 2, "H": 4, "H_kv": 2, "S_q": 8, "S_k": 24, "D": 16,
                                                        "mode": "forward"}]}
BF16 = {"name": "bf16", "points": [{"B": 1, "H": 2, "S": 16, "D": 8, "dtype": "bf16"}]}


# ---- the timer ---------------------------------------------------------------------------------

def test_timer_keeps_host_dispatch_time_out_of_the_events():
    sim = Sim()
    fn = kernel(sim, [1.0] * 1000, host_cost=5.0)  # Python dispatch 5x slower than the GPU
    t = peers.Timer(timer_torch(sim), FakeCApi(sim), 2, 10, True, 0.005, 1.0)(fn)
    assert t["method"] == "held_stream" and t["samples_ms"] == [1.0] * t["repeat"]
    assert t["hold_timeouts"] == 0 and t["batches_rerun"] == 0


def test_timer_flushes_outside_the_events_and_says_how():
    sim = Sim()
    t = peers.Timer(timer_torch(sim), FakeCApi(sim), 3, 5, True, 0.0, 1.0)(kernel(sim, [1.0] * 100))
    assert t["mode"] == "cold" and t["l2_flush"] is True and t["flush_method"] == "write_then_read"
    assert t["median_ms"] == t["min_ms"] == 1.0 and sim.flushes == 3 + 5


def test_timer_discards_and_reruns_a_batch_whose_hold_timed_out():
    sim = Sim()
    fn = kernel(sim, [1.0] * 1000, stall_at=6)  # call 6 makes the host miss the hold's timeout
    t = peers.Timer(timer_torch(sim), FakeCApi(sim), 0, 20, False, 0.0, 1.0)(fn)
    assert t["hold_timeouts"] == 1 and t["batches_rerun"] == 1
    assert t["repeat"] == 20 and t["samples_ms"] == [1.0] * 20  # none of the stall's host time
    assert "rerun" in peers.timing_notes(t, "")[0]


def test_timer_gives_up_after_eight_reruns():
    sim = Sim()
    durations = iter([1.0] * 100)

    def always_stalls():
        sim.submit(next(durations), host_cost=2500.0)
    with pytest.raises(peers_timing.HoldTimedOut, match="8 batches"):
        peers.Timer(timer_torch(sim), FakeCApi(sim), 0, 5, False, 0.0, 1.0)(always_stalls)
    assert sim.timeouts == peers_timing.MAX_RERUNS


def test_timer_stops_on_low_noise_after_min_samples():
    sim = Sim()
    t = peers.Timer(timer_torch(sim), FakeCApi(sim), 2, 10, True, 0.005, 1.0)(kernel(sim, [1.0] * 1000))
    assert t["stop_reason"] == "noise" and t["noise_rule_met"] is True and t["repeat"] >= 10
    assert t["median_ms"] == 1.0 and t["sm_clock_samples"] > 0


def test_timer_gives_up_at_max_time_when_noisy():
    sim = Sim()
    t = peers.Timer(timer_torch(sim), FakeCApi(sim), 0, 10, False, 0.005, 1e-9)(kernel(sim, [1.0, 2.0] * 100000))
    assert t["stop_reason"] == "max_time" and t["noise_rule_met"] is False
    assert t["mode"] == "hot" and t["flush_method"] is None
    assert peers.timing_notes(t, "")[0].startswith("noise ")


def test_timer_without_rule_takes_exactly_min_samples():
    sim = Sim()
    t = peers.Timer(timer_torch(sim), FakeCApi(sim), 0, 7, True, 0.0, 1.0)(kernel(sim, [1.0, 3.0] * 100))
    assert t["repeat"] == 7 and t["stop_reason"] == "min_samples" and t["noise_rule_met"] is None
    assert t["min_ms"] == 1.0 and t["max_ms"] == 3.0


# ---- peers.py with a stand-in torch ------------------------------------------------------------

@pytest.fixture
def fake(monkeypatch):
    sim = Sim()
    state = install_fake_torch(monkeypatch, sim)
    return types.SimpleNamespace(sim=sim, state=state, capi=FakeCApi(sim))


def preset(tmp_path, doc):
    path = tmp_path / f"{doc['name']}.json"
    path.write_text(json.dumps(doc))
    return path


def test_sweep_writes_one_checked_document_per_point_in_the_flashattn_schema(tmp_path, fake):
    out = tmp_path / "peers.jsonl"
    argv = ["--sweep", str(preset(tmp_path, TINY)), "--json", str(out), "--repeat", "3", "--max-time", "0.01",
            "--seed", "9"]
    assert peers.main(argv, capi=fake.capi) == 0
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(docs) == 4 and docs[0]["sweep"] == {"name": "tiny", "point": 1, "points": 4}
    assert docs[0]["data"] == {"generated": "normal(0, 1)", "where": "device (flashattn generator)", "seed": 9}
    runs = [r for d in docs for r in d["runs"]]
    assert {r["kernel"] for r in runs} == {"torch-flash", "torch-cudnn", "torch-efficient", "torch-math"}
    flash = [r for r in runs if r["kernel"] == "torch-flash"]
    assert all(r["status"] == "skipped" and "No available kernel" in r["reason"] for r in flash)  # fp32 preset
    ok = [r for r in runs if r["status"] == "ok"]
    assert len(ok) == 3 * 6  # three backends x (2 points x 2 modes + 2 points x 1 mode)
    assert all(r["check"]["performed"] and r["check"]["passed"] for r in ok)  # every published row checked
    assert all(r["timing"]["method"] == "held_stream" and r["timing"]["hold_timeouts"] == 0 for r in ok)
    r = next(r for r in ok if r["kernel"] == "torch-math" and r["mode"] == "forward")
    assert r["shape"]["S_q"] == 16 and r["dtype"] == "fp32" and r["timing"]["mode"] == "cold"
    assert r["memory"]["extra_bytes"] > 0 and r["memory"]["peak_bytes"] > r["memory"]["inputs_bytes"]
    assert r["throughput"]["tflops"] == pytest.approx(100.0, rel=1e-6)
    # report.py reads them alongside flashattn's runs, and marks math as O(S^2) memory.
    import report
    res = report.Results([str(out)])
    assert "torch-math" in res.quadratic and "torch-efficient" not in res.quadratic


def test_sweep_inputs_come_from_flashattn_generator_with_its_tensor_ids(tmp_path, fake):
    assert peers.main(["--sweep", str(preset(tmp_path, TINY)), "--seed", "5", "--max-noise", "0", "--repeat", "1",
                       "--json", str(tmp_path / "p.jsonl")], capi=fake.capi) == 0
    first = fake.capi.fills[:4]  # point 1 (both modes): Q, K, V, dO
    assert [f["tensor"] for f in first] == [1, 2, 3, 4] and {f["seed"] for f in fake.capi.fills} == {5}
    assert [f["n"] for f in first] == [1 * 2 * 16 * 8] * 4 and first[0]["dtype"] == "fp32"
    point3 = [f["tensor"] for f in fake.capi.fills[8:11]]  # point 2 is forward only: no dO
    assert point3 == [1, 2, 3] and fake.capi.fills[8]["n"] == 2 * 4 * 8 * 16


def test_sweep_checks_each_mode_on_the_problem_flashattn_checks(tmp_path, fake):
    assert peers.main(["--sweep", str(preset(tmp_path, BF16)), "--backends", "cudnn", "--seed", "3", "--causal",
                       "--max-noise", "0", "--repeat", "2", "--json", str(tmp_path / "p.json")], capi=fake.capi) == 0
    fwd, bwd = fake.capi.checks
    assert fwd["problem"] == {"B": 1, "H": 2, "H_kv": 2, "S_q": 16, "S_k": 16, "D": 8, "dtype": "bf16",
                              "mode": "forward", "causal": True, "window_left": -1, "window_right": -1,
                              "scale": 1 / math.sqrt(8), "seed": 3}
    assert set(fwd["tensors"]) == {"Q", "K", "V", "O"}  # SDPA gives no lse
    assert bwd["problem"]["mode"] == "backward" and set(bwd["tensors"]) == {"Q", "K", "V", "dO", "dQ", "dK", "dV"}
    assert all(t.dtype == np.int16 for t in fwd["tensors"].values())  # the raw bf16 payload


def test_a_failed_check_is_recorded_with_its_timing_and_exits_3(tmp_path, fake):
    fake.capi.passed = False
    out = tmp_path / "p.json"
    assert peers.main(["--sweep", str(preset(tmp_path, BF16)), "--backends", "math", "--mode", "forward",
                       "--max-noise", "0", "--repeat", "2", "--json", str(out)], capi=fake.capi) == 3
    r = json.loads(out.read_text())["runs"][0]
    assert r["status"] == "ok" and r["timing"]["repeat"] == 2 and r["check"]["passed"] is False
    assert any(n.startswith("check FAILED: O max_abs 0.5 > 0.01") for n in r["notes"])


def test_a_check_that_cannot_run_fails_the_run_and_exits_1(tmp_path, fake, monkeypatch):
    def refuse(problem, tensors):
        raise peers_capi.CApiError("fa_check_attention: bad problem")
    monkeypatch.setattr(fake.capi, "check_attention", refuse)
    out = tmp_path / "p.json"
    assert peers.main(["--sweep", str(preset(tmp_path, BF16)), "--backends", "math", "--mode", "forward",
                       "--json", str(out)], capi=fake.capi) == 1
    r = json.loads(out.read_text())["runs"][0]
    assert r["status"] == "failed" and r["reason"] == "libflashattn_capi: fa_check_attention: bad problem"


def test_no_check_leaves_check_null_and_calls_no_validator(tmp_path, fake):
    out = tmp_path / "p.json"
    assert peers.main(["--sweep", str(preset(tmp_path, BF16)), "--no-check", "--max-noise", "0", "--repeat", "2",
                       "--json", str(out)], capi=fake.capi) == 0
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 8 and all(r["check"] is None for r in runs) and fake.capi.checks == []
    assert all(h.closed for h in fake.capi.holds)


def write_data_dir(path, B=2, H=2, S=8, D=4, mask=True):
    rng = np.random.default_rng(0)
    path.mkdir()
    for name in ("Q", "K", "V", "dO"):
        np.save(path / f"{name}.npy", rng.standard_normal((B, H, S, D)).astype(np.float32))
    np.save(path / "seqlens_k.npy", np.array([S, S - 3], dtype=np.int32))
    if mask:
        np.save(path / "mask.npy", rng.standard_normal((1, 1, S, S)).astype(np.float32))
    return path


def test_a_data_directory_checks_with_its_mask_and_key_lengths(tmp_path, fake, capsys):
    data = write_data_dir(tmp_path / "d")
    out = tmp_path / "p.json"
    assert peers.main([str(data), "--mode", "both", "--causal", "--backends", "math,efficient", "--json", str(out),
                       "--max-noise", "0"], capi=fake.capi) == 0
    d = json.loads(out.read_text())
    assert d["data"] == {"dir": str(data), "input_dtype": "fp32", "generated_dO": False} and len(d["runs"]) == 4
    assert all(r["status"] == "ok" and r["flags"]["causal"] and r["check"]["passed"] for r in d["runs"])
    assert all(r["timing"]["repeat"] == 20 and r["timing"]["stop_reason"] == "min_samples" for r in d["runs"])
    check = fake.capi.checks[0]
    assert check["problem"]["mask_shape"] == [1, 1, 8, 8] and check["tensors"]["mask"].dtype == np.float32
    assert check["tensors"]["seqlens_k"].tolist() == [8, 5] and check["problem"]["causal"] is True
    assert "torch-math       forward" in capsys.readouterr().out


def test_a_data_directory_without_dO_generates_it_from_the_seed(tmp_path, fake):
    data = write_data_dir(tmp_path / "d", mask=False)
    (data / "dO.npy").unlink()
    out = tmp_path / "p.json"
    assert peers.main([str(data), "--mode", "backward", "--backends", "math", "--seed", "4", "--json", str(out),
                       "--max-noise", "0", "--repeat", "1"], capi=fake.capi) == 0
    assert json.loads(out.read_text())["data"]["generated_dO"] is True
    assert fake.capi.fills == [{"dtype": "fp32", "n": 2 * 2 * 8 * 4, "seed": 4, "tensor": 4}]


def write_decode_dir(path, lens=(5, 5), S_new=2, B=2, H=4, H_kv=2, S_max=16, D=8):
    rng = np.random.default_rng(0)
    path.mkdir()
    np.save(path / "q.npy", rng.standard_normal((B, H, S_new, D)).astype(np.float32))
    for name in ("k_new", "v_new"):
        np.save(path / f"{name}.npy", rng.standard_normal((B, H_kv, S_new, D)).astype(np.float32))
    for name in ("K_cache", "V_cache"):
        np.save(path / f"{name}.npy", rng.standard_normal((B, H_kv, S_max, D)).astype(np.float32))
    np.save(path / "cache_seqlens.npy", np.array(lens, dtype=np.int32))
    return path


def test_decode_times_the_step_and_the_attention_and_checks_the_step(tmp_path, fake):
    data = write_decode_dir(tmp_path / "dec")
    out = tmp_path / "p.json"
    assert peers.main([str(data), "--backends", "cudnn,math", "--hot", "--copy-gbps", "1000", "--json", str(out),
                       "--max-noise", "0", "--repeat", "4", "--warmup", "1"], capi=fake.capi) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["kernel"] for r in runs] == ["torch-cudnn", "torch-math"] and all(r["status"] == "ok" for r in runs)
    r = runs[0]
    dec = r["decode"]
    assert r["mode"] == "decode" and r["timing"]["mode"] == "hot" and r["timing"]["method"] == "held_stream"
    assert dec["step"]["what"] == "slice-assign k_new/v_new into the cache + SDPA"
    assert dec["step"]["median_ms"] == r["timing"]["median_ms"] and dec["step"]["min_ms"] == r["timing"]["min_ms"]
    assert dec["attention"]["timing"]["repeat"] == 4 and dec["attention"]["median_ms"] > 0
    assert dec["step"]["median_ms"] > dec["attention"]["median_ms"]  # the step also writes the new rows
    assert dec["step"]["bandwidth_fraction"] == pytest.approx(dec["step"]["gbps"] / 1000)
    assert dec["kv_lengths"] == {"min": 7, "max": 7, "mean": 7.0} and dec["bandwidth_reference"]["kind"] == "copy"
    # Every step call writes both caches: check, warm-up and timed repetitions.
    assert fake.state.assigns >= 2 * 2 * (1 + 1 + 4)
    check = fake.capi.checks[0]
    assert {k: check["problem"][k] for k in ("B", "H", "H_kv", "S_q", "S_k", "D", "mode", "causal")} == {
        "B": 2, "H": 4, "H_kv": 2, "S_q": 2, "S_k": 7, "D": 8, "mode": "forward", "causal": True}
    assert check["tensors"]["K"].shape == (2, 2, 7, 8) and r["check"]["passed"]


def test_decode_refuses_unequal_lengths_with_the_reason(tmp_path, fake):
    data = write_decode_dir(tmp_path / "dec", lens=(3, 5))
    out = tmp_path / "p.json"
    assert peers.main([str(data), "--backends", "math", "--json", str(out)], capi=fake.capi) == 0
    r = json.loads(out.read_text())["runs"][0]
    assert r["status"] == "skipped" and "cache lengths differ" in r["reason"]
