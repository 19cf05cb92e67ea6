#!/usr/bin/env python3
"""The few Nsight Compute metrics that matter for an attention kernel, from a raw-page CSV.

    ncu --import REPORT.ncu-rep --csv --page raw --print-units base > raw.csv
    ncu_summary.py raw.csv [--run-json flashattn.json] [--flops N]

One line per profiled kernel (time, DRAM throughput, tensor and FMA pipe utilisation, achieved
occupancy, registers, local-memory traffic), then the totals over all of them: a run of
`scripts/profile.sh` profiles every kernel launched inside one timed repetition (one launch for a
fused kernel, several for cuBLAS-based ones), so the achieved TFLOP/s is our FLOP count (from the
flashattn JSON, or --flops) divided by the summed kernel time. docs/PROFILING.md explains how to
read each column. Metrics a GPU does not have (the Hopper wgmma pipe on sm_80) show as "-".
"""

import argparse
import csv
import json
import sys

# Each entry: our column -> candidate metric names, first present wins.
METRICS = {
    "time": ["gpu__time_duration.sum"],
    "dram_pct": ["dram__throughput.avg.pct_of_peak_sustained_elapsed",
                 "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"],
    "dram_read": ["dram__bytes_read.sum"],
    "dram_write": ["dram__bytes_write.sum"],
    "sm_pct": ["sm__throughput.avg.pct_of_peak_sustained_elapsed"],
    "hmma_pct": ["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                 "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"],
    "gmma_pct": ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"],
    "fma_pct": ["sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
                "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"],
    "occupancy": ["sm__warps_active.avg.pct_of_peak_sustained_active"],
    "occupancy_max": ["sm__maximum_warps_per_active_cycle_pct"],
    "regs": ["launch__registers_per_thread"],
    "smem": ["launch__shared_mem_per_block"],
    "local_ld": ["l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"],
    "local_st": ["l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"],
}
# Multipliers to base units for the units ncu may print.
UNITS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "ns": 1e-9, "us": 1e-6, "ms": 1e-3,
         "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9,
         "Kibyte": 1024.0, "Mibyte": 1024.0**2, "Gibyte": 1024.0**3}


def number(text):
    text = (text or "").strip().replace(",", "")
    if text in ("", "n/a", "N/A", "-"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def read_raw(path):
    """Rows of an ncu raw-page CSV as dicts, with values converted to base units (seconds,
    bytes, percent). The second line of the file gives the units (empty for id columns)."""
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("==")]  # ==PROF== / ==WARNING== lines
    rows = list(csv.reader(lines))
    if not rows:
        return []
    head, units = rows[0], None
    body = rows[1:]
    if body and (not body[0] or body[0][0].strip() == ""):  # units row: the ID column is empty
        units, body = body[0], body[1:]
    out = []
    for row in body:
        rec = {}
        for i, name in enumerate(head):
            value = row[i] if i < len(row) else ""
            unit = units[i].strip() if units and i < len(units) else ""
            num = number(value)
            rec[name] = num * UNITS.get(unit, 1.0) if num is not None and unit in UNITS else (num if num is not None else value)
        out.append(rec)
    return out


def pick(rec, key):
    for name in METRICS[key]:
        v = rec.get(name)
        if isinstance(v, float):
            return v
    return None


def fmt(v, spec, scale=1.0):
    return "-" if v is None else format(v * scale, spec)


def summarize(rows, flops=None):
    lines = []
    head = (f"{'kernel':<44} {'grid':>14} {'block':>11} {'time us':>9} {'DRAM %':>7} {'DRAM GB/s':>10} {'SM %':>6} "
            f"{'mma %':>6} {'wgmma %':>8} {'FMA %':>6} {'occup %':>12} {'regs':>5} {'local ld/st KB':>15}")
    lines.append(head)
    total_t = total_bytes = 0.0
    for r in rows:
        t = pick(r, "time")
        rd, wr = pick(r, "dram_read"), pick(r, "dram_write")
        nbytes = (rd or 0) + (wr or 0)
        gbps = nbytes / t / 1e9 if t and (rd is not None or wr is not None) else None
        total_t += t or 0
        total_bytes += nbytes
        occ, occ_max = pick(r, "occupancy"), pick(r, "occupancy_max")
        occ_s = fmt(occ, ".0f") + ("/" + fmt(occ_max, ".0f") if occ_max is not None else "")
        ld, st = pick(r, "local_ld"), pick(r, "local_st")
        local = "-" if ld is None and st is None else f"{(ld or 0) / 1e3:.0f}/{(st or 0) / 1e3:.0f}"
        name = str(r.get("Kernel Name", r.get("Function Name", "?")))
        name = name if len(name) <= 44 else name[:43] + "…"
        lines.append(f"{name:<44} {str(r.get('Grid Size', '')):>14} {str(r.get('Block Size', '')):>11} "
                     f"{fmt(t, '.1f', 1e6):>9} {fmt(pick(r, 'dram_pct'), '.1f'):>7} {fmt(gbps, '.0f'):>10} "
                     f"{fmt(pick(r, 'sm_pct'), '.1f'):>6} {fmt(pick(r, 'hmma_pct'), '.1f'):>6} "
                     f"{fmt(pick(r, 'gmma_pct'), '.1f'):>8} {fmt(pick(r, 'fma_pct'), '.1f'):>6} {occ_s:>12} "
                     f"{fmt(pick(r, 'regs'), '.0f'):>5} {local:>15}")
    total = f"total: {len(rows)} kernel(s), {total_t * 1e6:.1f} us"
    if total_t > 0:
        total += f", DRAM {total_bytes / total_t / 1e9:.0f} GB/s"
        if flops:
            total += f", achieved {flops / total_t / 1e12:.2f} TFLOP/s ({flops:.3g} FLOPs by our count)"
    lines.append(total)
    return "\n".join(lines)


def flops_from_json(path):
    with open(path) as f:
        doc = json.load(f)
    for r in doc.get("runs", []):
        if r.get("status") == "ok" and r.get("throughput"):
            return r["throughput"]["flops"]
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw_csv")
    ap.add_argument("--run-json", help="flashattn --json output of the profiled run (for the FLOP count)")
    ap.add_argument("--flops", type=float, help="FLOPs of the profiled repetition")
    args = ap.parse_args(argv)
    rows = read_raw(args.raw_csv)
    if not rows:
        print(f"ncu_summary.py: {args.raw_csv}: no kernels were profiled (check the NVTX filter and permissions)",
              file=sys.stderr)
        return 1
    flops = args.flops or (flops_from_json(args.run_json) if args.run_json else None)
    print(summarize(rows, flops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
