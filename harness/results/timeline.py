"""timeline.png: a Gantt chart of a few steps, host threads above device streams, device idle shaded.

The picture a profiler user looks at first (msprof, Nsight): which host thread is busy with what,
when the device runs, and where it waits. Colours are the breakdown categories; red marks time when no
device stream runs anything (the bubbles): a row of its own at the bottom, shaded behind every lane.
Host stages too narrow to see are drawn one bar per op, lanes idle in the window are left out.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.base.files import atomic_write
from harness.sim.task_graph import CATEGORIES, LANE_DEVICE, LANE_HOST
from harness.sim.busy import BusyTime
from harness.sim.outcome import drawn_steps

if TYPE_CHECKING:
    from harness.sim.outcome import RunResult

COLOURS = {
    "framework": "#8c564b",
    "infer_shape": "#e377c2",
    "tiling": "#bcbd22",
    "alloc": "#7f7f7f",
    "launch": "#ff7f0e",
    "copy": "#17becf",
    "sync": "#393b79",  # not red: red is the device idle row
    "compute": "#1f77b4",
    "comm": "#2ca02c",
    "graph": "#9467bd",
    "cpu": "#aec7e8",
    "external": "#c7c7c7",
    "engine": "#98df8a",
}


HOST_OP_COLOUR = "#5b5b5b"
IDLE_COLOUR = "#d62728"
MIN_STAGE_PX = 4.0  # an op's host stages narrower than this together are drawn as one bar (else stripes)
THIN_LANE_BUSY = 0.01  # lanes busy less than this share of the window get a thin row
HIDDEN_LANE_BUSY = 0.001  # and below this none (named under the axis)


@dataclass
class TimelineWindow:
    """What the picture shows, cut out of a run: the drawn steps' tasks and where they sit (a few
    thousand tasks; small enough to hand to another process)."""

    first: int
    last: int
    t0: float
    t1: float
    tasks: np.ndarray
    start_us: np.ndarray  # where each task's work begins (a device task after its front-end lead)
    end_us: np.ndarray
    lane_names: list
    lane_kinds: np.ndarray
    bound: str
    front_end_idle_us: float  # of the window, device idle in kernels' front-end gaps (the steps table's)


def timeline_window(outcome: "RunResult", steps: int) -> TimelineWindow:
    """`steps` consecutive measured steps (drawn_steps)."""
    result, graph = outcome.result, outcome.result.graph
    columns = outcome.step_columns
    first, last = drawn_steps(columns["measured"], steps)
    # From the steps table: the result may hold only the drawn steps of a long run.
    t0, t1 = float(columns["start_ms"][first]) * 1e3, float(columns["end_ms"][last]) * 1e3
    # Work on the drawn steps only (a long run has millions of tasks).
    step = result.column("step")
    picked = np.flatnonzero((step >= first) & (step <= last))
    return TimelineWindow(
        first, last, t0, t1, graph.tasks[picked], result.work_start_us[picked], result.end_us[picked], list(graph.lane_names),
        np.asarray(graph.lane_kinds), str(outcome.summary["bound"]), float(columns["front_end_idle_ms"][first : last + 1].sum()) * 1e3,
    )


def draw_timeline(outcome: "RunResult", path: Path, steps: int) -> None:
    """Write a PNG of `steps` consecutive measured steps (drawn_steps)."""
    draw_window(timeline_window(outcome, steps), path)


def draw_window(w: TimelineWindow, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    first, last, t0, t1 = w.first, w.last, w.t0, w.t1
    tasks, start_us, end_us = w.tasks, w.start_us, w.end_us
    window_us = max(t1 - t0, 1e-9)
    duration_us = end_us - start_us
    # Lanes (nearly) idle in the window are left out and named under the axis (copy engines moving a
    # few tokens); little-used ones get a thin row that says how busy they were.
    busy_of = {lane: float(duration_us[tasks["lane"] == lane].sum()) for lane in sorted(set(tasks["lane"].tolist()))}
    used_lanes = [lane for lane, busy in busy_of.items() if busy >= HIDDEN_LANE_BUSY * window_us]
    hidden = [w.lane_names[lane] for lane in busy_of if lane not in used_lanes]
    heights = {lane: 1.0 if busy_of[lane] >= THIN_LANE_BUSY * window_us else 0.45 for lane in used_lanes}
    idle_row = 0.45
    bottoms, y = {}, idle_row + 0.15  # the device-idle row at the bottom, lanes above it, first lane on top
    for lane in reversed(used_lanes):
        bottoms[lane] = y
        y += heights[lane] + 0.15
    top = y
    scale = 1e-3  # µs → ms
    width_in, height_in = 14.0, 1.0 + 0.5 * top
    fig, ax = plt.subplots(figsize=(width_in, height_in))
    # Fixed margins in inches (lane names left, legend right): a layout engine would draw the figure
    # twice to measure its text, a third of the picture's cost.
    left_in, right_in = 2.0, 1.7
    fig.subplots_adjust(left=left_in / width_in, right=1 - right_in / width_in, bottom=0.5 / height_in, top=1 - 0.3 / height_in)
    us_per_px = window_us / ((width_in - left_in - right_in) * 110)
    host_lane = w.lane_kinds[tasks["lane"]] == LANE_HOST
    merged_any = False
    drawn: set[int] = set()
    for lane in used_lanes:
        mine = tasks["lane"] == lane
        if host_lane[np.flatnonzero(mine)[0]]:
            mine, merged = _merge_narrow_host_ops(tasks, start_us, end_us, mine, MIN_STAGE_PX * us_per_px)
            if merged[0].size:
                merged_any = True
                _bars(ax, (merged[0] - t0) * scale, (merged[1] - merged[0]) * scale, bottoms[lane], heights[lane],
                      facecolors=HOST_OP_COLOUR, linewidth=0)
        drawn.update(int(c) for c in np.unique(tasks["category"][mine]))
        for code in np.unique(tasks["category"][mine]):
            pick = mine & (tasks["category"] == code)
            x = (start_us[pick] - t0) * scale
            _bars(ax, x, np.maximum(duration_us[pick] * scale, 1e-4), bottoms[lane], heights[lane],
                  facecolors=COLOURS[CATEGORIES[code]], linewidth=0)
    on_device = w.lane_kinds[tasks["lane"]] == LANE_DEVICE
    busy = BusyTime(start_us[on_device], end_us[on_device])
    gaps_start = np.r_[t0, busy.ends]
    gaps_end = np.r_[busy.starts, t1]
    open_gap = gaps_end > gaps_start
    gap_x, gap_w = (gaps_start[open_gap] - t0) * scale, (gaps_end[open_gap] - gaps_start[open_gap]) * scale
    # Device idle: solid in its own row, shaded behind every lane. One collection for all gaps: a
    # patch per gap is far too slow for thousands of them.
    _bars(ax, gap_x, gap_w, 0.0, idle_row, facecolors=IDLE_COLOUR, linewidth=0)
    _bars(ax, gap_x, gap_w, 0.0, top, facecolors=IDLE_COLOUR, alpha=0.12, linewidth=0, zorder=0)
    labels = [
        w.lane_names[lane] + (f" ({busy_of[lane] / window_us:.1%} busy)" if heights[lane] < 1 else "") for lane in used_lanes
    ]
    ax.set_yticks([bottoms[lane] + heights[lane] / 2 for lane in used_lanes] + [idle_row / 2], labels + ["device idle"])
    ax.set_xlim(0, window_us * scale)
    ax.set_ylim(-0.1, top)
    ax.set_xlabel("time (ms)" + (f"    not drawn (under {HIDDEN_LANE_BUSY:.1%} busy): {', '.join(hidden)}" if hidden else ""))
    work_us = float(busy.between(np.array(t0), np.array(t1)))
    idle = 1 - work_us / window_us if t1 > t0 else 0.0
    front_end = w.front_end_idle_us / window_us if t1 > t0 else 0.0
    span = f"step {first}" if first == last else f"steps {first}–{last}"
    gaps = f"; front-end gaps {front_end:.0%}" if front_end >= 0.005 else ""
    ax.set_title(f"{span}: device idle {idle:.0%} (red{gaps}), bound: {w.bound}", loc="left")
    shown = sorted({CATEGORIES[c] for c in drawn}, key=CATEGORIES.index)
    handles = [Patch(color=COLOURS[c], label=c) for c in shown]
    if merged_any:
        handles.insert(0, Patch(color=HOST_OP_COLOUR, label="host op (stages\ntoo short to draw)"))
    handles.append(Patch(color=IDLE_COLOUR, label="device idle"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110))
    finally:
        plt.close(fig)


def _merge_narrow_host_ops(
    tasks: np.ndarray, start_us: np.ndarray, end_us: np.ndarray, mine: np.ndarray, min_us: float
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Host stages of one op (same op and step, back to back on the lane) whose span is under
    `min_us`: one bar per op instead of sub-pixel stripes. Returns the tasks still drawn by stage and
    the merged bars (starts, ends)."""
    ids = np.flatnonzero(mine)
    ids = ids[np.argsort(start_us[ids], kind="stable")]
    key = tasks["op"][ids].astype(np.int64) * (1 << 32) + tasks["step"][ids]
    new_group = np.r_[True, key[1:] != key[:-1]]
    group = np.cumsum(new_group) - 1
    g_start = np.minimum.reduceat(start_us[ids], np.flatnonzero(new_group))
    g_end = np.maximum.reduceat(end_us[ids], np.flatnonzero(new_group))
    narrow = (g_end - g_start) < min_us
    keep = mine.copy()
    keep[ids[narrow[group]]] = False
    return keep, (g_start[narrow], g_end[narrow])


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
