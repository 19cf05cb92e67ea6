"""peers.py's checks: a PyTorch backend's outputs checked by flashattn's own validator
(fa_check_attention in libflashattn_capi), with the problem and inputs exactly as the backend saw
them, so a peer's row in a table is checked by the same rules as ours (src/validate.h): the fp64
reference and a same-dtype naive baseline on the same sampled rows (the row sample follows
--seed, as flashattn's --check does).

The forward checks O (SDPA returns no lse); the backward checks dQ, dK and dV.
"""

import numpy as np

DIMS = ("B", "H", "H_kv", "S_q", "S_k", "D")


def host_payload(torch, t):
    """A contiguous host copy of device tensor t in its own dtype: float32 values, or the raw 16-bit
    payload of fp16 / bf16 (numpy has no bf16; the validator reads the bits)."""
    t = t.detach().contiguous()
    if t.dtype != torch.float32:
        t = t.view(torch.int16)
    return t.cpu().numpy()


def host_mask(p):
    """The additive mask as the validator takes it: float32 [mB, mH, S_q, S_k] (mB in {1, B}, mH in
    {1, H}), without materializing the batch or head broadcast of the stored mask."""
    if p.mask is None:
        return None
    m = p.mask  # reference.Problem: float64 broadcast to [B, H, S_q, S_k]; stride 0 where broadcast
    mB = 1 if m.strides[0] == 0 else m.shape[0]
    mH = 1 if m.strides[1] == 0 else m.shape[1]
    return np.ascontiguousarray(m[:mB, :mH], dtype=np.float32)


def problem_json(p, mode, seed, mask=None):
    """fa_check_attention's problem object for problem p (reference.Problem's fields)."""
    problem = {n: int(p.dims[n]) for n in DIMS}
    problem.update(dtype=p.dtype, mode=mode, causal=bool(p.causal), window_left=int(p.window[0]),
                   window_right=int(p.window[1]), scale=float(p.scale), seed=int(seed))
    if mask is not None:
        problem["mask_shape"] = list(mask.shape)
    return problem


def host_inputs(torch, p, inputs, mode):
    """Q, K, V (and dO for the backward), seqlens_k and the mask, as the validator takes them; the
    copies are kept on `inputs` so each backend and mode of a problem reuses them."""
    cache = inputs.host
    names = ("Q", "K", "V", "dO") if mode == "backward" else ("Q", "K", "V")
    device = {"Q": inputs.q, "K": inputs.k, "V": inputs.v, "dO": inputs.dout}
    for n in names:
        if n not in cache:
            cache[n] = host_payload(torch, device[n])
    if "mask" not in cache:
        cache["mask"] = host_mask(p)
        cache["seqlens_k"] = None if p.seqlens is None else np.ascontiguousarray(p.seqlens, dtype=np.int32)
    return {n: cache[n] for n in names + ("seqlens_k", "mask")}


def check_outputs(capi, torch, p, mode, seed, inputs, outputs):
    """The "check" object of one backend and mode: outputs maps O (forward) or dQ, dK, dV
    (backward) to device tensors [B, heads, S, D]. The reference of a problem and mode is computed
    once (a checker kept on `inputs`) and serves every backend."""
    tensors = host_inputs(torch, p, inputs, mode)
    problem = problem_json(p, mode, seed, tensors["mask"])
    got = {n: host_payload(torch, t) for n, t in outputs.items()}
    make = getattr(capi, "checker", None)
    key = ("checker", mode)
    if make is not None and key not in inputs.host:
        inputs.host[key] = make(problem, tensors)
    checker = inputs.host.get(key)
    if checker is None:
        return capi.check_attention(problem, dict(tensors, **got))
    return checker.check(got)


def check_notes(check):
    """A note for a check that failed: which outputs, by how much."""
    if not check or not check.get("performed") or check.get("passed"):
        return []
    failed = []
    for name, o in check.get("outputs", {}).items():
        if not o.get("passed", True):
            measured, tol = o.get("measured"), o.get("tolerance")
            bound = f" {measured:.3g} > {tol:.3g}" if measured is not None and tol is not None else " non-finite"
            failed.append(f"{name} {o.get('metric', 'error')}{bound}")
    return ["check FAILED: " + ("; ".join(failed) if failed else "see check")]
