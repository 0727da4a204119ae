"""What a profiler trace holds, once read: host calls, device tasks and step marks, in one format.

Each reader (`kineto.py` for PyTorch-profiler JSON, `torch_npu.py` for Ascend trace_view.json)
turns its file into a `Profile`; the shared core (`core.py`) links, splits into steps, measures and
writes the op list from it without knowing which reader made it. Times are µs from the start of
the trace (the earliest event), as float64.

A *call* is one host-side runtime call that matters to scheduling: a launch (of a kernel, a
copy, a memset, a whole graph), a blocking sync, an allocation, a tiling/workspace query, or any
other runtime call (host time, nothing issued). Its `start_us`/`end_us` are the extent on the
thread that *issues* it: the Python thread that enqueues it when a task queue sits between the
framework and the launch thread (torch_npu), the launching thread otherwise. `launch_us` is the
time of the launch itself on the thread that performs it (the dequeue on torch_npu's launch thread;
the call itself otherwise), and `ready_us` when the device could first see the work.

A *task* is one piece of device work (a kernel, a copy, a memset, a collective) on a stream. A task
and the call that issued it share a `key` (a correlation id, or a flow id); many tasks may share one
(the kernels of a graph launch).
"""
from __future__ import annotations

import gzip
import io
import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from harness.base.errors import HarnessError

# Call kinds.
CALL_OTHER = 0  # host time, nothing issued (queries, attribute calls, event records...)
CALL_LAUNCH = 1  # kernel launch
CALL_GRAPH = 2  # launch of a captured graph (many tasks)
CALL_COPY = 3  # asynchronous copy
CALL_SET = 4  # asynchronous memset
CALL_COPY_SYNC = 5  # blocking copy: issues a copy, then waits for it
CALL_SYNC = 6  # blocking sync: stream, event or whole device
CALL_ALLOC = 7  # device memory allocation or free outside a caching allocator
CALL_TILING = 8  # tiling / workspace-size query on the issuing thread (aclnn*GetWorkspaceSize)
CALL_WAIT = 9  # a stream waits for an event recorded on another stream (device-side dependency)
CALL_RECORD = 10  # an event recorded on a stream

ISSUING = (CALL_LAUNCH, CALL_GRAPH, CALL_COPY, CALL_SET, CALL_COPY_SYNC)

# Task kinds.
TASK_KERNEL = 0
TASK_COPY = 1
TASK_SET = 2
TASK_COMM = 3

ALL_STREAMS = -1  # a sync that waits for every stream (device sync), or a stream we cannot tell

CALL_COLUMNS = {
    "thread": np.int64,
    "start_us": np.float64,
    "end_us": np.float64,
    "launch_us": np.float64,
    "ready_us": np.float64,
    "kind": np.int8,
    "name": object,
    "op": object,  # the framework op it ran in (aten::mm), "" if unknown
    "op_id": np.int64,  # that op's row in Profile.framework_ops (its shapes), -1 if unknown
    "key": np.int64,
    "stream": np.int64,  # syncs: the stream waited for; waits: the waiting stream; -1: all / unknown
    "wait_stream": np.int64,  # waits / event syncs: the stream the event was recorded on (-1: unknown)
    "wait_key": np.int64,  # waits / event syncs: key of the CALL_RECORD that recorded the event (-1: unknown)
}
TASK_COLUMNS = {
    "stream": np.int64,
    "start_us": np.float64,
    "end_us": np.float64,
    "kind": np.int8,
    "name": object,
    "key": np.int64,
}
MARK_COLUMNS = {"thread": np.int64, "start_us": np.float64, "end_us": np.float64, "name": object}
# nn.Module calls a PyTorch profiler recorded (`with_modules=True`): own_us is the call's time outside the
# framework ops and module calls it holds.
MODULE_COLUMNS = {"thread": np.int64, "start_us": np.float64, "end_us": np.float64, "own_us": np.float64}


def frame(rows: dict[str, list] | list[dict], columns: dict[str, type]) -> pd.DataFrame:
    """A table with exactly `columns` (in that order and dtype), from column lists or row dicts."""
    table = pd.DataFrame(rows, columns=list(columns)) if rows is not None else pd.DataFrame(columns=list(columns))
    return table.astype(columns).reset_index(drop=True)


@dataclass
class Profile:
    """A trace as the core needs it (see the module docstring)."""

    path: str
    source: str  # "kineto" or "torch_npu"
    device: str  # device name as the trace records it ("" when blank)
    rank: Optional[int]  # the distributed rank the trace records (None: not recorded)
    dispatch: str  # "eager" (one issuing thread per op) or "async" (a task queue and a launch thread)
    calls: pd.DataFrame
    tasks: pd.DataFrame
    marks: pd.DataFrame  # host-side annotations (ProfilerStep#N, user annotations)
    span_us: tuple[float, float]  # first start and last end of every event of this rank
    device_index: int = 0  # which device of the trace the tasks are from
    # What the peer analyser (HolisticTraceAnalysis) would read: device-side rows, or None when it
    # does not load this format. Columns: name, cat, start_us, end_us, stream, runtime_start_us.
    peer_rows: Optional[pd.DataFrame] = None
    notes: list[str] = field(default_factory=list)  # what the reader had to assume or leave out
    # The framework ops (cpu_op) with the shapes the profiler recorded (`record_shapes=True`): columns
    # name, dims (a list per input: a tensor's sizes, [] for a scalar) and types ("c10::BFloat16", ...);
    # None where the format has none. A call's op_id is its innermost op's row.
    framework_ops: Optional[pd.DataFrame] = None
    # Profiler options the trace says it was recorded with (PyTorch profiler: record_shapes, with_stack,
    # profile_memory, with_modules, with_flops); each adds the profiler's own host work to every op.
    recorded_with: tuple[str, ...] = ()
    module_calls: Optional[pd.DataFrame] = None  # MODULE_COLUMNS; None where the trace holds none

    @property
    def issuing_threads(self) -> list[int]:
        return sorted(set(self.calls["thread"].tolist()))


class ProfileError(HarnessError, ValueError):
    """A trace cannot be imported; the message names the file and what is missing."""


# What a trace may hold, read and inflated (`python -m harness.profile --max-read-mb`): parsing takes about
# 3× the text in memory and the readers as much again, so 1 GiB of JSON needs ~6 GiB. A gzip that inflates
# beyond it (a "zip bomb"), /dev/zero or an endless pipe is refused once the limit is read, not when
# memory runs out (that took 26 s and ended in MemoryError).
READ_LIMIT_MB = 1024


def read_json(path: Path, limit_mb: int = READ_LIMIT_MB) -> Any:
    """The parsed JSON of a trace file (`.json`, or gzip-compressed whatever its name), of at most
    `limit_mb` MiB read and inflated; anything else is a ProfileError naming the file."""
    limit = limit_mb << 20
    raise_limit = f"--max-read-mb {limit_mb} (raise it for a larger trace: parsing needs about 6× its size in memory)"
    try:
        with open(path, "rb") as file:
            raw = file.read(limit + 1)
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > limit:
        raise ProfileError(f"{path}: larger than {raise_limit}")
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as inflating:
                raw = inflating.read(limit + 1)  # never more than the limit in memory, whatever the header says
        except (OSError, EOFError, zlib.error) as exc:
            raise ProfileError(f"{path}: not a readable gzip file ({exc})") from None
        if len(raw) > limit:
            raise ProfileError(f"{path}: inflates to more than {raise_limit}")
    try:
        return json.loads(raw)
    except RecursionError:  # Python's parser's own nesting limit (~1,000 levels; a trace nests 4)
        raise ProfileError(f"{path}: JSON nested deeper than the parser's limit of about 1,000 levels (a trace nests 4)") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProfileError(f"{path}: not JSON ({str(exc).splitlines()[0]})") from None


class Clock:
    """Trace timestamps (µs, as numbers or as strings with more digits than a float holds) → µs since
    `origin`. torch_npu writes "1704161511422904.204": 16 integer digits, so the integer part is
    subtracted exactly before the fraction is added."""

    def __init__(self, origin: int):
        self.origin = origin

    @staticmethod
    def whole_part(value: Any) -> int:
        if isinstance(value, str):
            return int(value.split(".", 1)[0])
        return int(value)

    def __call__(self, value: Any) -> float:
        if isinstance(value, str):
            whole, _, fraction = value.partition(".")
            return float(int(whole) - self.origin) + (float("0." + fraction) if fraction else 0.0)
        if isinstance(value, int):
            return float(value - self.origin)
        return float(value) - self.origin


def checked_stamp(path: Path, event: dict) -> int:
    """The whole µs of a duration event's `ts`, after checking `ts` and `dur` are times (a number or a
    numeric string, finite, a duration not negative): one line naming the file and the event otherwise."""
    ts, dur = event.get("ts"), event.get("dur", 0)
    if (type(ts) is int or (type(ts) is float and math.isfinite(ts))) and type(dur) in (int, float) and 0 <= dur < math.inf:
        return int(ts)  # the common case, cheaply (a trace holds up to millions of events)
    try:
        whole = Clock.whole_part(ts)  # "12abc", "nan" and [1] fail here, inf below
        duration = float(dur)
        if not (math.isfinite(float(ts)) and math.isfinite(duration) and duration >= 0):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise ProfileError(
            f"{path}: event {str(event.get('name', '?'))[:60]!r} has ts={str(ts)[:40]!r}, dur={str(dur)[:40]!r}: not a time in µs"
        ) from None
    return whole


def nesting_parents(start: np.ndarray, end: np.ndarray, inner: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(order, parent) of slices on one thread: `order` sorts them by start (longest first at equal
    starts; of slices with the same extent, those `inner` marks after the others, else in the order
    given); parent[k] is the position in that order of the innermost slice containing slice order[k],
    or -1. Slices on a thread nest (Chrome trace rules); partial overlaps are cut at the parent's end."""
    # Two slices with one extent say nothing of which holds the other: the caller's `inner` decides (a
    # driver call timed exactly like the runtime call that made it is inside it, whichever the file lists first).
    tie = np.zeros(start.size, dtype=np.int8) if inner is None else np.asarray(inner, dtype=np.int8)
    order = np.lexsort((tie, -end, start))
    parent = np.full(order.size, -1, dtype=np.int64)
    stack: list[int] = []
    s, e = start[order], end[order]
    for k in range(order.size):
        while stack and s[k] >= e[stack[-1]]:
            stack.pop()
        parent[k] = stack[-1] if stack else -1
        stack.append(k)
    return order, parent


def innermost(start: np.ndarray, end: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each time in `at`, the index (into start/end) of the innermost slice containing it, or -1.
    All slices are taken as one thread's (callers group by thread)."""
    if start.size == 0:
        return np.full(len(at), -1, dtype=np.int64)
    order, parent = nesting_parents(start, end)
    s, e = start[order], end[order]
    found = np.full(len(at), -1, dtype=np.int64)
    candidate = np.searchsorted(s, at, side="right") - 1
    for q, k in enumerate(candidate):
        while k >= 0 and e[k] < at[q]:
            k = parent[k]
        if k >= 0:
            found[q] = order[k]
    return found


def top_level(start: np.ndarray, end: np.ndarray, inner: np.ndarray | None = None) -> np.ndarray:
    """Whether each slice (of one thread) is not nested in another (`inner`: see nesting_parents)."""
    order, parent = nesting_parents(start, end, inner)
    outer = np.zeros(start.size, dtype=bool)
    outer[order[parent < 0]] = True
    return outer
