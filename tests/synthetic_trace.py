"""Kineto traces built by hand: every gap, call and kernel known, so imports can be checked exactly.

`kineto_trace` lays out eager steps on one host thread: each op is framework time, a launch call,
and a kernel that starts when the launch ends (or when the stream frees up); each step ends with a
stream sync. `benchmarks/bench_import.py` uses it for a 100k-event trace.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

PID, TID, GPU, STREAM = 100, 100, 0, 7


@dataclass
class Layout:
    steps: int = 2
    ops: int = 3
    framework_us: float = 10.0  # host time before each launch
    launch_us: float = 5.0  # the launch call
    kernel_us: float = 20.0  # each kernel
    sync_own_us: float = 3.0  # the sync call after its wait
    gap_between_steps_us: float = 4.0  # host time outside any step
    profiler_steps: bool = True
    # What a real PyTorch-profiler trace holds around each launch besides the launch and its kernel:
    # an outer framework op, a Python frame, the launch-to-kernel flow pair and a memory event (about
    # 8 events per kernel, as in an HF-transformers trace; False: 3 per kernel, the densest trace).
    companions: bool = False
    events: list = field(default_factory=list)


def kineto_trace(layout: Layout) -> dict:
    """A Kineto trace dict; steps marked `ProfilerStep#N` (or not), timestamps in whole µs."""
    events: list[dict] = [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": TID, "args": {"name": "main"}},
    ]
    t = 1000.0
    correlation = 1
    stream_free = 0.0
    for step in range(layout.steps):
        step_start = t
        for op in range(layout.ops):
            t += layout.framework_us
            events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{op}", "pid": PID, "tid": TID, "ts": t - 2, "dur": layout.launch_us + 4})
            if layout.companions:
                events += [
                    {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": PID, "tid": TID, "ts": t - 3, "dur": layout.launch_us + 6},
                    {"ph": "X", "cat": "python_function", "name": "torch/nn/modules/linear.py(125): forward", "pid": PID, "tid": TID,
                     "ts": t - 4, "dur": layout.launch_us + 8},
                    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": correlation, "pid": PID, "tid": TID, "ts": t},
                    {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": correlation, "pid": GPU, "tid": STREAM, "ts": max(t + layout.launch_us, stream_free), "bp": "e"},
                    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID, "tid": TID, "ts": t - 1, "s": "t", "args": {"Bytes": 4096}},
                ]
            events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": TID, "ts": t, "dur": layout.launch_us,
                 "args": {"correlation": correlation}}
            )
            start = max(t + layout.launch_us, stream_free)
            events.append(
                {"ph": "X", "cat": "kernel", "name": f"void kernel{op}<float>(float*)", "pid": GPU, "tid": STREAM, "ts": start,
                 "dur": layout.kernel_us, "args": {"correlation": correlation, "stream": STREAM, "device": GPU}}
            )
            stream_free = start + layout.kernel_us
            t += layout.launch_us + 2  # the op's own code after its launch returns
            correlation += 1
        sync_end = max(t, stream_free) + layout.sync_own_us
        events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": PID, "tid": TID, "ts": t, "dur": sync_end - t,
             "args": {"correlation": correlation}}
        )
        events.append(
            {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": GPU, "tid": STREAM, "ts": t, "dur": sync_end - t,
             "args": {"correlation": correlation, "stream": STREAM, "device": GPU}}
        )
        correlation += 1
        t = sync_end
        if layout.profiler_steps:
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": PID, "tid": TID, "ts": step_start, "dur": t - step_start})
        t += layout.gap_between_steps_us
    events += layout.events
    return {"schemaVersion": 1, "deviceProperties": [{"id": GPU, "name": "Synthetic GPU"}], "traceEvents": events}


def expected_step_us(layout: Layout) -> float:
    """A step of `kineto_trace` (each starts with the device idle): a kernel starts when its launch
    returns or its stream frees up; the sync returns its own time after the later of host and device."""
    t = stream_free = 0.0
    for _ in range(layout.ops):
        t += layout.framework_us + layout.launch_us
        stream_free = max(t, stream_free) + layout.kernel_us
        t += 2
    return max(t, stream_free) + layout.sync_own_us


def runtime_call(name: str, ts: float, dur: float, correlation: int | None = None, tid: int = 1, cat: str = "cuda_runtime") -> dict:
    """A host call of thread `tid` (process 1), linked to device work by `correlation` when given."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {} if correlation is None else {"correlation": correlation}}


def device_task(name: str, ts: float, dur: float, correlation: int, stream: int = 7, cat: str = "kernel") -> dict:
    """Device work on `stream` of device 0, issued by the call of the same correlation."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": correlation, "stream": stream, "device": 0}}


# The smallest trace: a launch [2,7] µs and its 5 µs kernel at 10 µs.
LAUNCH = runtime_call("cudaLaunchKernel", 2, 5, 8)
KERNEL = device_task("k", 10, 5, 8)


def trace_file(folder: Path, events: list, **top) -> str:
    """`events` (and any other top-level keys) written as a Kineto trace in `folder`; its path."""
    path = folder / "trace.json"
    path.write_text(json.dumps({"traceEvents": events, **top}))
    return str(path)
