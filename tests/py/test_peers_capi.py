"""libflashattn_capi from Python: where peers.py looks for it, the ctypes wrapper (on a stub library
built from include/flashattn/capi.h), and, when the flashattn build has it, the real library's
validator on small host inputs (no GPU needed)."""
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import peers  # noqa: E402
import peers_capi  # noqa: E402


# ---- finding libflashattn_capi -----------------------------------------------------

def test_capi_is_looked_for_in_the_documented_order(tmp_path, monkeypatch):
    env, build = tmp_path / "env.so", tmp_path / "b"
    build.mkdir()
    monkeypatch.setenv("FLASHATTN_CAPI", str(env))
    monkeypatch.setenv("FLASHATTN_BUILD_DIR", str(build))
    assert peers_capi.candidates(str(tmp_path / "cli.so")) == [
        str(tmp_path / "cli.so"), str(env), str(build / peers_capi.LIBRARY),
        str(ROOT / "build-gpu" / peers_capi.LIBRARY), str(ROOT / "build" / peers_capi.LIBRARY)]
    (build / peers_capi.LIBRARY).write_text("")
    assert peers_capi.find() == str(build / peers_capi.LIBRARY)  # the first candidate that exists
    env.write_text("")
    assert peers_capi.find() == str(env)
    assert peers_capi.find(str(tmp_path / "missing.so")) is None  # --capi PATH is the only candidate


def test_peers_without_the_library_exits_2_with_one_line(tmp_path, capsys):
    assert peers.main(["--sweep", "fa-grid", "--capi", str(tmp_path / "none.so")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("peers.py: libflashattn_capi.so not found (build flashattn first, or pass --capi PATH / "
                           "set FLASHATTN_CAPI)")


STUB = r"""
#include "flashattn/capi.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static char err[256];
static long long releases;
int fa_capi_version(void) { return FA_CAPI_VERSION; }
const char* fa_last_error(void) { return err; }
void* fa_hold_create(void) { return malloc(1); }
int fa_hold_enqueue(void* h, void* s, double t) {
  if (t <= 0) { snprintf(err, sizeof err, "timeout %g is not positive", t); return -1; }
  return s == (void*)7 ? 0 : -1;
}
int fa_hold_release(void* h) { ++releases; return 0; }
long long fa_hold_timeouts(void* h) { return releases; }  /* the stub counts releases */
void fa_hold_destroy(void* h) { free(h); }
void* fa_flush_create(long long b) {
  if (b < 0) { snprintf(err, sizeof err, "l2_bytes %lld", b); return NULL; }
  long long* p = malloc(sizeof *p); *p = 2 * (b ? b : 50); return p;
}
int fa_flush_enqueue(void* f, void* s) { return 0; }
long long fa_flush_bytes(void* f) { return *(long long*)f; }
void fa_flush_destroy(void* f) { free(f); }
int fa_fill_normal(void* dst, int dtype, long long n, unsigned long long seed, unsigned long long tensor, void* s) {
  if (dtype != 0) { snprintf(err, sizeof err, "dtype %d", dtype); return -1; }
  for (long long i = 0; i < n; ++i) ((float*)dst)[i] = (float)(100 * seed + 10 * tensor + i);
  return 0;
}
char* fa_check_attention(const char* problem, const void* const* t) {
  if (!strstr(problem, "\"mode\"")) { snprintf(err, sizeof err, "no mode"); return NULL; }
  char* out = malloc(8192);
  int n = snprintf(out, 8192, "{\"performed\": true, \"passed\": true, \"problem\": %s, \"slots\": [", problem);
  for (int i = 0; i < 11; ++i) n += snprintf(out + n, 8192 - n, "%s%d", i ? ", " : "", t[i] != NULL);
  snprintf(out + n, 8192 - n, "], \"q0\": %g}", ((const float*)t[0])[0]);
  return out;
}
void fa_free(char* p) { free(p); }
"""


@pytest.fixture(scope="module")
def stub_capi(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler for the stub library")
    d = tmp_path_factory.mktemp("stub")
    (d / "stub.c").write_text(STUB)
    lib = d / peers_capi.LIBRARY
    subprocess.run([cc, "-shared", "-fPIC", "-Wall", "-Werror", "-I", str(ROOT / "include"), str(d / "stub.c"), "-o",
                    str(lib)], check=True)
    return peers_capi.load(str(lib))


def test_capi_wrapper_passes_handles_streams_and_counts(stub_capi):
    hold, flush = stub_capi.hold(), stub_capi.flush(1000)
    hold.enqueue(7, 2.0)
    hold.release()
    assert hold.timeouts() == 1 and flush.nbytes() == 2000
    flush.enqueue(7)
    hold.close()
    flush.close()
    buf = np.zeros(4, dtype=np.float32)
    stub_capi.fill_normal(buf.ctypes.data, "fp32", 4, 3, peers_capi.TENSOR_IDS["V"], 7)
    assert buf.tolist() == [330.0, 331.0, 332.0, 333.0]  # seed, tensor and n reached the library


def test_capi_failures_raise_with_the_library_message(stub_capi):
    with pytest.raises(peers_capi.CApiError, match="fa_hold_enqueue: timeout -1 is not positive"):
        stub_capi.hold().enqueue(7, -1.0)
    with pytest.raises(peers_capi.CApiError, match="fa_flush_create: l2_bytes -5"):
        stub_capi.flush(-5)
    with pytest.raises(peers_capi.CApiError, match="fa_fill_normal: dtype 2"):
        stub_capi.fill_normal(0, "bf16", 1, 0, 1, 7)


def test_capi_check_passes_the_problem_and_the_slots_in_order(stub_capi):
    problem = {"B": 1, "H": 2, "H_kv": 1, "S_q": 3, "S_k": 4, "D": 8, "dtype": "fp32", "mode": "forward"}
    q = np.full((1, 2, 3, 8), 2.5, dtype=np.float32)
    kv = np.zeros((1, 1, 4, 8), dtype=np.float32)
    got = stub_capi.check_attention(problem, {"Q": q, "K": kv, "V": kv, "O": q, "seqlens_k": np.ones(1, np.int32)})
    assert got["problem"] == problem and got["q0"] == 2.5
    assert got["slots"] == [1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0]  # Q K V dO O lse dQ dK dV seqlens_k mask
    with pytest.raises(peers_capi.CApiError, match="K has 16 elements"):  # sizes checked before the call
        stub_capi.check_attention(problem, {"Q": q, "K": kv[:, :, :2], "V": kv})
    with pytest.raises(peers_capi.CApiError, match="fa_check_attention: no mode"):
        stub_capi.check_attention({k: v for k, v in problem.items() if k != "mode"}, {"Q": q, "K": kv, "V": kv})


# ---- the real library's validator (no GPU needed) ---------------------------------------------

def real_capi_path():
    for build in (os.environ.get("FLASHATTN_BUILD_DIR"), str(ROOT / "build")):
        if build and os.path.isfile(os.path.join(build, peers_capi.LIBRARY)):
            return os.path.join(build, peers_capi.LIBRARY)
    return None


needs_capi = pytest.mark.skipif(real_capi_path() is None, reason=f"no {peers_capi.LIBRARY} in FLASHATTN_BUILD_DIR or "
                                "build/ (build flashattn with the C API)")


@needs_capi
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode", ["forward", "backward"])
def test_real_validator_passes_the_rounded_reference_and_fails_a_perturbed_output(dtype, mode):
    import reference
    if dtype == "bf16":
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    dims = {"B": 1, "H": 2, "H_kv": 1, "S_q": 12, "S_k": 20, "D": 8}
    B, H, H_kv, S_q, S_k, D = dims.values()
    p = types.SimpleNamespace(dims=dims, dtype=dtype, causal=True, window=(-1, -1), scale=D ** -0.5, mask=None,
                              seqlens=None)
    p.q, p.dout = (reference.round_to(rng.standard_normal((B, H, S_q, D)), dtype) for _ in range(2))
    p.k, p.v = (reference.round_to(rng.standard_normal((B, H_kv, S_k, D)), dtype) for _ in range(2))
    ref = reference.compute(p, reference.NumpyOps(), mode == "forward", mode == "backward")

    def payload(x):
        if dtype == "bf16":
            import ml_dtypes
            return x.astype(np.float32).astype(ml_dtypes.bfloat16)
        return x.astype({"fp32": np.float32, "fp16": np.float16}[dtype])

    import peers_check
    problem = peers_check.problem_json(p, mode, seed=0)
    outs = ["O"] if mode == "forward" else ["dQ", "dK", "dV"]
    tensors = {"Q": payload(p.q), "K": payload(p.k), "V": payload(p.v)}
    if mode == "backward":
        tensors["dO"] = payload(p.dout)
    capi = peers_capi.load(real_capi_path())
    good = capi.check_attention(problem, dict(tensors, **{n: payload(ref[n]) for n in outs}))
    assert good["performed"] and good["passed"], json.dumps(good, indent=1)
    assert set(good["outputs"]) == set(outs)
    bad = {n: payload(ref[n]) for n in outs}
    bad[outs[-1]].flat[5] += 1.0
    res = capi.check_attention(problem, dict(tensors, **bad))
    assert res["passed"] is False and res["outputs"][outs[-1]]["passed"] is False
    # A checker serves several sets of outputs of the problem (each backend of a point) with the
    # reference computed once: the same verdicts.
    checker = capi.checker(problem, tensors)
    assert checker.check({n: payload(ref[n]) for n in outs})["passed"]
    assert checker.check(bad)["passed"] is False
    checker.close()




@needs_capi
def test_real_validator_takes_the_mask_and_key_lengths_as_peers_passes_them():
    import peers_check
    import reference
    rng = np.random.default_rng(2)
    dims = {"B": 2, "H": 2, "H_kv": 2, "S_q": 6, "S_k": 10, "D": 8}
    B, H, H_kv, S_q, S_k, D = dims.values()
    stored_mask = rng.standard_normal((1, S_q, S_k)).astype(np.float32)  # broadcast over B and H
    p = types.SimpleNamespace(dims=dims, dtype="fp32", causal=False, window=(4, 1), scale=D ** -0.5,
                              mask=np.broadcast_to(stored_mask.astype(np.float64), (B, H, S_q, S_k)),
                              seqlens=np.array([10, 7]))
    p.q = reference.round_to(rng.standard_normal((B, H, S_q, D)), "fp32")
    p.k, p.v = (reference.round_to(rng.standard_normal((B, H_kv, S_k, D)), "fp32") for _ in range(2))
    o = reference.compute(p, reference.NumpyOps(), True, False)["O"].astype(np.float32)
    mask = peers_check.host_mask(p)
    assert mask.shape == (1, 1, S_q, S_k)  # the broadcast is not materialized
    problem = peers_check.problem_json(p, "forward", seed=0, mask=mask)
    tensors = {"Q": p.q.astype(np.float32), "K": p.k.astype(np.float32), "V": p.v.astype(np.float32),
               "seqlens_k": p.seqlens.astype(np.int32), "mask": mask}
    capi = peers_capi.load(real_capi_path())
    assert capi.check_attention(problem, dict(tensors, O=o))["passed"]
    # The same output judged without the key lengths: a different problem, so it fails.
    assert not capi.check_attention(problem, dict(tensors, O=o, seqlens_k=None))["passed"]
