"""Plain-Python reference implementation of the engine's semantics (see harness/sim/kernel.py).

Written for clarity, not speed: the differential tests require the Numba kernel to agree with it
exactly on start, end and decider of every task.
"""
from __future__ import annotations

import heapq
from collections import deque

END, READY = 0, 1


def simulate_reference(lanes, pools, units, durations, deps, pool_capacity, releases=None):
    """deps[i] is the list of predecessors of task i. Returns (start, end, decider) as lists."""
    n = len(lanes)
    releases = releases or [0.0] * n
    lane_prev = [-1] * n
    last_on_lane: dict[int, int] = {}
    for i in range(n):
        lane_prev[i] = last_on_lane.get(lanes[i], -1)
        last_on_lane[lanes[i]] = i
    preds = [list(deps[i]) + ([lane_prev[i]] if lane_prev[i] >= 0 else []) for i in range(n)]
    successors: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for p in ps:
            successors[p].append(i)
    remaining = [len(ps) for ps in preds]
    free = list(pool_capacity)
    waiting = [deque() for _ in pool_capacity]
    start = [0.0] * n
    end = [0.0] * n
    decider = [-1] * n
    events: list[tuple[float, int, int]] = [(releases[i], READY, i) for i in range(n) if remaining[i] == 0]
    heapq.heapify(events)

    def begin(i, t):
        if pools[i] >= 0:
            free[pools[i]] -= units[i]
        start[i] = t
        heapq.heappush(events, (t + durations[i], END, i))

    while events:
        t, kind, i = heapq.heappop(events)
        if kind == READY:
            p = pools[i]
            if p < 0 or (not waiting[p] and free[p] >= units[i]):
                begin(i, t)
            else:
                waiting[p].append(i)
            continue
        end[i] = t
        p = pools[i]
        if p >= 0:
            free[p] += units[i]
            while waiting[p] and free[p] >= units[waiting[p][0]]:
                j = waiting[p].popleft()
                decider[j] = i
                begin(j, t)
        # The lane successor is released before the dependents; the order only matters for
        # READY events at the same time, which the heap orders by task id anyway.
        for s in successors[i]:
            remaining[s] -= 1
            if remaining[s] == 0:
                # Held back by its release time, a task has no deciding predecessor.
                decider[s] = i if releases[s] <= t else -1
                heapq.heappush(events, (max(t, releases[s]), READY, s))
    if any(r > 0 for r in remaining):
        raise RuntimeError("deadlock")
    return start, end, decider
