#!/usr/bin/python3
"""plot_allreduce.py SWEEP.json OUT.png: busbw vs message size, ours and MPI_Allreduce.

SWEEP.json is what `comm_sweep --json` writes (rank 0). The memcpy bandwidth
measured in the same run is drawn as the roof, and half of it as the target line.
Uses Debian's python3-matplotlib (/usr/bin/python3).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    sweep = json.load(open(sys.argv[1]))
    rows = sweep["rows"]
    sizes = [r["bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(sizes, [r["busbw"] for r in rows], "o-", label=f"ringtrain {sweep['backend']}")
    if "mpi_busbw" in rows[0]:
        ax.plot(sizes, [r["mpi_busbw"] for r in rows], "s-", label="MPI_Allreduce (Open MPI 4.1.4)")
    ax.axhline(sweep["memcpy_gbps"], color="gray", ls="--", label=f"memcpy {sweep['memcpy_gbps']:.2f} GB/s")
    ax.axhline(sweep["memcpy_gbps"] / 2, color="gray", ls=":", label="memcpy / 2 (target)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce busbw (GB/s)")
    ax.set_title(f"allreduce float32 sum, {sweep['ranks']} ranks, one host (shared memory)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
