"""Busy time of a set of intervals (device streams, a host thread): numpy only, so that the process that
draws timeline.png needs no Numba. metrics.busy_of_lanes builds one from a simulated graph's lanes."""
from __future__ import annotations

import numpy as np


class BusyTime:
    """Cumulative busy time of a set of intervals: busy(a, b) = time covered by any interval in [a, b]."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray):
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], ends[order]
        if s.size:
            reach = np.maximum.accumulate(e)
            new_group = np.ones(s.size, dtype=bool)
            new_group[1:] = s[1:] > reach[:-1]
            group_start = s[new_group]
            group_end = np.maximum.reduceat(e, np.flatnonzero(new_group))
        else:
            group_start = group_end = np.zeros(0)
        self._set_groups(group_start, group_end)

    @classmethod
    def of_groups(cls, group_start: np.ndarray, group_end: np.ndarray) -> "BusyTime":
        """From disjoint intervals already in order (no sort)."""
        busy = cls.__new__(cls)
        busy._set_groups(group_start, group_end)
        return busy

    def _set_groups(self, group_start: np.ndarray, group_end: np.ndarray) -> None:
        self.starts = group_start
        self.ends = group_end
        self.before = np.concatenate([[0.0], np.cumsum(group_end - group_start)])

    def covered_until(self, t: np.ndarray) -> np.ndarray:
        """Busy time in [-inf, t] for each t."""
        t = np.asarray(t, dtype=np.float64)
        if self.starts.size == 0:
            return np.zeros_like(t)
        k = np.searchsorted(self.starts, t, side="right")  # intervals starting at or before t
        last = np.maximum(k - 1, 0)
        partial = np.where(k > 0, np.clip(t - self.starts[last], 0.0, self.ends[last] - self.starts[last]), 0.0)
        return self.before[last] * (k > 0) + partial

    def between(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.covered_until(b) - self.covered_until(a)
