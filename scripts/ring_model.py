#!/usr/bin/env python3
"""A model of ring attention on larger rings, from measured numbers.

    ring_model.py RUNS.jsonl [RUNS.jsonl ...] [--compare MORE.jsonl ...] [--link-gbps 360]
                  [--latency-us 20] [--N 2,4,8,16,32,64] [--S 32768,131072,1048576]
                  [--H 32 --H-kv 32 --D 128]

RUNS are flashattn session JSON (Lines) files from runs with --devices (their `ring` object carries
the same kernel's one-GPU time) and/or one-GPU runs; only runs that passed --check are used.
--compare names rings that are set beside the model but left out of its fit (a larger ring
measured after the model was fitted on smaller ones: an out-of-sample test).

The model, per mode (forward, backward) and mask (causal or not):
  * Kernel rate. A block of P visible (query, key) pairs per head runs at
        R(P) = R_max * P / (P + P_half)
    (a launch's fixed costs and its last partial wave weigh less as the block grows), fitted
    through the one-GPU points of the inputs (two or more sizes fit both parameters; one fixes
    R_max at that point's rate and P_half = 0).
  * A ring step computes S/N x S/N pairs (half under causal: zig-zag gives every step the same
    half) per head, while the next K/V shard (2 * B * H_kv * S/N * D * 2 bytes) crosses one link
    at --link-gbps, after --latency-us; the step takes the longer of the two. The forward adds one
    pass over the fp32 running O per step (merge) at the device's memory bandwidth. The backward
    computes the other shards' blocks first, each step after the first also carrying the previous
    step's fp32 dK/dV accumulator (twice the K/V bytes, in fp32) over the same link, and its own
    block beside them on a second stream from the start: the own block fills the wait for the
    first shard, and what is left of it covers the last accumulator's hop home.
  * Scaling efficiency = T(1 GPU, S) / (N * T(ring of N, S)); per-GPU TFLOP/s = FLOPs / N / T.

Where the inputs (or --compare) hold ring runs, the model's prediction for those points is printed
next to the measurement, with whether the point was in the fit. Prints markdown tables; --json
writes the predictions.
"""
import argparse
import json
import math
import sys

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def load_runs(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            text = f.read()
        docs = []
        try:
            docs = [json.loads(text)]
        except json.JSONDecodeError:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        for doc in docs:
            dram = ((doc.get("device") or {}).get("peak") or {}).get("dram_gbps")
            for r in doc.get("runs", []):
                if r.get("status") != "ok" or not (r.get("check") or {}).get("passed"):
                    continue
                r = dict(r)
                r["_dram_gbps"] = dram
                runs.append(r)
    return runs


def pairs(S_q, S_k, causal):
    """Visible (query, key) pairs of one head (causal aligned at the bottom right, as flashattn's)."""
    if not causal:
        return float(S_q) * S_k
    if S_k >= S_q:
        return S_q * (S_q + 1) / 2 + float(S_q) * (S_k - S_q)
    return S_k * (S_k + 1) / 2


def flops(mode, B, H, D, P):
    f = 4.0 * B * H * D * P
    return f * 2.5 if mode == "backward" else f


def cards_efficiency(one_gpu_ms, ring_ms):
    """Scaling efficiency against the ring's cards (flashattn's ring_cards_efficiency): each
    rank's card alone takes one_gpu_ms[r]; together, each doing the share its speed allows, they
    would take 1 / sum(1 / t); that over the ring's time. T(one GPU) / (N T(ring)) for cards
    alike, and not tied to which card is listed first. None where a time is missing."""
    if not one_gpu_ms or not ring_ms or any(not t or t <= 0 for t in one_gpu_ms):
        return None
    return 1.0 / (sum(1.0 / t for t in one_gpu_ms) * ring_ms)


class Rate:
    """R(P) = r_max * P / (P + p_half), fitted through (P, TFLOP/s) points."""

    def __init__(self, points):
        pts = sorted(points)
        if not pts:
            raise ValueError("no points")
        if len(pts) == 1 or pts[0][0] == pts[-1][0]:
            self.r_max, self.p_half = max(r for _, r in pts), 0.0
            return
        # 1/R = (1/r_max) + (p_half/r_max) * (1/P): a straight line in 1/P, least squares.
        xs = [1.0 / p for p, _ in pts]
        ys = [1.0 / r for _, r in pts]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
        icpt = my - slope * mx
        if icpt <= 0 or slope < 0:
            # The rate falls as blocks grow: a GPU that caps its power runs short kernels at a
            # higher clock. Keep it flat at the largest block's rate, the most sustained load.
            self.r_max, self.p_half = pts[-1][1], 0.0
        else:
            self.r_max, self.p_half = 1.0 / icpt, slope / icpt

    def __call__(self, P):
        return self.r_max * P / (P + self.p_half)


def fit_rates(runs):
    """Two fits per (mode, causal): the one-GPU rate over the whole problem's pairs (one-GPU runs,
    and the one-GPU times that ring runs carry), and the rate a GPU of a ring sustains over the
    pairs of one step (the ring runs' per-GPU TFLOP/s: merges, fills and launch gaps included)."""
    one, step = {}, {}
    for r in runs:
        s, fl = r["shape"], r["flags"]
        causal = bool(fl.get("causal"))
        key = (r["mode"], causal)
        per_head = pairs(s["S_q"], s["S_k"], causal)
        ring = r.get("ring")
        ms = ring.get("one_gpu_median_ms") if ring else r["timing"]["median_ms"]
        if ms:
            tf = flops(r["mode"], s["B"], s["H"], s["D"], per_head) / (ms * 1e-3) / 1e12
            one.setdefault(key, []).append((s["B"] * s["H"] * per_head, tf))
        if ring and ring.get("per_gpu"):
            N = len(ring["devices"])
            L = s["S_q"] / N
            p_step = s["B"] * s["H"] * (L * L / 2 if causal else L * L)
            tfs = [g["tflops"] for g in ring["per_gpu"] if g.get("tflops")]
            if tfs:
                step.setdefault(key, []).append((p_step, min(tfs)))
    return {k: Rate(v) for k, v in one.items()}, {k: Rate(v) for k, v in step.items()}


def predict(rate, mode, causal, N, S, B, H, H_kv, D, dtype, link_gbps, latency_us, dram_gbps, step_rate=None):
    """(ring ms, one-GPU ms, efficiency, per-GPU TFLOP/s) for a ring of N GPUs over S. `rate` is the
    one-GPU fit; `step_rate`, where ring runs gave one, the rate of a ring's step (its merges
    included); without it the steps run at the one-GPU rate plus a modelled merge pass."""
    es = BYTES.get(dtype, 2)
    L = S / N  # positions per GPU
    P_step = B * H * (L * L / 2 if causal else L * L)
    t_step = flops(mode, B, H, D, P_step / (B * H)) / ((step_rate or rate)(P_step) * 1e12)
    kv_bytes = 2.0 * B * H_kv * L * D * es
    t_kv = kv_bytes / (link_gbps * 1e9) + latency_us * 1e-6
    t = 0.0
    if mode == "forward":  # the own shard first; step s fetches the K/V of step s + 1
        for s in range(N):
            t += max(t_step, t_kv) if s + 1 < N else t_step
        if step_rate is None:  # merge: the block's O (dtype) and the fp32 running O read, written back
            t += N * B * H * L * D * (es + 8) / (dram_gbps * 1e9)
    else:
        # The other shards' steps s = 0 .. N-2: step s fetches the K/V of step s + 1 (none for the
        # last of them) and carries the accumulator of step s - 1 to its next rank, both on the
        # one link. The own block runs while the first shard travels, and its rest while the last
        # accumulator goes home (or it ended in the first wait, and that hop is exposed).
        acc_bytes = 2.0 * B * H_kv * L * D * 4
        t_acc = acc_bytes / (link_gbps * 1e9) + latency_us * 1e-6
        t = t_kv
        for s in range(N - 1):
            link = (t_kv if s + 1 < N - 1 else 0.0) + (t_acc if s >= 1 else 0.0)
            t += max(t_step, link)
        t += max(t_step - t_kv, t_acc if N > 1 else 0.0)
    P_one = B * H * (S * (S + 1) / 2 if causal else float(S) * S)
    t_one = flops(mode, B, H, D, P_one / (B * H)) / (rate(P_one) * 1e12)
    total = flops(mode, B, H, D, P_one / (B * H))
    return t * 1e3, t_one * 1e3, t_one / (N * t), total / N / t / 1e12


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="flashattn session JSON / JSON Lines files (runs with --check)")
    ap.add_argument("--compare", nargs="+", default=[],
                    help="more such files whose rings are compared with the model but not fitted")
    ap.add_argument("--link-gbps", type=float, default=360.0,
                    help="one direction of the link between neighbours, GB/s (default 360: NCCL send/recv of "
                         "1 GiB between two NVLink H100s)")
    ap.add_argument("--latency-us", type=float, default=20.0, help="per transfer, microseconds")
    ap.add_argument("--N", default="2,4,8,16,32,64")
    ap.add_argument("--S", default="32768,65536,131072,262144,524288,1048576")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--H-kv", type=int, default=None)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--json", help="write the predictions here")
    a = ap.parse_args(argv)
    runs = load_runs(a.runs)
    if not runs:
        sys.exit("ring_model.py: no run that passed --check in the inputs")
    rates, step_rates = fit_rates(runs)
    dram = next((r["_dram_gbps"] for r in runs if r.get("_dram_gbps")), 3000.0)
    H_kv = a.H_kv or a.H
    Ns = [int(x) for x in a.N.split(",")]
    Ss = [int(x) for x in a.S.split(",")]
    out = {"fits": {}, "predictions": [], "checks": []}
    for (mode, causal), rate in sorted(rates.items()):
        st = step_rates.get((mode, causal))
        out["fits"][f"{mode}{' causal' if causal else ''}"] = {
            "one_gpu": {"r_max_tflops": rate.r_max, "p_half": rate.p_half},
            "ring_step": {"r_max_tflops": st.r_max, "p_half": st.p_half} if st else None}

    # The model against the measured rings: those it was fitted on, then those it was not.
    rows = []
    for fitted, r in [(True, r) for r in runs] + [(False, r) for r in load_runs(a.compare)]:
        ring = r.get("ring")
        if not ring or (r["mode"], bool(r["flags"].get("causal"))) not in rates:
            continue
        s = r["shape"]
        N = len(ring["devices"])
        key = (r["mode"], bool(r["flags"].get("causal")))
        ms, one_ms, eff, tf = predict(rates[key], r["mode"], r["flags"].get("causal"), N, s["S_q"], s["B"], s["H"],
                                      s["H_kv"], s["D"], r["dtype"], a.link_gbps, a.latency_us,
                                      r.get("_dram_gbps") or dram, step_rates.get(key))
        if ring.get("one_gpu_median_ms"):  # the measured one-GPU time, not its fit, where there is one
            eff = ring["one_gpu_median_ms"] / (N * ms)
        rows.append((r["mode"], s, r["flags"].get("causal"), N, ms, r["timing"]["median_ms"], eff,
                     ring.get("scaling_efficiency"), fitted))
        out["checks"].append({"mode": r["mode"], "shape": s, "causal": r["flags"].get("causal"), "N": N,
                              "predicted_ms": ms, "measured_ms": r["timing"]["median_ms"],
                              "predicted_efficiency": eff, "measured_efficiency": ring.get("scaling_efficiency"),
                              "in_fit": fitted})
    if rows:
        print("Measured rings against the model\n")
        print("| mode | shape | N | predicted ms | measured ms | predicted efficiency | measured efficiency "
              "| in the fit |")
        print("|---|---|---|---|---|---|---|---|")
        for mode, s, causal, N, ms, meas, eff, meff, fitted in rows:
            shape = f"B{s['B']} H{s['H']}" + (f"/{s['H_kv']}" if s["H_kv"] != s["H"] else "") + \
                    f" S{s['S_q']} D{s['D']}" + (" causal" if causal else "")
            measured = f"{meff:.3f}" if meff is not None else "–"
            print(f"| {mode} | {shape} | {N} | {ms:.3f} | {meas:.3f} | {eff:.3f} | {measured} | "
                  f"{'yes' if fitted else 'no'} |")
        print()

    for (mode, causal), rate in sorted(rates.items()):
        st = step_rates.get((mode, causal))
        step_text = (f"ring step R_max {st.r_max:.0f}, P_half {st.p_half:.3g}" if st
                     else "ring steps at the one-GPU rate + a merge pass")
        print(f"Predicted scaling efficiency / TFLOP/s per GPU: {mode}{', causal' if causal else ''}, "
              f"B{a.B} H{a.H}{'/' + str(H_kv) if H_kv != a.H else ''} D{a.D} {a.dtype}, link {a.link_gbps:g} GB/s "
              f"(fits: one GPU R_max {rate.r_max:.0f} TFLOP/s, P_half {rate.p_half:.3g} pairs; {step_text})\n")
        print("| S \\ N | " + " | ".join(str(n) for n in Ns) + " |")
        print("|---|" + "---|" * len(Ns))
        for S in Ss:
            cells = []
            for N in Ns:
                ms, one_ms, eff, tf = predict(rate, mode, causal, N, S, a.B, a.H, H_kv, a.D, a.dtype, a.link_gbps,
                                              a.latency_us, dram, st)
                cells.append(f"{eff:.2f} / {tf:.0f}")
                out["predictions"].append({"mode": mode, "causal": causal, "N": N, "S": S, "ring_ms": ms,
                                           "one_gpu_ms": one_ms, "efficiency": eff, "tflops_per_gpu": tf})
            print(f"| {S} | " + " | ".join(cells) + " |")
        print()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
