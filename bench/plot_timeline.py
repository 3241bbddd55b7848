#!/usr/bin/env python3
"""Draws a ringtrain DDP Chrome trace (ddp::write_chrome_trace) as a PNG: the compute
lane (forward, backward, finalize wait), gradient-ready ticks, and the bucket
allreduces underneath, so overlap is visible at a glance.
    python3 bench/plot_timeline.py timeline.json timeline.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

events = json.load(open(sys.argv[1]))["traceEvents"]
lanes = {1: "compute", 2: "gradient ready", 3: "bucket allreduce"}
colors = {"forward": "#4c72b0", "backward": "#55a868", "finalize": "#c44e52", "allreduce": "#8172b2", "waiting": "#cccccc"}
fig, ax = plt.subplots(figsize=(11, 2.8))
for e in events:
    if e["ph"] == "X":
        y = 3 - e["tid"]
        key = next((k for k in colors if e["name"].startswith(k)), "allreduce")
        ax.barh(y, e["dur"] / 1000, left=e["ts"] / 1000, height=0.6, color=colors[key], edgecolor="black", linewidth=0.4)
        if e["dur"] / 1000 > 3:
            ax.text(e["ts"] / 1000 + 0.5, y, e["name"].replace("finalize: ", ""), va="center", fontsize=7)
    elif e["ph"] == "i":
        ax.plot([e["ts"] / 1000] * 2, [1 - 0.3, 1 + 0.3], color="#55a868", linewidth=1)
ax.set_yticks([2, 1, 0])
ax.set_yticklabels([lanes[1], lanes[2], lanes[3]])
ax.set_xlabel("ms (rank 0, one DDP step)")
ax.set_title("ringtrain DDP: bucket allreduces overlapping backward")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
print("wrote", sys.argv[2])
