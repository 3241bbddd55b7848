#!/usr/bin/python3
"""plot_allreduce.py SWEEP.json [SWEEP2.json ...] OUT.png: busbw vs size, ours and MPI_Allreduce.

Each SWEEP.json is what `comm_sweep --json` writes (rank 0); several (e.g. one with
--buffers private and one with --buffers symmetric) are drawn together, each with
the MPI_Allreduce of its own run. The memcpy bandwidth measured in the first run is
drawn as the roof, and half of it as the target line.
Uses Debian's python3-matplotlib (/usr/bin/python3).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    sweeps = [json.load(open(path)) for path in sys.argv[1:-1]]
    sweep = sweeps[0]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    markers = iter("o^vD")
    for s in sweeps:
        rows = s["rows"]
        sizes = [r["bytes"] for r in rows]
        buffers = s.get("buffers", "private")
        launch = s.get("launch", "async")  # sweeps written before --launch were async
        ax.plot(sizes, [r["busbw"] for r in rows], next(markers) + "-",
                label=f"ringtrain {s['backend']}, {buffers} buffers, {launch}")
        if "mpi_busbw" in rows[0]:
            ax.plot(sizes, [r["mpi_busbw"] for r in rows], "s--", alpha=0.7,
                    label=f"MPI_Allreduce (Open MPI 4.1.4), same run ({buffers}, {launch})")
    ax.axhline(sweep["memcpy_gbps"], color="gray", ls="--", label=f"memcpy {sweep['memcpy_gbps']:.2f} GB/s")
    ax.axhline(sweep["memcpy_gbps"] / 2, color="gray", ls=":", label="memcpy / 2 (target)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce busbw (GB/s)")
    ax.set_title(f"allreduce float32 sum, {sweep['ranks']} ranks, one host (shared memory)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[-1], dpi=110)


if __name__ == "__main__":
    main()
