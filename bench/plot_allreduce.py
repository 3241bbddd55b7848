#!/usr/bin/python3
"""plot_allreduce.py SWEEP.json [SWEEP2.json ...] OUT.png: busbw vs size, ours and MPI_Allreduce.

Each SWEEP.json is what `comm_sweep --json` writes (rank 0); several (e.g. one with
--buffers private and one with --buffers symmetric) are drawn together, each with
the MPI_Allreduce of its own run, named in the legend by the MPI library that run
reported ("mpi_library", from MPI_Get_library_version; sweeps written before it was
recorded say so instead of guessing). The memcpy bandwidth measured in the first run
is drawn as the roof, and half of it as the target line.
    plot_allreduce.py --labels SWEEP.json ...   prints the legend's labels, draws nothing
Uses Debian's python3-matplotlib (/usr/bin/python3) to draw.
"""
import json
import sys


def run_conditions(sweep):
    buffers = sweep.get("buffers", "private")
    launch = sweep.get("launch", "async")  # sweeps written before --launch were async
    return buffers, launch


def ours_label(sweep):
    buffers, launch = run_conditions(sweep)
    return f"ringtrain {sweep['backend']}, {buffers} buffers, {launch}"


def mpi_label(sweep):
    """The MPI_Allreduce line's label: the library of that very run, up to its first
    comma ("Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4")."""
    buffers, launch = run_conditions(sweep)
    library = sweep.get("mpi_library")
    name = library.split(",")[0].strip() if library else "MPI library not recorded"
    return f"MPI_Allreduce ({name}), same run ({buffers}, {launch})"


def labels(sweeps):
    out = []
    for s in sweeps:
        out.append(ours_label(s))
        if "mpi_busbw" in s["rows"][0]:
            out.append(mpi_label(s))
    return out


def plot(sweeps, out_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = sweeps[0]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    markers = iter("o^vD")
    for s in sweeps:
        rows = s["rows"]
        sizes = [r["bytes"] for r in rows]
        ax.plot(sizes, [r["busbw"] for r in rows], next(markers) + "-", label=ours_label(s))
        if "mpi_busbw" in rows[0]:
            ax.plot(sizes, [r["mpi_busbw"] for r in rows], "s--", alpha=0.7, label=mpi_label(s))
    ax.axhline(sweep["memcpy_gbps"], color="gray", ls="--", label=f"memcpy {sweep['memcpy_gbps']:.2f} GB/s")
    ax.axhline(sweep["memcpy_gbps"] / 2, color="gray", ls=":", label="memcpy / 2 (target)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce busbw (GB/s)")
    ax.set_title(f"allreduce float32 sum, {sweep['ranks']} ranks, one host (shared memory)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)


def main(argv):
    if len(argv) >= 2 and argv[0] == "--labels":
        for label in labels([json.load(open(path)) for path in argv[1:]]):
            print("label:", label)
        return 0
    if len(argv) < 2 or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    plot([json.load(open(path)) for path in argv[:-1]], argv[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
