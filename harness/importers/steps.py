"""The shared core of the importers: link, split into steps, measure, and write the op list.

Linking: a device task belongs to the call whose `key` it carries (correlation id or flow id).
Tasks that ran inside a step but were launched before the trace, or by a call the trace does not
hold, are *carried in*: the step's device did that work, no host call of the step issued it.

Steps (`--steps`, default `auto`, first rule that applies):
  profiler   each `ProfilerStep#N` annotation is a step (its extent);
  graph      each graph launch (cudaGraphLaunch / hipGraphLaunch) is a step: the outermost annotation
             around it, else from the previous step's end to the first blocking sync after it. Launches
             under one annotation, or with no blocking sync between them, are the pieces of one step
             (piecewise graphs: vLLM V1 replays a graph per piece and runs attention eagerly between),
             unless a launch replays the same kernels as the open step's first one: that is the next step;
  sync       device-wide syncs (cudaDeviceSynchronize, hipDeviceSynchronize, aclrtSynchronizeDevice)
             end steps;
  from=NAME  from each occurrence of annotation NAME to the next (auto: the most repeated annotation
             whose occurrences do not overlap);
  mark=NAME  each occurrence of annotation NAME is a step (its extent); occurrences that overlap are
             refused;
  whole      the whole trace is one step.
An annotation NAME is one named NAME or NAME#... (`Optimizer.step#SGD.step` for `Optimizer.step`), not
every name NAME begins (`decode_sample` is not `decode`); only where no annotation is so named, every
name NAME begins (numbered steps: `decode_step_` for `decode_step_0`, `decode_step_1`, ...). A step that
would end before it starts (its window inside the one before) is refused.
Windows without device work are dropped. The harness replays steps that list the same ops, so the
steps kept are the largest group with identical op sequences (ties: the group holding the latest
step); the others are reported as left out.

Measured numbers use the harness's own definitions (harness/sim/metrics.py), so that profile.json and
a replay's summary.json compare key for key: a step starts when its window opens or the previous
step ended, whichever is later, and ends when its host window closes or its last device task ends;
device busy is the union of device intervals over the steps' time.

Host costs of an op, walking the issuing threads' calls in time order (merged: the autograd thread
runs while the main thread waits in backward()): `framework_us` = host time since the previous call
that issued work or synced (less allocations and tiling queries in between, which are `alloc_us` and
`tiling_us`), `launch_us` = the launch call (with a task queue: the Dequeue on the launch thread,
while the Enqueue counts as framework time). A blocking sync becomes a `sync` op that waits for the
ops it waited for and then costs its own time after the wait; host time after the last call of a
step is a `host` op. An op that started later than anything the trace shows it waited for
(its launch, its stream, its events) waited for device work the trace does not hold:
`not_before_us` keeps that wait.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from harness.config.limits import MAX_STREAMS
from harness.model.ops_csv import IMPORTED_OP_COLUMNS, NO_DEPENDENCY
from harness.importers.events import (
    ALL_STREAMS,
    CALL_ALLOC,
    CALL_COPY,
    CALL_COPY_SYNC,
    CALL_GRAPH,
    CALL_RECORD,
    CALL_SYNC,
    CALL_TILING,
    CALL_WAIT,
    ISSUING,
    TASK_COMM,
    TASK_COPY,
    TASK_SET,
    Profile,
    ProfileError,
)

STEP_MARK = "ProfilerStep#"
DEVICE_SYNC = re.compile(r"(?:Device|Ctx)Synchronize$|^aclrtSynchronizeDevice")
CUBE_NAME = re.compile(
    r"gemm|gemv|matmul|\bmm\b|_mm|mm_|bmm|addmm|conv|xmma|cutlass|cublas|Cijk_|wgmma|attn|attention|fmha|flash|sdpa|Mm_|MatMul",
    re.IGNORECASE,
)
# A task that started this much later than anything the trace shows it waited for waited for device
# work outside the trace (a stream busy with earlier work, an event from another process).
UNSEEN_WAIT_US = 50.0

KIND_OF_TASK = {TASK_COPY: "copy", TASK_SET: "copy", TASK_COMM: "comm"}


@dataclass
class Window:
    label: str
    start_us: float
    end_us: float


@dataclass
class StepOps:
    """The ops of one step (rows of ops.csv without the step number) and what was measured in it."""

    window: Window
    ops: list[dict]
    task_ids: np.ndarray  # rows of profile.tasks, one per device op (in op order)
    calls: pd.DataFrame  # the calls issued in the window
    main_segments: list[tuple[float, float, str]]  # (start, end, category) of the issuing threads' time
    sync_wait_us: float
    launch_lane_us: float  # async dispatch: time on the launch thread
    signature: tuple = ()
    # Async dispatch: (start, end) of each launch on the launch thread (its dequeue, ending where the device
    # may start the task), in start order: while the device waits for the host, it waits for these first.
    launch_segments: list[tuple[float, float]] = field(default_factory=list)
    start_us: float = 0.0
    end_us: float = 0.0


@dataclass
class Imported:
    profile: Profile
    rule: str
    found: list[StepOps]
    kept: list[int]  # indices into `found` that the op list replays
    left_out: dict[int, str] = field(default_factory=dict)
    streams: dict[int, int] = field(default_factory=dict)  # trace stream -> harness stream


# ---------------------------------------------------------------- steps


def _windows_between(starts: list[float], last_end: float, labels: list[str]) -> list[Window]:
    bounds = starts[1:] + [last_end]
    return [Window(label, a, b) for label, a, b in zip(labels, starts, bounds) if b > a]


def find_windows(profile: Profile, rule: str = "auto") -> tuple[str, list[Window]]:
    """The step windows of a trace under `rule` (see the module docstring) and the rule applied."""
    calls, marks = profile.calls, profile.marks
    if calls.empty:
        return "whole", [Window("whole trace", 0.0, profile.span_us[1])]
    first_call, last_call = float(calls["start_us"].min()), float(calls["end_us"].max())
    last_task = float(profile.tasks["end_us"].max()) if len(profile.tasks) else last_call
    issuing_threads = set(calls["thread"].tolist())
    on_threads = marks[marks["thread"].isin(issuing_threads)] if len(marks) else marks

    def marked(name: str) -> pd.DataFrame:
        named = annotation_named(on_threads["name"], name)
        if not named.any():  # numbered without '#' (decode_step_0, decode_step_1, ...): NAME is what they begin with
            named = on_threads["name"].str.startswith(name)
        return on_threads[named].sort_values("start_us")

    if rule in ("auto", "profiler"):
        # ProfilerStep#0, #1, ...: the one name that is matched by its prefix alone.
        steps = on_threads[on_threads["name"].str.startswith(STEP_MARK)].sort_values("start_us")
        if len(steps) or rule == "profiler":
            if not len(steps):
                raise ProfileError(f"{profile.path}: --steps profiler: no '{STEP_MARK}N' annotation in the trace")
            return "profiler", [Window(r.name, r.start_us, r.end_us) for r in steps.itertuples()]
    graphs = calls[calls["kind"] == CALL_GRAPH]
    if rule in ("auto", "graph") and (len(graphs) or rule == "graph"):
        if not len(graphs):
            raise ProfileError(f"{profile.path}: --steps graph: no graph launch (cudaGraphLaunch, hipGraphLaunch) in the trace")
        syncs = calls[calls["kind"].isin((CALL_SYNC, CALL_COPY_SYNC))]
        launch_starts = graphs["start_us"].tolist() + [np.inf]
        launch_threads = graphs["thread"].tolist() + [None]
        # What each launch replays (its kernels in order): a launch that replays what the open step's first
        # one did is the next step (whole-step graphs launched back to back with no sync between them),
        # any other is one more piece of the open step.
        kernels_of: dict[int, tuple] = {}
        if len(profile.tasks):
            for key, names in profile.tasks.sort_values("start_us").groupby("key")["name"]:
                kernels_of[int(key)] = tuple(names)
        windows, previous_end = [], first_call
        open_piece, first_piece = False, None  # whether the last window may take more pieces; its first launch's kernels
        for i, g in enumerate(graphs.itertuples()):
            kernels = kernels_of.get(int(g.key), ())
            more = open_piece and kernels != first_piece
            around = on_threads[(on_threads["thread"] == g.thread) & (on_threads["start_us"] <= g.start_us) & (on_threads["end_us"] >= g.end_us)]
            if len(around):
                outer = around.loc[(around["end_us"] - around["start_us"]).idxmax()]
                start, end = float(outer.start_us), float(outer.end_us)
                if windows and (windows[-1].start_us, windows[-1].end_us) == (start, end):
                    continue  # another piece of the annotated step
                if more:  # the open step's earlier pieces were launched outside the annotation
                    windows[-1].end_us = previous_end = max(windows[-1].end_us, end)
                    open_piece = False
                    continue
                open_piece, first_piece = False, kernels
            else:
                # No annotation: the step runs from the previous one's end to the first blocking sync
                # after its launch (the host waits for its results), else to the end of the launch;
                # host work between launches is the next step's input preparation. A launch with no
                # blocking sync before the next one leaves the step open to more pieces.
                # A sync that starts when the next launch does came before it where it ended by then on the
                # launch's own thread (a thread's calls run one after another): a zero-length sync.
                next_start = launch_starts[i + 1]
                before_next = (syncs["start_us"] < next_start) | (
                    (syncs["start_us"] == next_start) & (syncs["end_us"] <= next_start) & (syncs["thread"] == launch_threads[i + 1]))
                waits = syncs[(syncs["start_us"] >= g.end_us) & before_next]
                start = previous_end
                end = float(waits["end_us"].iloc[0]) if len(waits) else float(g.end_us)
                if i == len(graphs) - 1 and not len(waits):
                    end = max(end, last_call)
                if more:
                    windows[-1].end_us = previous_end = end
                    open_piece = not len(waits)
                    continue
                open_piece, first_piece = not len(waits), kernels
            windows.append(Window(f"graph launch {i}", start, end))
            previous_end = end
        return "graph", windows
    device_syncs = calls[(calls["kind"] == CALL_SYNC) & calls["name"].str.contains(DEVICE_SYNC)]
    if rule in ("auto", "sync") and (len(device_syncs) or rule == "sync"):
        if not len(device_syncs):
            raise ProfileError(f"{profile.path}: --steps sync: no device-wide sync (cudaDeviceSynchronize, hipDeviceSynchronize, aclrtSynchronizeDevice)")
        ends = device_syncs["end_us"].tolist()
        starts = [first_call] + ends[:-1]
        return "sync", [Window(f"sync {i}", a, b) for i, (a, b) in enumerate(zip(starts, ends))]
    if rule.startswith(("mark=", "from=")) and not rule.split("=", 1)[1]:
        raise ProfileError(f"{profile.path}: --steps {rule}: give the annotation's name after '='")
    if rule.startswith("mark="):
        name = rule.split("=", 1)[1]
        chosen = marked(name)
        if not len(chosen):
            raise ProfileError(f"{profile.path}: --steps {rule}: no annotation named {name!r} on a thread that launches work")
        # Each occurrence is a step: one inside another would hand the inner one's kernels to both steps.
        starts, ends = chosen["start_us"].to_numpy(), chosen["end_us"].to_numpy()
        inside = np.flatnonzero(starts[1:] < np.maximum.accumulate(ends)[:-1])
        if inside.size:
            k = int(inside[0]) + 1
            raise ProfileError(
                f"{profile.path}: --steps {rule}: the {chosen['name'].iloc[k]!r} at {starts[k]:.3f} us starts before an earlier"
                f" occurrence ends: steps must not overlap (try --steps from={name})"
            )
        return rule, [Window(r.name, r.start_us, r.end_us) for r in chosen.itertuples()]
    if rule.startswith("from="):
        name = rule.split("=", 1)[1]
        chosen = marked(name)
        if not len(chosen):
            raise ProfileError(f"{profile.path}: --steps {rule}: no annotation named {name!r} on a thread that launches work")
        return rule, _from_marks(chosen, on_threads, last_call)
    if rule == "auto":
        repeated = _repeated_mark(on_threads)
        if repeated is not None:
            # The occurrences _repeated_mark counted and found apart (NAME and NAME#..., as from=NAME reads them).
            return f"from={repeated}", _from_marks(marked(repeated), on_threads, last_call)
    if rule not in ("auto", "whole"):
        raise ProfileError(f"{profile.path}: --steps {rule!r}: not a rule (auto, profiler, graph, sync, mark=NAME, from=NAME, whole)")
    return "whole", [Window("whole trace", first_call, max(last_call, last_task))]


def annotation_named(names: pd.Series, name: str) -> pd.Series:
    """Which annotations `--steps mark=NAME` / `from=NAME` mean: NAME itself, or NAME#<anything> (PyTorch
    names an optimizer's step `Optimizer.step#SGD.step`); not every name NAME begins (`decode` is not the
    `decode_sample` nested in it)."""
    return (names == name) | names.str.startswith(name + "#")


def _repeated_mark(marks: pd.DataFrame) -> Optional[str]:
    """The annotation that occurs most often (at least twice) without its occurrences overlapping (as
    `from=NAME` reads NAME: with any NAME#... annotations)."""
    best, best_count, best_first = None, 1, np.inf
    rows_of = marks.groupby("name", sort=False).indices
    # The names each name stands for: itself, and every NAME#... (found from the '#'s of the longer names,
    # not by testing each name against all others: a trace may hold thousands of distinct annotations).
    family: dict[str, list[str]] = {str(name): [name] for name in rows_of}
    for name in rows_of:
        text = str(name)
        for at in [i for i, ch in enumerate(text) if ch == "#"]:
            if text[:at] in family:
                family[text[:at]].append(name)
    for name, members in family.items():
        group = marks.iloc[np.concatenate([rows_of[m] for m in members])].sort_values("start_us")
        if len(group) < 2 or np.any(group["start_us"].to_numpy()[1:] < group["end_us"].to_numpy()[:-1]):
            continue
        first = float(group["start_us"].iloc[0])
        if len(group) > best_count or (len(group) == best_count and first < best_first):
            best, best_count, best_first = str(name), len(group), first
    return best


def _from_marks(chosen: pd.DataFrame, marks: pd.DataFrame, last_call: float) -> list[Window]:
    """From each occurrence to the next; the last ends with the annotation around it, if any, else
    with the last call."""
    last = chosen.iloc[-1]
    # Around it: on its thread, from no later to no earlier, and longer (slices that share a start or an end
    # nest, as nesting_parents has them).
    encloses = (marks["start_us"] <= last.start_us) & (marks["end_us"] >= last.end_us)
    longer = (marks["start_us"] < last.start_us) | (marks["end_us"] > last.end_us)
    around = marks[encloses & longer & (marks["thread"] == last.thread)]
    end = float(around["end_us"].min()) if len(around) else last_call
    return _windows_between(chosen["start_us"].tolist(), end, chosen["name"].tolist())


# ---------------------------------------------------------------- ops of a step


# How Kineto names a copy from the device into pageable host memory, which blocks its async call.
PAGEABLE_DTOH = "(Device -> Pageable)"


class TraceIndex:
    """The trace's calls and tasks as plain lists and arrays, indexed once for every window (pandas
    row access per task costs ~50 µs: a 100k-event trace would take seconds)."""

    def __init__(self, profile: Profile):
        calls, tasks = profile.calls, profile.tasks
        self.calls = calls
        self.call_rows = list(calls.itertuples(index=False))
        self.call_start = calls["start_us"].to_numpy()
        self.call_end = calls["end_us"].to_numpy()
        self.t_stream = tasks["stream"].tolist()
        self.t_start = tasks["start_us"].tolist()
        self.t_end = tasks["end_us"].tolist()
        self.t_kind = tasks["kind"].tolist()
        self.t_name = tasks["name"].tolist()
        self.t_key = tasks["key"].to_numpy()
        self.start = tasks["start_us"].to_numpy()
        self.end = tasks["end_us"].to_numpy()
        self.tasks_of_key: dict[int, list[int]] = {}
        order = np.lexsort((self.start, self.t_key))  # by key, then start
        for key, row in zip(self.t_key[order].tolist(), order.tolist()):
            self.tasks_of_key.setdefault(key, []).append(row)
        self.issued_by = dict(zip(calls["key"].tolist(), calls["start_us"].tolist()))

    def calls_in(self, window: Window) -> slice:
        return slice(self._boundary(window.start_us), self._boundary(window.end_us))

    def _boundary(self, t: float) -> int:
        """The first call of a window starting at `t`. A call of no length recorded at `t` (a sync that ends
        the window before it there) came before whatever starts at `t` (calls are sorted by start, then end:
        it sorts first), so it stays with the window that ends at `t`; the trace's first calls always stay."""
        i = int(np.searchsorted(self.call_start, t, side="left"))
        if i > 0:
            while i < len(self.call_start) and self.call_start[i] == t and self.call_end[i] <= t:
                i += 1
        return i


@functools.lru_cache(maxsize=65536)
def short_name(kernel: str) -> str:
    """A readable name for a kernel: without `void`, namespaces' template arguments and parameters."""
    name = re.sub(r"^void\s+", "", kernel)
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    text = "".join(out).strip() or kernel
    return text.split("::")[-1][:80] or kernel[:80]


@functools.lru_cache(maxsize=65536)
def op_kind(task_kind: int, kernel: str) -> str:
    """The harness kind of a device task (kernel names repeat: the answer is cached)."""
    if task_kind in KIND_OF_TASK:
        return KIND_OF_TASK[task_kind]
    return "cube" if CUBE_NAME.search(kernel) else "vector"


def _issued_keys(calls: pd.DataFrame) -> np.ndarray:
    return calls.loc[calls["kind"].isin(ISSUING) & (calls["key"] >= 0), "key"].to_numpy()


def step_ops(profile: Profile, index: TraceIndex, window: Window, issued_anywhere: np.ndarray, first_start_us: float = -np.inf) -> StepOps:
    """Ops of one window in issue order, with host costs (module docstring). Device work no call issued
    belongs to the window it starts in (a task running on past the window's end is not the next window's
    too: it was counted in both), or, started before the first window (`first_start_us`), to each window
    it runs into."""
    span = index.calls_in(window)
    calls = index.calls.iloc[span]
    call_rows = index.call_rows[span]
    task_of_key = {key: index.tasks_of_key[key] for key in _issued_keys(calls).tolist() if key in index.tasks_of_key}
    starts_here = (index.start >= window.start_us) | (index.start < first_start_us)
    loose = np.flatnonzero(~np.isin(index.t_key, issued_anywhere) & (index.end > window.start_us) & (index.start < window.end_us) & starts_here)
    unlinked = loose[np.argsort(index.start[loose], kind="stable")].tolist()
    issue_at = _unlinked_issue_times(index, unlinked, task_of_key, calls)

    ops: list[dict] = []
    task_ids: list[int] = []
    last_on_stream: dict[int, int] = {}  # trace stream -> index of its latest op
    pending_deps: dict[int, list[int]] = {}  # waiting stream -> ops it must wait for (event waits)
    records: dict[int, tuple[int, float]] = {}

    def add_task(row: int, costs: dict, group: int, in_graph: bool, carried_in: bool, issued_at: float) -> int:
        stream = index.t_stream[row]
        after = [last_on_stream[stream]] if stream in last_on_stream else []
        waits = pending_deps.pop(stream, None)
        if waits:
            after += [d for d in waits if d not in after]
        end = index.t_end[row]
        start = max(index.t_start[row], window.start_us) if carried_in else index.t_start[row]
        kernel = index.t_name[row]
        ops.append(
            {
                "name": "", "kernel": kernel, "kind": op_kind(index.t_kind[row], kernel),
                "trace_stream": stream, "device_us": end - start, "after": after,
                "group": group, "in_graph": in_graph, "carried_in": carried_in, "start_us": start, "end_us": end,
                "issued_at": issued_at, **costs,
            }
        )
        task_ids.append(int(row))
        last_on_stream[stream] = len(ops) - 1
        return len(ops) - 1

    none = {"framework_us": 0.0, "tiling_us": 0.0, "alloc_us": 0.0, "launch_us": 0.0, "host_us": 0.0}

    segments: list[tuple[float, float, str]] = []
    cursor = window.start_us
    alloc_us = tiling_us = sync_wait = launch_lane = 0.0
    launch_segments: list[tuple[float, float]] = []
    in_gap: list[tuple[float, float]] = []  # the allocation and tiling segments since the cursor

    def framework_pieces(start: float, end: float) -> None:
        """Framework segments over [start, end] less the allocations and tiling queries in it, which have
        segments of their own (host time counted once: the segments are disjoint)."""
        for a, b in sorted(in_gap):
            if b <= start or a >= end:
                continue
            if a > start:
                segments.append((start, a, "framework"))
            start = max(start, b)
        if end > start:
            segments.append((start, end, "framework"))
        in_gap.clear()

    def take_gap(until: float) -> dict:
        nonlocal alloc_us, tiling_us
        gap = max(0.0, until - cursor)
        framework_pieces(cursor, cursor + gap)
        inside = alloc_us + tiling_us
        scale = min(1.0, gap / inside) if inside > 0 else 0.0
        costs = {"framework_us": gap - inside * scale, "alloc_us": alloc_us * scale, "tiling_us": tiling_us * scale}
        alloc_us = tiling_us = 0.0
        return costs

    def host_op(name: str, costs: dict, own_us: float, after: list[int], kind: str, at: float) -> None:
        ops.append(
            {"name": name, "kernel": "", "kind": kind, "trace_stream": -1, "device_us": 0.0, "after": after, "group": -1,
             "in_graph": False, "carried_in": False, "start_us": np.nan, "end_us": np.nan, "issued_at": at,
             "launch_us": 0.0, "host_us": own_us, "ready_us": at, **costs}
        )
        task_ids.append(-1)

    # Calls in time order, with the unlinked tasks merged in where they must have been issued.
    walk = sorted(
        [(float(t), 0, int(row)) for row, t in zip(unlinked, issue_at)] + [(float(c.start_us), 1, k) for k, c in enumerate(call_rows)]
    )
    for at, is_call, row in walk:
        if not is_call:  # device work no call of the trace issued: no host cost, no launch to wait for
            position = add_task(row, dict(none, ready_us=at), -1, False, True, at)
            before = index.t_start[row] < window.start_us
            ops[position]["name"] = ("[launched before] " if before else "[unlinked] ") + short_name(ops[position]["kernel"])
            continue
        c = call_rows[row]
        kind = int(c.kind)
        if kind == CALL_ALLOC:
            alloc_us += c.end_us - c.start_us
            segments.append((c.start_us, c.end_us, "alloc"))
            in_gap.append((c.start_us, c.end_us))
            continue
        if kind == CALL_TILING:
            tiling_us += c.end_us - c.start_us
            segments.append((c.start_us, c.end_us, "tiling"))
            in_gap.append((c.start_us, c.end_us))
            continue
        if kind == CALL_RECORD:
            if c.key >= 0:
                records[int(c.key)] = (int(c.stream), c.start_us)
            continue
        if kind == CALL_WAIT:
            recorded = records.get(int(c.wait_key))
            if c.stream >= 0 and c.wait_stream >= 0 and recorded is not None:
                awaited = last_on_stream.get(int(c.wait_stream))
                if awaited is not None and ops[awaited]["issued_at"] <= recorded[1]:
                    pending_deps.setdefault(int(c.stream), []).append(awaited)
            continue
        rows = task_of_key.get(int(c.key), []) if kind in ISSUING and c.key >= 0 else []
        if kind == CALL_COPY and rows and profile.dispatch != "async" and all(PAGEABLE_DTOH in index.t_name[r] for r in rows) \
                and c.end_us >= max(index.t_end[r] for r in rows):
            # CUDA's async copy from the device into pageable host memory (tensor.to("cpu")) returns only
            # once the copy is done: a copy and a wait for it, not launch time.
            kind = CALL_COPY_SYNC
        if kind in ISSUING and rows:
            costs = take_gap(c.start_us)
            main_us = c.end_us - c.start_us
            if profile.dispatch == "async":  # the Enqueue is framework time; the Dequeue is the launch
                costs["framework_us"] += main_us
                launch = c.launch_us
                launch_lane += launch
                segments.append((c.start_us, c.end_us, "framework"))
                if launch > 0 and np.isfinite(c.ready_us):
                    launch_segments.append((c.ready_us - launch, c.ready_us))
            elif kind == CALL_COPY_SYNC:  # its time is the wait for the copy and the return (below)
                launch = 0.0
            else:
                launch = main_us
                segments.append((c.start_us, c.end_us, "launch"))
            first = len(ops)
            for k, row in enumerate(rows):
                own = {**costs, "launch_us": launch, "host_us": 0.0, "ready_us": c.ready_us} if k == 0 else dict(none, ready_us=c.ready_us)
                add_task(row, own, first if len(rows) > 1 else -1, kind == CALL_GRAPH, False, c.start_us)
                if not ops[-1]["name"]:
                    ops[-1]["name"] = c.op or short_name(ops[-1]["kernel"])
            cursor = c.end_us
            if kind == CALL_COPY_SYNC:  # the copy, then the wait for it
                done = max(ops[i]["end_us"] for i in range(first, len(ops)))
                own_us = c.end_us - max(c.start_us, done)
                waited = max(0.0, min(done, c.end_us) - c.start_us)
                sync_wait += waited
                if waited > 0:
                    segments.append((c.start_us, c.start_us + waited, "sync_wait"))
                segments.append((c.start_us + waited, c.end_us, "sync"))
                host_op(f"[sync] {c.name}", {"framework_us": 0.0, "alloc_us": 0.0, "tiling_us": 0.0}, max(0.0, own_us), [len(ops) - 1], "sync", c.start_us)
            continue
        if kind == CALL_SYNC:
            costs = take_gap(c.start_us)
            streams = list(last_on_stream) if c.stream == ALL_STREAMS else [int(c.stream)]
            if c.wait_stream >= 0:
                streams = [int(c.wait_stream)]
            awaited = [last_on_stream[s] for s in streams if s in last_on_stream]
            done = max([ops[i]["end_us"] for i in awaited], default=-np.inf)
            waited = max(0.0, min(done, c.end_us) - c.start_us)
            sync_wait += waited
            if waited > 0:
                segments.append((c.start_us, c.start_us + waited, "sync_wait"))
            segments.append((c.start_us + waited, c.end_us, "sync"))
            host_op(f"[sync] {c.name}", costs, c.end_us - c.start_us - waited, awaited, "sync", c.start_us)
            cursor = c.end_us
            continue
        # Anything else (queries, records, launches the trace holds no task for): host time, left in
        # the gap before the next op.
    if window.end_us > cursor:
        host_op("[host]", {"framework_us": 0.0, "alloc_us": 0.0, "tiling_us": 0.0}, window.end_us - cursor, [], "host", cursor)
        framework_pieces(cursor, window.end_us)
    # In start order for the measures' walk (a call on a second issuing thread may start inside a gap
    # already cut into segments).
    segments.sort()
    return StepOps(window, ops, np.array(task_ids, dtype=np.int64), calls, segments, sync_wait, launch_lane,
                   launch_segments=sorted(launch_segments))


def _unlinked_issue_times(index: TraceIndex, unlinked: list[int], task_of_key: dict, calls: pd.DataFrame) -> list[float]:
    """When device work that no call of the step issued must have been issued, at the latest: before it
    started, before the next task of its stream was issued (streams run in issue order), and before a
    sync that returned after it ended started waiting (the sync waited for it)."""
    if not unlinked:
        return []
    by_stream: dict[int, list[tuple[float, float]]] = {}
    for key, rows in task_of_key.items():
        for row in rows:
            by_stream.setdefault(index.t_stream[row], []).append((index.t_start[row], index.issued_by[key]))
    for entries in by_stream.values():
        entries.sort()
    syncs = calls[calls["kind"].isin((CALL_SYNC, CALL_COPY_SYNC))]
    sync_rows = list(zip(syncs["start_us"].tolist(), syncs["end_us"].tolist(), syncs["stream"].tolist()))
    times = []
    for row in unlinked:
        start, end, stream = index.t_start[row], index.t_end[row], index.t_stream[row]
        latest = start
        for task_start, issued in by_stream.get(stream, []):
            if task_start >= start:
                latest = min(latest, issued)
                break
        for sync_start, sync_end, sync_stream in sync_rows:
            if sync_end >= end and sync_stream in (ALL_STREAMS, stream):
                latest = min(latest, sync_start)
                break
        times.append(latest)
    return times


def signature(step: StepOps) -> tuple:
    return tuple((op["name"], op["kind"], op["trace_stream"], op["group"] >= 0, op["carried_in"]) for op in step.ops)


def import_profile(profile: Profile, rule: str = "auto", keep: Optional[slice] = None) -> Imported:
    """Steps of a trace, their ops, and which of them the op list replays."""
    applied, windows = find_windows(profile, rule)
    index = TraceIndex(profile)
    issued_anywhere = np.unique(np.concatenate([_issued_keys(index.calls.iloc[index.calls_in(w)]) for w in windows] or [np.zeros(0, np.int64)]))
    first_start_us = min((w.start_us for w in windows), default=-np.inf)
    found = [step_ops(profile, index, w, issued_anywhere, first_start_us) for w in windows]
    found = [s for s in found if s.task_ids.size and np.any(s.task_ids >= 0)]
    if not found:
        raise ProfileError(f"{profile.path}: no device work inside any step ({applied}): nothing to replay")
    # Each step starts when its window opens or the step before it ended, whichever is later: over every
    # step found, before --keep picks some (a kept step's time must not depend on which others are kept).
    previous_end = -np.inf
    for step in found:
        devices = [op["end_us"] for op in step.ops if not np.isnan(op["end_us"])]
        step.start_us = max(step.window.start_us, previous_end)
        step.end_us = max([step.window.end_us, *devices])
        if step.end_us <= step.start_us:  # its window lies inside the step before: no step time (or a negative one), its ops in both
            raise ProfileError(
                f"{profile.path}: --steps {applied}: step {step.window.label!r} ends at {step.end_us:.3f} us, no later than the step"
                f" before it ends ({step.start_us:.3f} us): steps must not overlap"
            )
        previous_end = step.end_us
        step.signature = signature(step)
    # --keep picks among the steps found, which keep their numbers (the step table, steps_found and
    # steps_replayed speak of the trace's steps, not of the slice's).
    candidates = list(range(len(found)))[keep] if keep is not None else list(range(len(found)))
    if not candidates:
        raise ProfileError(f"{profile.path}: --keep leaves no step (the trace has steps 0..{len(found) - 1})")
    groups: dict[tuple, list[int]] = {}
    for i in sorted(candidates):
        groups.setdefault(found[i].signature, []).append(i)
    kept = max(groups.values(), key=lambda members: (len(members), members[-1]))
    left_out = {i: "outside --keep" for i in range(len(found)) if i not in candidates}
    left_out.update({
        i: f"its ops differ from step {kept[0]}'s ({len(found[i].ops)} ops against {len(found[kept[0]].ops)})"
        for i in candidates if i not in kept
    })
    imported = Imported(profile, applied, found, kept, left_out)
    imported.streams = harness_streams(profile, [found[i] for i in kept])
    for i in kept:
        _mark_unseen_waits(found[i])
    return imported


def harness_streams(profile: Profile, steps: list[StepOps]) -> dict[int, int]:
    """Trace streams → harness streams: the busiest compute stream is 0, streams of collectives 1, the
    other streams 2, 3, ... in order of first use (beyond MAX_STREAMS they share the last)."""
    busy: dict[int, float] = {}
    comm: set[int] = set()
    order: list[int] = []
    for step in steps:
        for op in step.ops:
            s = op["trace_stream"]
            if s < 0:
                continue
            if s not in busy:
                order.append(s)
                busy[s] = 0.0
            busy[s] += op["device_us"]
            if op["kind"] == "comm":
                comm.add(s)
    mapping: dict[int, int] = {}
    compute = [s for s in order if s not in comm]
    if compute:
        mapping[max(compute, key=lambda s: busy[s])] = 0
    extra = 2
    for s in order:
        if s in mapping:
            continue
        if s in comm:
            mapping[s] = 1
        else:
            mapping[s] = min(extra, MAX_STREAMS - 1)
            extra += 1
    return mapping


def _mark_unseen_waits(step: StepOps) -> None:
    """`not_before_us` for ops that started later than their launch, stream and events explain."""
    ops = step.ops
    for op in ops:
        start = op["start_us"]
        if start != start:  # a host op (NaN)
            continue
        explained = max(op.get("ready_us", step.start_us), step.start_us)
        for d in op["after"]:
            end = ops[d]["end_us"]
            if end == end and end > explained:
                explained = end
        op["not_before_us"] = start - step.start_us if start - explained > UNSEEN_WAIT_US else np.nan


# ---------------------------------------------------------------- op list


def ops_table(imported: Imported) -> pd.DataFrame:
    """The rows of ops.csv (harness/model/ops_csv.py columns) for the steps the op list replays; missing
    values (a host op's stream, an op of no group) are empty cells."""
    ops = [(number, op) for number, i in enumerate(imported.kept) for op in imported.found[i].ops]
    device = np.array([op["trace_stream"] >= 0 for _, op in ops], dtype=bool)

    def column(key: str, dtype=np.float64) -> np.ndarray:
        return np.array([op.get(key, np.nan) for _, op in ops], dtype=dtype)

    trace_stream = column("trace_stream", np.int64)
    group = column("group", np.int64)
    table = pd.DataFrame(
        {
            "step": np.array([number for number, _ in ops], dtype=np.int64),
            "name": [op["name"] for _, op in ops],
            "kind": [op["kind"] for _, op in ops],
            "stream": pd.array([imported.streams[s] if d else None for s, d in zip(trace_stream.tolist(), device)], dtype="Int64"),
            "device_us": np.where(device, column("device_us"), np.nan),
            "after": [" ".join(map(str, op["after"])) if op["after"] else NO_DEPENDENCY for _, op in ops],
            "group": pd.array([g if g >= 0 else None for g in group.tolist()], dtype="Int64"),
            "in_graph": column("in_graph", np.int64),
            "carried_in": column("carried_in", np.int64),
            "not_before_us": column("not_before_us"),
            "framework_us": column("framework_us"),
            "infer_shape_us": 0.0,  # measured inside framework_us: the trace does not split them
            "tiling_us": column("tiling_us"),
            "alloc_us": column("alloc_us"),
            "launch_us": column("launch_us"),
            "free_us": 0.0,
            "host_us": column("host_us"),
            "kernel": [op["kernel"] for _, op in ops],
            "trace_stream": pd.array([s if d else None for s, d in zip(trace_stream.tolist(), device)], dtype="Int64"),
        },
        columns=IMPORTED_OP_COLUMNS,
    )
    return table
