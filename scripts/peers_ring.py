#!/usr/bin/env python3
"""PyTorch's own context parallelism, timed the way flashattn times its rings, for the comparison.

    torchrun --standalone --nproc-per-node 2 scripts/peers_ring.py --sweep scripts/presets/ring.json \\
        [--backend cudnn|flash] [--mode forward|backward|both] [--warmup 2] [--repeat 5] \\
        [--ring-baseline each|first] [--capi PATH] --json FILE.jsonl

Each point of the preset (its B, H, H_kv, S, D, dtype, causal; the modes of --mode or the preset)
runs `torch.distributed.tensor.experimental.context_parallel` around
`F.scaled_dot_product_attention` with the chosen SDPA backend, Q/K/V (and dO) sharded along the
sequence by PyTorch (its load-balanced sharding under causal), every rank one GPU. The same point
also runs unsharded on rank 0's GPU alone, for PyTorch's scaling efficiency = T(one GPU) /
(N * T(ring)); rank 0 compares the two outputs (max abs difference). With --ring-baseline each
(the default) every other rank then runs it alone on its own GPU in turn, and the record adds
each rank's time and the efficiency against the cards' combined rate (`one_gpu_per_rank`,
`scaling_efficiency_cards`, as flashattn's).

Timing: the inputs are N(0, 1) from flashattn's generator (--seed), made once per point. Every rank
runs the same fixed number of repetitions (each is a set of collectives between the ranks: a
noise rule could stop one rank before the other); each repetition is enqueued behind a stream hold
(libflashattn_capi) released once it is enqueued, with the L2 flushed before its start event, so
no host time falls inside its events; a repetition whose hold timed out (the call waited for the
GPU) is counted in the record's `hold_timeouts`. A call that waits for the GPU on the host cannot
be held: a first held warm-up call tells (every rank agrees through an all-reduce), and then the
point is timed without the hold (`timing.held` false, and a note says so). Backward times the whole backward of one forward
(autograd), as flashattn times its backward kernels. Median and min over the repetitions of rank
0; per-GPU TFLOP/s = the point's FLOPs (flashattn's convention) / N / median.

Writes one session document per point (flashattn's schema: kernel `torch-cp-<backend>`, a `ring`
object with `size`, `per_gpu`, `one_gpu_median_ms`, `scaling_efficiency`, `one_gpu_per_rank`,
`scaling_efficiency_cards`, `max_abs_vs_one_gpu`),
JSON Lines, from rank 0. Needs NCCL, two or more GPUs and PyTorch with
torch.distributed.tensor.experimental; NCCL_NVLS_ENABLE=0 is set before the process group starts.
"""
import argparse
import datetime
import json
import os
import statistics
import sys

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_capi  # noqa: E402
import peers  # noqa: E402  (flashattn's generator, as peers.py fills its tensors)
from peers import load_sweep  # noqa: E402  (flashattn --sweep's presets, read as peers.py reads them)
from ring_model import cards_efficiency, flops, pairs  # noqa: E402

HOLD_TIMEOUT_S = 2.0
PROBE_TIMEOUT_S = 0.5


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", required=True, help="a preset file (scripts/presets/ring.json)")
    ap.add_argument("--backend", default="cudnn", choices=["cudnn", "flash"])
    ap.add_argument("--mode", choices=["forward", "backward", "both"])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ring-baseline", default="each", choices=["each", "first"],
                    help="the one-GPU run on every rank's GPU in turn (default), or on rank 0's alone")
    ap.add_argument("--capi", help="libflashattn_capi.so (else $FLASHATTN_CAPI, $FLASHATTN_BUILD_DIR, build-gpu/)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options as cp_options
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (world,))
    capi = peers_capi.load(a.capi)
    hold, flush = capi.hold(), capi.flush()
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[a.backend]

    def generate(shape, dt, name):  # flashattn's generator, as its sweeps fill tensor `name`
        return peers.generate(torch, capi, name, shape, dt, a.seed)

    def timed(fn, ring=False):
        """Fixed-count timing on the current stream: (samples ms, hold timeouts, held).

        Each repetition is enqueued behind a stream hold. A call that waits for the GPU on the host
        cannot be held (the hold would only time out): the first held warm-up call tells, and on a
        ring every rank takes the same decision (an all-reduce outside the timed region), since
        each rank must run the same calls."""
        stream = torch.cuda.current_stream()
        t0 = hold.timeouts()
        hold.enqueue(stream.cuda_stream, PROBE_TIMEOUT_S)
        fn()
        hold.release()
        torch.cuda.synchronize()
        waited = torch.tensor([float(hold.timeouts() > t0)], device="cuda")
        if ring:
            dist.all_reduce(waited, op=dist.ReduceOp.MAX)
        held = waited.item() == 0
        for _ in range(a.warmup - 1):
            fn()
        torch.cuda.synchronize()
        samples, timeouts0 = [], hold.timeouts()
        for _ in range(a.repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if held:
                hold.enqueue(stream.cuda_stream, HOLD_TIMEOUT_S)
            flush.enqueue(stream.cuda_stream)
            start.record(stream)
            fn()
            end.record(stream)
            if held:
                hold.release()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        return samples, hold.timeouts() - timeouts0, held

    def run(q, k, v, dout, causal, mode, gqa):
        """The call `mode` times: forward returns O; backward returns dQ, dK, dV of a forward and
        its backward (autograd needs the forward: the record subtracts the forward's median)."""
        if mode == "forward":
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

        def both():
            for t in (qg, kg, vg):
                t.grad = None  # each call's own gradients, not a sum over calls
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=gqa)
            out.backward(dout)
            return qg.grad, kg.grad, vg.grad
        return both

    records = []
    for p in load_sweep(a.sweep, {"mode": a.mode})[1]:
        B, H, Hkv, S, D, dt, causal = p["B"], p["H"], p["H_kv"], p["S_q"], p["D"], p["dtype"], p["causal"]
        gqa = Hkv != H
        full = [generate((B, H, S, D), dt, "Q"), generate((B, Hkv, S, D), dt, "K"),
                generate((B, Hkv, S, D), dt, "V"), generate((B, H, S, D), dt, "dO")]
        times = {}
        for mode in p["modes"]:
            rec = {"kernel": f"torch-cp-{a.backend}", "mode": mode, "gpu": True, "status": "ok", "reason": "",
                   "shape": {"B": B, "H": H, "H_kv": Hkv, "S_q": S, "S_k": S, "D": D}, "dtype": dt,
                   "layout": "bhsd", "flags": {"causal": causal}, "notes": []}
            if rank == 0:
                print(f"[{datetime.datetime.now():%H:%M:%S}] {mode} B{B} H{H}/{Hkv} S{S} D{D}{' causal' if causal else ''}",
                      file=sys.stderr, flush=True)
            try:
                # One GPU, unsharded: rank 0's, whose outputs the ring's are compared with, then
                # (--ring-baseline each) every other rank's on its own GPU in turn, the others
                # waiting at the barrier, which a rank whose run fails still reaches.
                one_ms, ref, one_error = None, None, None
                for turn in range(world if a.ring_baseline == "each" else 1):
                    if rank == turn:
                        try:
                            with sdpa_kernel(backend):
                                fn = run(*full, causal, mode, gqa)
                                got = fn()
                                if rank == 0:
                                    ref = [r.detach().clone() for r in (got if isinstance(got, tuple) else (got,))]
                                del got
                                s1, _, _ = timed(fn)
                            one_ms = statistics.median(s1)
                            if mode == "backward":  # the same subtraction as the ring's, on one GPU
                                one_ms -= times.get("one_forward", 0.0)
                            else:
                                times["one_forward"] = one_ms
                        except Exception as e:  # noqa: BLE001 - recorded; the ring still runs
                            one_ms, ref, one_error = None, None, str(e).splitlines()[0][:300]
                    dist.barrier()
                per_rank = [None] * world
                dist.all_gather_object(per_rank, one_ms)
                if hasattr(cp_options, "enable_load_balance"):  # PyTorch balances causal rings only
                    cp_options.enable_load_balance = causal
                shards = [t.detach().clone() for t in full]
                with sdpa_kernel(backend), context_parallel(mesh, buffers=shards, buffer_seq_dims=[2, 2, 2, 2],
                                                            no_restore_buffers=set(shards)):
                    fn = run(*shards, causal, mode, gqa)
                    out = fn()
                    out = list(out if isinstance(out, tuple) else (out,))
                    samples, timeouts, held = timed(fn, ring=True)
                    out = context_parallel_unshard(mesh, out, [2] * len(out))
                if mode == "backward":  # forward + backward timed: take the forward away
                    samples = [s - times.get("forward", 0.0) for s in samples]
                else:
                    times["forward"] = statistics.median(samples)
                median = statistics.median(samples)
                f = flops(mode, B, H, D, pairs(S, S, causal))
                rec["timing"] = {"unit": "ms", "method": "held_stream", "median_ms": median, "min_ms": min(samples),
                                 "max_ms": max(samples), "samples_ms": samples, "warmup": a.warmup, "held": held,
                                 "repeat": a.repeat, "hold_timeouts": timeouts, "l2_flush": True}
                rec["throughput"] = {"flops": f, "tflops": f / (median * 1e-3) / 1e12}
                if rank == 0:
                    diff = max(float((o.float() - r.float()).abs().max()) for o, r in zip(out, ref)) if ref else None
                    rec["ring"] = {"size": world, "rank": None, "devices": list(range(world)),
                                   "sharding": "torch load-balanced" if causal else "torch contiguous",
                                   "per_gpu": [{"device": i, "tflops": f / world / (median * 1e-3) / 1e12}
                                               for i in range(world)],
                                   "one_gpu_median_ms": one_ms,
                                   "scaling_efficiency": one_ms / (world * median) if one_ms else None,
                                   "max_abs_vs_one_gpu": diff}
                    if one_error:
                        rec["ring"]["one_gpu_skipped"] = one_error
                    if all(per_rank):
                        rec["ring"]["one_gpu_per_rank"] = [{"rank": i, "device": i, "median_ms": t}
                                                           for i, t in enumerate(per_rank)]
                        rec["ring"]["scaling_efficiency_cards"] = cards_efficiency(per_rank, median)
                    if mode == "backward":
                        rec["notes"].append("backward = median(forward + backward) - median(forward), on the ring "
                                            "and on one GPU alike")
                    if not held:
                        rec["notes"].append("the call waits for the GPU on the host: timed without the stream hold "
                                            "(host time can fall inside its events)")
                    if timeouts:
                        rec["notes"].append(f"{timeouts} repetitions' holds timed out (host time may be inside)")
            except Exception as e:  # noqa: BLE001 - recorded, the other points go on
                rec.update(status="failed", reason=str(e).splitlines()[0][:300])
            records.append(rec)
        del full
        torch.cuda.empty_cache()
        if rank == 0:
            doc = {"schema_version": 1, "tool": {"name": "peers_ring.py"},
                   "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "device": {"name": torch.cuda.get_device_name(0)},
                   "data": {"generated": "normal(0, 1)", "where": "device", "seed": a.seed}, "runs": records}
            with open(a.json, "a") as f:
                f.write(json.dumps(doc) + "\n")
            for r in records:
                t = r.get("timing", {}).get("median_ms")
                g = r.get("ring", {})
                print(f"{r['kernel']} {r['mode']} B{B} H{H}/{Hkv} S{S} D{D} {'causal ' if causal else ''}"
                      f"{r['status']} median {t} ms, per GPU {g.get('per_gpu', [{}])[0].get('tflops')} TFLOP/s, "
                      f"scaling {g.get('scaling_efficiency')} {r.get('reason', '')}", flush=True)
        records = []
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
