"""The task graph: the record layout the engine consumes and the lowering produces.

A task is one piece of work on one *lane* (a FIFO: a host thread, a device stream, a copy engine).
Within a lane, tasks run in increasing task id. A task may also need *units* from a *pool* (host CPU
cores, AI cores) and may depend on other tasks finishing first. Dependencies always point to lower ids,
so a valid graph can never deadlock on its edges.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Critical-path categories (the `breakdown_<category>` keys of summary.json), in that order.
CATEGORIES = (
    "framework",
    "infer_shape",
    "tiling",
    "alloc",
    "launch",
    "copy",
    "sync",
    "compute",
    "comm",
    "graph",
    "cpu",  # ops run on host CPU cores (heterogeneous execution)
    "external",  # a device stream busy with work outside the simulation (an imported profile's unseen work)
    "engine",  # the serving engine's own host work: scheduling, input preparation, sampling, outputs, API
    # the device's own front end: a kernel's gap behind the one before it, a graph node's dispatch (the
    # stream is held, nothing runs): no host-side change removes it, and it is not the kernel's work
    "front_end",
)
CATEGORY = {name: code for code, name in enumerate(CATEGORIES)}

# Lane kinds: what a lane stands for (decides which metrics look at it). An external lane holds
# waits for work outside the simulation: neither host nor device busy time.
LANE_HOST, LANE_DEVICE, LANE_COPY, LANE_EXTERNAL = 0, 1, 2, 3

NO_POOL = -1

# One record per task; the kernel reads lane, pool, units, duration_us and release_us, the rest is for metrics.
# Floats first, aligned records. The kernel reads these fields in place: copying them into separate
# column arrays measured ~30 % slower (more memory traffic for the same loads).
TASK_DTYPE = np.dtype(
    [
        ("duration_us", np.float64),
        ("release_us", np.float64),  # earliest start (e.g. a request's arrival); 0 for most tasks
        # The device front end's part of duration_us before the task's work begins (the gap a kernel
        # queued behind another waits for, a graph node's dispatch): the stream holds it, but the device
        # does nothing in it, and a profiler shows it as idle. 0 for every task that is not device work.
        ("lead_us", np.float64),
        ("lane", np.int32),
        ("pool", np.int32),
        ("units", np.int32),
        ("step", np.int32),
        ("op", np.int32),
        ("category", np.int8),
        ("stage", np.int8),  # host stage + 1 (harness.sim.lowering.HOST_STAGES), 0 for other tasks
    ],
    align=True,
)


@dataclass
class TaskGraph:
    """Tasks plus dependency edges (CSR over predecessors) plus the lanes and pools they use."""

    tasks: np.ndarray  # TASK_DTYPE, shape (n,)
    dep_ptr: np.ndarray  # int64, shape (n + 1,): predecessors of task i are dep_idx[dep_ptr[i]:dep_ptr[i+1]]
    dep_idx: np.ndarray  # int64
    lane_names: list[str]
    lane_kinds: np.ndarray  # int8 per lane: LANE_HOST / LANE_DEVICE / LANE_COPY / LANE_EXTERNAL
    pool_names: list[str]
    pool_capacity: np.ndarray  # int64 per pool
    op_names: list[str] = field(default_factory=list)

    @property
    def n_tasks(self) -> int:
        return int(self.tasks.shape[0])


def csr_from_edges(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group edges src -> dst by dst: returns (ptr, idx) with the predecessors of each task, sorted."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    order = np.lexsort((src, dst))
    idx = src[order]
    counts = np.bincount(dst, minlength=n) if dst.size else np.zeros(n, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, idx
