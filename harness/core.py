"""The discrete-event engine: the only Numba-jitted code of the harness.

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

import numpy as np
from numba import njit

from harness.errors import HarnessError
from harness.graph import TaskGraph

STATUS_OK = 0
STATUS_DEADLOCK = 1


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def _simulate(tasks, lane_prev, lane_next, dep_ptr, succ_ptr, succ_idx, pool_capacity, start, end, decider):
    n = tasks.shape[0]
    n_pools = pool_capacity.shape[0]
    # Event keys: a task's end is key i, its readiness n + i; ends sort first at equal times.
    indeg = np.empty(n, np.int64)
    free_units = pool_capacity.copy()
    wait_head = np.full(n_pools, -1, np.int64)
    wait_tail = np.full(n_pools, -1, np.int64)
    wait_next = np.full(n, -1, np.int64)
    max_fanout = 0
    for i in range(n):
        if succ_ptr[i + 1] - succ_ptr[i] > max_fanout:
            max_fanout = succ_ptr[i + 1] - succ_ptr[i]
    # At most one READY event per task is pending at the start.
    capacity = 1024
    n_initial = 0
    for i in range(n):
        if dep_ptr[i + 1] == dep_ptr[i] and lane_prev[i] < 0:
            n_initial += 1
    while capacity < n_initial + 2 + max_fanout:
        capacity *= 2
    n_waiting = 0
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
        # One iteration pushes at most 1 end, the waiters it starts, a lane successor and its
        # dependents: grow before, so the pushes below never overflow.
        if size + 2 + n_waiting + max_fanout >= capacity:
            capacity *= 2
            new_t = np.empty(capacity, np.float64)
            new_k = np.empty(capacity, np.int64)
            new_t[:size] = heap_t[:size]
            new_k[:size] = heap_k[:size]
            heap_t = new_t
            heap_k = new_k
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
                n_waiting += 1
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
                n_waiting -= 1
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def _step_paths(end, decider, step, n_steps):
    """Critical path of every step: from the step's last task back to its first, following deciders."""
    n = end.shape[0]
    last = np.full(n_steps, -1, np.int64)
    for i in range(n):
        s = step[i]
        if last[s] < 0 or end[i] >= end[last[s]]:
            last[s] = i
    path = np.empty(n, np.int64)
    length = 0
    for s in range(n_steps):
        i = last[s]
        while i >= 0 and step[i] == s:
            path[length] = i
            length += 1
            i = decider[i]
    return path[:length]


def lru_hits(keys: np.ndarray, capacity: int) -> np.ndarray:
    """Which accesses of `keys` (in order) hit an LRU cache holding `capacity` entries."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    hits = np.zeros(keys.shape[0], dtype=np.bool_)
    if keys.size:
        _lru_hits(keys, int(capacity), hits)
    return hits


class SimulationResult:
    """Start, end and decider per task, plus the graph they belong to."""

    def __init__(self, graph: TaskGraph, start_us: np.ndarray, end_us: np.ndarray, decider: np.ndarray):
        self.graph = graph
        self.start_us = start_us
        self.end_us = end_us
        self.decider = decider

    @property
    def makespan_us(self) -> float:
        return float(self.end_us.max()) if self.end_us.size else 0.0

    def critical_path(self) -> np.ndarray:
        return _critical_path(self.end_us, self.decider)

    def step_critical_paths(self) -> np.ndarray:
        """Tasks on the critical path of each step (a step's path spans it from start to end)."""
        steps = self.graph.tasks["step"].astype(np.int64)
        return _step_paths(self.end_us, self.decider, steps, int(steps.max()) + 1)


def validate_graph(graph: TaskGraph) -> None:
    tasks = graph.tasks
    n = tasks.shape[0]
    if n == 0:
        raise HarnessError("task graph is empty: nothing to simulate")
    if graph.dep_ptr.shape[0] != n + 1:
        raise HarnessError(f"dep_ptr has {graph.dep_ptr.shape[0]} entries, expected {n + 1}")
    owner = np.repeat(np.arange(n), np.diff(graph.dep_ptr))
    if np.any(graph.dep_idx >= owner) or np.any(graph.dep_idx < 0):
        raise HarnessError("every dependency must point to a lower task id (the graph must be topologically numbered)")
    if tasks["lane"].min() < 0 or tasks["lane"].max() >= len(graph.lane_names):
        raise HarnessError("task lane out of range")
    pools = tasks["pool"]
    uses_pool = pools >= 0
    if np.any(pools >= len(graph.pool_capacity)):
        raise HarnessError("task pool out of range")
    if np.any(tasks["units"][uses_pool] > graph.pool_capacity[pools[uses_pool]]):
        bad = int(np.argmax(uses_pool & (tasks["units"] > graph.pool_capacity[np.maximum(pools, 0)])))
        raise HarnessError(
            f"task {bad} needs {int(tasks['units'][bad])} units of pool {graph.pool_names[pools[bad]]!r}, "
            f"which has {int(graph.pool_capacity[pools[bad]])}"
        )
    if np.any(tasks["duration_us"] < 0) or not np.all(np.isfinite(tasks["duration_us"])):
        raise HarnessError("task durations must be finite and >= 0")
    if np.any(tasks["release_us"] < 0) or not np.all(np.isfinite(tasks["release_us"])):
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
