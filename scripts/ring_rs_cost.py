#!/usr/bin/env python3
"""What the ring's backward would pay to reduce-scatter its dK/dV at the end instead of carrying them.

    torchrun --standalone --nproc-per-node 2 scripts/ring_rs_cost.py --sweep PRESET.json [PRESET.json ...] \\
        [--warmup 3] [--repeat 10] [--json FILE]

flashattn's ring backward carries each K/V shard's fp32 dK/dV accumulator around the ring with the
shard, so that it ends its trip at its owner (README, "Several GPUs"). The alternative the design
weighed: every GPU keeps an fp32 dK/dV for the whole sequence, adds each block's gradients into it,
and one reduce-scatter at the end hands every GPU the sum for its own keys. That collective comes
after the last block, so nothing can hide it. This script times it with NCCL (through PyTorch) for
each point of a preset: a reduce-scatter of 2 * B * H_kv * S * D floats over the ranks, each rank
keeping 1/N. It is timed with CUDA events on rank 0's stream after warm-up, with the same fixed
repetition count on every rank; it prints the median and min (ms) and the algorithm bandwidth.
NCCL_NVLS_ENABLE=0 is set before the process group starts.
"""
import argparse
import json
import os
import statistics
import sys

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import load_sweep  # noqa: E402  (flashattn --sweep's presets, read as peers.py reads them)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", required=True, nargs="+", help="preset files (scripts/presets/ring_targets.json)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", help="write the results here (rank 0)")
    a = ap.parse_args()

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    points = [p for f in a.sweep for p in load_sweep(f, {})[1]]
    seen, rows = set(), []
    for p in points:
        floats = 2 * p["B"] * p["H_kv"] * p["S_k"] * p["D"]
        if floats in seen:  # the mask and the query heads do not change the accumulators' size
            continue
        seen.add(floats)
        floats -= floats % world
        full = torch.randn(floats, device="cuda", dtype=torch.float32)
        part = torch.empty(floats // world, device="cuda", dtype=torch.float32)
        times = []
        for i in range(a.warmup + a.repeat):
            dist.barrier()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.reduce_scatter_tensor(part, full)
            end.record()
            end.synchronize()
            if i >= a.warmup:
                times.append(start.elapsed_time(end))
        med = statistics.median(times)
        rows.append({"B": p["B"], "H_kv": p["H_kv"], "S": p["S_k"], "D": p["D"], "ranks": world,
                     "bytes": floats * 4, "median_ms": med, "min_ms": min(times),
                     "algo_gbps": floats * 4 * (world - 1) / world / (med * 1e-3) / 1e9})
        del full, part
    if rank == 0:
        print("| point | dK/dV fp32 bytes | ranks | median ms | min ms | GB/s |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| B{r['B']} H_kv{r['H_kv']} S{r['S']} D{r['D']} | {r['bytes'] / 2**20:.0f} MiB | {r['ranks']} | "
                  f"{r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['algo_gbps']:.0f} |")
        if a.json:
            with open(a.json, "w") as f:
                doc = {"tool": "ring_rs_cost.py", "command_line": " ".join(["scripts/ring_rs_cost.py"] + sys.argv[1:]),
                   "device": torch.cuda.get_device_name(), "runs": rows}
            json.dump(doc, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
