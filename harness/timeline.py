"""timeline.png: a Gantt chart of a few steps, host threads above device streams, device idle shaded.

The picture a profiler user looks at first (msprof, Nsight): which host thread is busy with what,
when the device runs, and where it waits. Colours are the breakdown categories; red shading marks
time when no device stream runs anything (the bubbles).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.graph import CATEGORIES, LANE_DEVICE
from harness.metrics import BusyTime

if TYPE_CHECKING:
    from harness.run import RunResult

COLOURS = {
    "framework": "#8c564b",
    "infer_shape": "#e377c2",
    "tiling": "#bcbd22",
    "alloc": "#7f7f7f",
    "launch": "#ff7f0e",
    "copy": "#17becf",
    "sync": "#d62728",
    "compute": "#1f77b4",
    "comm": "#2ca02c",
    "graph": "#9467bd",
    "cpu": "#aec7e8",
    "external": "#c7c7c7",
    "engine": "#98df8a",
}


def draw_timeline(outcome: "RunResult", path: Path, steps: int) -> None:
    """Write a PNG of `steps` steps from the first measured one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    result, graph = outcome.result, outcome.result.graph
    tasks = graph.tasks
    first = int(np.flatnonzero(outcome.steps["measured"].to_numpy())[0])
    last = min(first + steps, outcome.workload.steps) - 1
    # From the steps table: the result may hold only the drawn steps of a long run.
    t0, t1 = float(outcome.steps["start_ms"].iloc[first]) * 1e3, float(outcome.steps["end_ms"].iloc[last]) * 1e3
    # Work on the drawn steps only (a long run has millions of tasks).
    step = result.column("step")
    picked = np.flatnonzero((step >= first) & (step <= last))
    tasks, start_us, end_us = tasks[picked], result.start_us[picked], result.end_us[picked]
    used_lanes = sorted(set(tasks["lane"].tolist()))
    rows = {lane: len(used_lanes) - 1 - k for k, lane in enumerate(used_lanes)}  # first lane on top
    scale = 1e-3  # µs → ms
    width_in, height_in = 14.0, 1.0 + 0.55 * len(used_lanes)
    fig, ax = plt.subplots(figsize=(width_in, height_in))
    # Fixed margins in inches (lane names left, legend right): a layout engine would draw the figure
    # twice to measure its text, a third of the picture's cost.
    fig.subplots_adjust(left=1.25 / width_in, right=1 - 1.45 / width_in, bottom=0.5 / height_in, top=1 - 0.3 / height_in)
    for lane in used_lanes:
        mine = tasks["lane"] == lane
        for code in np.unique(tasks["category"][mine]):
            pick = mine & (tasks["category"] == code)
            x = (start_us[pick] - t0) * scale
            _bars(ax, x, np.maximum((end_us[pick] - start_us[pick]) * scale, 1e-4), rows[lane] - 0.4, 0.8, facecolors=COLOURS[CATEGORIES[code]], linewidth=0)
    on_device = graph.lane_kinds[tasks["lane"]] == LANE_DEVICE
    busy = BusyTime(start_us[on_device], end_us[on_device])
    gaps_start = np.r_[t0, busy.ends]
    gaps_end = np.r_[busy.starts, t1]
    open_gap = gaps_end > gaps_start
    # One collection for all gaps: a patch per gap is far too slow for thousands of them.
    _bars(
        ax,
        (gaps_start[open_gap] - t0) * scale,
        (gaps_end[open_gap] - gaps_start[open_gap]) * scale,
        -0.5,
        len(used_lanes),
        facecolors="#d62728",
        alpha=0.08,
        linewidth=0,
        zorder=0,
    )
    ax.set_yticks(list(rows.values()), [graph.lane_names[lane] for lane in rows])
    ax.set_xlim(0, (t1 - t0) * scale)
    ax.set_ylim(-0.5, len(used_lanes) - 0.5)
    ax.set_xlabel("time (ms)")
    idle = 1 - float(busy.between(np.array(t0), np.array(t1))) / (t1 - t0) if t1 > t0 else 0.0
    names = outcome.summary
    span = f"step {first}" if first == last else f"steps {first}–{last}"
    ax.set_title(f"{span}: device idle {idle:.0%} (red), bound: {names['bound']}", loc="left")
    shown = sorted({CATEGORIES[c] for c in np.unique(tasks["category"])}, key=CATEGORIES.index)
    ax.legend(handles=[Patch(color=COLOURS[c], label=c) for c in shown], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def _bars(ax, x: np.ndarray, width: np.ndarray, y: float, height: float, **style) -> None:
    """Rectangles [x, x + width] × [y, y + height] as one collection, vertices built in numpy
    (`broken_barh` builds them span by span in Python: most of a DeepSeek-V3 step's drawing time)."""
    from matplotlib.collections import PolyCollection

    verts = np.empty((x.size, 4, 2))
    verts[:, [0, 1], 0] = x[:, None]
    verts[:, [2, 3], 0] = (x + width)[:, None]
    verts[:, [0, 3], 1] = y
    verts[:, [1, 2], 1] = y + height
    ax.add_collection(PolyCollection(verts, **style), autolim=False)  # the caller sets the limits
