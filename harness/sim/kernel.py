"""The discrete-event engine (Numba), plus the jitted passes over its result that metrics need.

Other jitted passes live next to their wrappers: the record fill in lowering.py, the lane merges in
metrics.py. Kernels never raise: they return arrays or status codes, and their wrappers raise. They
release the GIL (`nogil`): a long run lowers and measures one chunk in a thread while it simulates another.

Semantics (the plain-Python oracle in tests/oracle.py implements the same, and must agree exactly):

* A task becomes *ready* when its lane predecessor (the previous task id on its lane) and all its
  dependencies have ended, but not before its release time. Its ready time is the latest of these.
* A ready task starts at once if it needs no pool, or if its pool has the units free and no earlier
  task is waiting on that pool (strict FIFO per pool, in the order tasks became ready); otherwise it
  waits, and starts when releases leave enough units for it at the head of the queue.
* Events are ordered by (time, kind, task id) with task ends before task readiness at the same time,
  so units released at t are available to tasks ready at t, and results are bit-for-bit deterministic.
* For each task the engine records the *decider*: the predecessor whose end made it ready (the last
  one processed), or, if it had to wait for units, the task whose release of units let it start; -1
  when nothing but its release time (or t = 0) held it. Following deciders back from the last task
  to end gives the critical path, with no gaps after its first task.

The wrapper `simulate` validates and allocates; the `_`-prefixed kernels only loop and return a
status code, never raise.
"""
from __future__ import annotations

import sys

import numpy as np
from numba import njit

from harness.base.errors import HarnessError
from harness.sim.task_graph import CATEGORIES, CATEGORY, TaskGraph

STATUS_OK = 0
STATUS_DEADLOCK = 1


def load_numba_target() -> None:
    """Load Numba's CPU target (its typing and lowering registries) without its SciPy BLAS probe.

    The first jitted call of a process loads the target, and loading it imports `scipy.linalg` (0.15-0.2 s,
    an eighth of a default run) only to learn whether `np.dot` and `np.linalg` can be compiled. The
    simulation's kernels use no linear algebra, so the probe is answered "no SciPy" here; SciPy itself
    stays importable for anything else in the process. Idempotent; a target already loaded is left as is.
    """
    if "numba.np.arraymath" in sys.modules:
        return
    blocked = "scipy.linalg" not in sys.modules
    if blocked:
        sys.modules["scipy.linalg"] = None  # `import scipy.linalg...` raises ImportError, which Numba expects
    try:
        from numba.core.registry import cpu_target

        cpu_target.target_context.refresh()
    finally:
        if blocked and sys.modules.get("scipy.linalg", 0) is None:
            del sys.modules["scipy.linalg"]


@njit(cache=True, nogil=True)
def _heap_push(heap_t, heap_k, size, t, k):
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        pt = heap_t[parent]
        if pt < t or (pt == t and heap_k[parent] < k):
            break
        heap_t[i] = pt
        heap_k[i] = heap_k[parent]
        i = parent
    heap_t[i] = t
    heap_k[i] = k
    return size + 1


@njit(cache=True, nogil=True)
def _heap_pop(heap_t, heap_k, size):
    """Remove the root; the caller has read heap_t[0], heap_k[0] before. Returns the new size."""
    size -= 1
    t = heap_t[size]
    k = heap_k[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (
            heap_t[right] < heap_t[child] or (heap_t[right] == heap_t[child] and heap_k[right] < heap_k[child])
        ):
            child = right
        ct = heap_t[child]
        if t < ct or (t == ct and k < heap_k[child]):
            break
        heap_t[i] = ct
        heap_k[i] = heap_k[child]
        i = child
    heap_t[i] = t
    heap_k[i] = k
    return size


@njit(cache=True, nogil=True)
def _simulate(tasks, lane_prev, lane_next, dep_ptr, succ_ptr, succ_idx, pool_capacity, start, end, decider):
    n = tasks.shape[0]
    n_pools = pool_capacity.shape[0]
    # Event keys: a task's end is key i, its readiness n + i; ends sort first at equal times.
    indeg = np.empty(n, np.int64)
    free_units = pool_capacity.copy()
    wait_head = np.full(n_pools, -1, np.int64)
    wait_tail = np.full(n_pools, -1, np.int64)
    wait_next = np.full(n, -1, np.int64)
    # Each lane has at most one task pending (ready, waiting or running): its lane successor cannot
    # become ready before it ends. So the heap never holds more events than there are lanes, and
    # needs no growth (re-binding arrays inside the loop costs reference counting on every pass).
    n_lanes = 0
    for i in range(n):
        if tasks[i]["lane"] >= n_lanes:
            n_lanes = tasks[i]["lane"] + 1
    capacity = n_lanes + 1
    heap_t = np.empty(capacity, np.float64)
    heap_k = np.empty(capacity, np.int64)
    size = 0
    for i in range(n):
        decider[i] = -1
        indeg[i] = dep_ptr[i + 1] - dep_ptr[i]
        if lane_prev[i] >= 0:
            indeg[i] += 1
        if indeg[i] == 0:
            size = _heap_push(heap_t, heap_k, size, tasks[i]["release_us"], n + i)
    ended = 0
    while size > 0:
        t = heap_t[0]
        k = heap_k[0]
        size = _heap_pop(heap_t, heap_k, size)
        if k >= n:
            i = k - n
            pool = tasks[i]["pool"]
            if pool < 0 or (wait_head[pool] < 0 and free_units[pool] >= tasks[i]["units"]):
                if pool >= 0:
                    free_units[pool] -= tasks[i]["units"]
                start[i] = t
                size = _heap_push(heap_t, heap_k, size, t + tasks[i]["duration_us"], i)
            else:
                if wait_tail[pool] < 0:
                    wait_head[pool] = i
                else:
                    wait_next[wait_tail[pool]] = i
                wait_tail[pool] = i
            continue
        i = k
        end[i] = t
        ended += 1
        pool = tasks[i]["pool"]
        if pool >= 0:
            free_units[pool] += tasks[i]["units"]
            while wait_head[pool] >= 0 and free_units[pool] >= tasks[wait_head[pool]]["units"]:
                j = wait_head[pool]
                wait_head[pool] = wait_next[j]
                if wait_head[pool] < 0:
                    wait_tail[pool] = -1
                free_units[pool] -= tasks[j]["units"]
                start[j] = t
                decider[j] = i
                size = _heap_push(heap_t, heap_k, size, t + tasks[j]["duration_us"], j)
        nxt = lane_next[i]
        if nxt >= 0:
            indeg[nxt] -= 1
            if indeg[nxt] == 0:
                # Ready now, or at its release time if later (then no predecessor decided it).
                ready = t
                decider[nxt] = i
                if tasks[nxt]["release_us"] > t:
                    ready = tasks[nxt]["release_us"]
                    decider[nxt] = -1
                size = _heap_push(heap_t, heap_k, size, ready, n + nxt)
        for e in range(succ_ptr[i], succ_ptr[i + 1]):
            s = succ_idx[e]
            indeg[s] -= 1
            if indeg[s] == 0:
                # Ready now, or at its release time if later (then no predecessor decided it).
                ready = t
                decider[s] = i
                if tasks[s]["release_us"] > t:
                    ready = tasks[s]["release_us"]
                    decider[s] = -1
                size = _heap_push(heap_t, heap_k, size, ready, n + s)
    if ended != n:
        return STATUS_DEADLOCK
    return STATUS_OK


@njit(cache=True, nogil=True)
def _critical_path(end, decider):
    """Task ids of the critical path, last task first: follow deciders back from the last end."""
    n = end.shape[0]
    last = 0
    for i in range(1, n):
        if end[i] >= end[last]:
            last = i
    path = np.empty(n, np.int64)
    length = 0
    i = last
    while i >= 0:
        path[length] = i
        length += 1
        i = decider[i]
    return path[:length]


@njit(cache=True, nogil=True)
def _lru_hits(keys, capacity, hits):
    """hits[i] = whether access i of `keys` hits an LRU cache of `capacity` entries (program order).

    An access hits when its key was seen before and fewer than `capacity` distinct keys were used
    since (its LRU stack distance): counted with a Fenwick tree over positions that are the latest
    access of their key.
    """
    n = keys.shape[0]
    tree = np.zeros(n + 1, np.int64)
    last = dict()
    last[keys[0]] = np.int64(0)  # fixes the dict's types; removed below
    del last[keys[0]]
    for i in range(n):
        k = keys[i]
        hit = False
        if k in last:
            p = last[k]
            # distinct keys used since p = latest-access positions in (p, i)
            since = 0
            j = i
            while j > 0:
                since += tree[j]
                j -= j & (-j)
            j = p + 1
            while j > 0:
                since -= tree[j]
                j -= j & (-j)
            hit = since < capacity
            j = p + 1
            while j <= n:
                tree[j] -= 1
                j += j & (-j)
        hits[i] = hit
        j = i + 1
        while j <= n:
            tree[j] += 1
            j += j & (-j)
        last[k] = np.int64(i)
    return 0


@njit(cache=True, nogil=True)
def _links(lanes, n_lanes, dep_ptr, dep_idx):
    """Lane neighbours (lanes are FIFO in id order) and successor lists (CSR), in O(n + edges)."""
    n = lanes.shape[0]
    lane_prev = np.full(n, -1, np.int64)
    lane_next = np.full(n, -1, np.int64)
    last = np.full(n_lanes, -1, np.int64)
    for i in range(n):
        p = last[lanes[i]]
        if p >= 0:
            lane_prev[i] = p
            lane_next[p] = i
        last[lanes[i]] = i
    succ_ptr = np.zeros(n + 1, np.int64)
    for e in range(dep_idx.shape[0]):
        succ_ptr[dep_idx[e] + 1] += 1
    for i in range(n):
        succ_ptr[i + 1] += succ_ptr[i]
    fill = succ_ptr[:-1].copy()
    succ_idx = np.empty(dep_idx.shape[0], np.int64)
    for i in range(n):  # successors come out in increasing id order
        for e in range(dep_ptr[i], dep_ptr[i + 1]):
            p = dep_idx[e]
            succ_idx[fill[p]] = i
            fill[p] += 1
    return lane_prev, lane_next, succ_ptr, succ_idx


def links(graph: TaskGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lane_prev, lane_next, succ_ptr, succ_idx) of a graph, as the kernel needs them."""
    return _links(graph.tasks["lane"], len(graph.lane_names), graph.dep_ptr.astype(np.int64, copy=False), graph.dep_idx.astype(np.int64, copy=False))


@njit(cache=True, nogil=True)
def _step_category_us(start, work_start, end, decider, step, category, first_step, n_steps, n_categories, front_end):
    """Two (n_steps, n_categories) tables for steps first_step, …: time per category on each step's
    critical path (from its last task back to its first, following deciders: whole tasks, so that it
    spans the step; a task's lead, the device front end's gap before its work, in category `front_end`),
    and in all its tasks (their work, without the lead)."""
    last = np.full(n_steps, -1, np.int64)
    all_tasks = np.zeros((n_steps, n_categories), np.float64)
    for i in range(end.shape[0]):
        s = step[i] - first_step
        all_tasks[s, category[i]] += end[i] - work_start[i]
        if last[s] < 0 or end[i] >= end[last[s]]:
            last[s] = i
    on_path = np.zeros((n_steps, n_categories), np.float64)
    for s in range(n_steps):
        i = last[s]
        while i >= 0 and step[i] == s + first_step:
            on_path[s, category[i]] += end[i] - work_start[i]
            on_path[s, front_end] += work_start[i] - start[i]
            i = decider[i]
    return on_path, all_tasks


def lru_hits(keys: np.ndarray, capacity: int) -> np.ndarray:
    """Which accesses of `keys` (in order) hit an LRU cache holding `capacity` entries."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    hits = np.zeros(keys.shape[0], dtype=np.bool_)
    if keys.size:
        _lru_hits(keys, int(capacity), hits)
    return hits


@njit(cache=True, nogil=True)
def _integer_columns(tasks):
    """lane, step, op, category, stage of every task as contiguous arrays, reading each record once."""
    n = tasks.shape[0]
    lane = np.empty(n, np.int32)
    step = np.empty(n, np.int32)
    op = np.empty(n, np.int32)
    category = np.empty(n, np.int8)
    stage = np.empty(n, np.int8)
    for i in range(n):
        rec = tasks[i]
        lane[i] = rec["lane"]
        step[i] = rec["step"]
        op[i] = rec["op"]
        category[i] = rec["category"]
        stage[i] = rec["stage"]
    return lane, step, op, category, stage


class SimulationResult:
    """Start, end and decider per task, plus the graph they belong to."""

    def __init__(self, graph: TaskGraph, start_us: np.ndarray, end_us: np.ndarray, decider: np.ndarray):
        self.graph = graph
        self.start_us = start_us
        self.end_us = end_us
        self.decider = decider
        self._columns: dict[str, np.ndarray] = {}
        self._work_start_us: np.ndarray | None = None

    def column(self, name: str) -> np.ndarray:
        """A task field as a contiguous array (lane, step, op, category or stage), extracted once.

        Metrics read these fields many times; a field of the record array is a strided view, and each
        numpy pass over it reads every 48-byte record.
        """
        if not self._columns:
            self._columns = dict(zip(("lane", "step", "op", "category", "stage"), _integer_columns(self.graph.tasks)))
        return self._columns[name]

    @property
    def work_start_us(self) -> np.ndarray:
        """When each task's own work begins: its start, after the device front end's lead (a kernel's
        gap behind the one before it, a graph node's dispatch). Busy time and the drawn timelines count
        from here, as a profiler does; the stream is held from the start."""
        if self._work_start_us is None:
            self._work_start_us = self.start_us + self.graph.tasks["lead_us"]
        return self._work_start_us

    @property
    def makespan_us(self) -> float:
        return float(self.end_us.max()) if self.end_us.size else 0.0

    def critical_path(self) -> np.ndarray:
        return _critical_path(self.end_us, self.decider)

    def step_category_us(self) -> tuple[np.ndarray, np.ndarray]:
        """(on_path, all_tasks), each (steps, CATEGORIES): time per task category on the critical path
        of each step the result holds (a step's path spans it: rows sum to latencies; device tasks'
        leads in category `front_end`), and summed over all its tasks (host, device and copy lanes; a
        device task from where its work begins)."""
        step = self.column("step")
        first, last = int(step.min()), int(step.max())
        return _step_category_us(self.start_us, self.work_start_us, self.end_us, self.decider, step, self.column("category"), first, last - first + 1,
                                 len(CATEGORIES), CATEGORY["front_end"])


# Codes of the first problem `_check_graph` finds (0: none).
_BAD_DEP, _BAD_LANE, _BAD_POOL, _TOO_MANY_UNITS, _BAD_DURATION, _BAD_RELEASE = 1, 2, 3, 4, 5, 6


@njit(cache=True, nogil=True)
def _check_graph(tasks, dep_ptr, dep_idx, n_lanes, pool_capacity):
    """(code, task) of the first invalid task, in one pass over the records (a numpy expression per
    field would read every record again: they are 48 bytes apart)."""
    n_pools = pool_capacity.shape[0]
    for i in range(tasks.shape[0]):
        for e in range(dep_ptr[i], dep_ptr[i + 1]):
            if dep_idx[e] >= i or dep_idx[e] < 0:
                return _BAD_DEP, i
        rec = tasks[i]
        if rec["lane"] < 0 or rec["lane"] >= n_lanes:
            return _BAD_LANE, i
        if rec["pool"] >= n_pools:
            return _BAD_POOL, i
        if rec["pool"] >= 0 and rec["units"] > pool_capacity[rec["pool"]]:
            return _TOO_MANY_UNITS, i
        d = rec["duration_us"]
        if not (d >= 0 and d < np.inf):  # also false for NaN
            return _BAD_DURATION, i
        r = rec["release_us"]
        if not (r >= 0 and r < np.inf):
            return _BAD_RELEASE, i
    return 0, -1


def validate_graph(graph: TaskGraph) -> None:
    tasks = graph.tasks
    n = tasks.shape[0]
    if n == 0:
        raise HarnessError("task graph is empty: nothing to simulate")
    if graph.dep_ptr.shape[0] != n + 1:
        raise HarnessError(f"dep_ptr has {graph.dep_ptr.shape[0]} entries, expected {n + 1}")
    code, bad = _check_graph(
        tasks,
        graph.dep_ptr.astype(np.int64, copy=False),
        graph.dep_idx.astype(np.int64, copy=False),
        len(graph.lane_names),
        graph.pool_capacity.astype(np.int64, copy=False),
    )
    if code == _BAD_DEP:
        raise HarnessError("every dependency must point to a lower task id (the graph must be topologically numbered)")
    if code == _BAD_LANE:
        raise HarnessError("task lane out of range")
    if code == _BAD_POOL:
        raise HarnessError("task pool out of range")
    if code == _TOO_MANY_UNITS:
        pool = int(tasks["pool"][bad])
        raise HarnessError(
            f"task {bad} needs {int(tasks['units'][bad])} units of pool {graph.pool_names[pool]!r}, "
            f"which has {int(graph.pool_capacity[pool])}"
        )
    if code == _BAD_DURATION:
        raise HarnessError("task durations must be finite and >= 0")
    if code == _BAD_RELEASE:
        raise HarnessError("task release times must be finite and >= 0")


def simulate(graph: TaskGraph) -> SimulationResult:
    """Validate the graph, run the event loop, return start/end/decider per task."""
    validate_graph(graph)
    n = graph.n_tasks
    lane_prev, lane_next, succ_ptr, succ_idx = links(graph)
    start = np.zeros(n, dtype=np.float64)
    end = np.zeros(n, dtype=np.float64)
    decider = np.empty(n, dtype=np.int64)
    status = _simulate(
        graph.tasks,
        lane_prev,
        lane_next,
        graph.dep_ptr.astype(np.int64, copy=False),
        succ_ptr,
        succ_idx,
        graph.pool_capacity.astype(np.int64, copy=False),
        start,
        end,
        decider,
    )
    if status != STATUS_OK:
        raise HarnessError(f"simulation did not complete (status {status}): some task never became ready")
    return SimulationResult(graph, start, end, decider)
