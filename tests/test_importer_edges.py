"""The importers' edge cases, each a tiny hand-built trace with its result worked out by hand.

What the file pins, by reader:
- Kineto (`kineto.py`): which described device names the trace (the kernels' one, not another); a
  `cpu_op` ProfilerStep is a step mark, not a framework op; the defaults of a missing or textual id (a
  kernel's device and stream, an op's thread: 0); which host event a device row's HTA launch time
  comes from (only one sharing its correlation: no correlation links nothing).
- torch_npu (`torch_npu.py`): only `process_name` metadata gives a process its role; flows that name no
  call (no AscendCL calls on their thread, or between calls) are skipped and the later ones still link;
  a flow's end names the task that starts there to the ns; with a task queue, launch-thread calls that
  are not launches are dropped and the launch after them is kept, issued at its Enqueue; a call waits for
  no stream (-1).
- Call kinds (`events.py`): an asynchronous memset is a kind of its own, not a copy.
- Measures (`measure.py`): device time of a step under 1 µs, or none at all; a step of 0 µs; host wait
  under 1 µs; the task ending an idle gap when a zero-length task starts with it; the launch-to-start
  percentiles; HTA's non-compute share.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.importers import load_profile
from harness.importers.events import CALL_LAUNCH, CALL_OTHER, ISSUING, ProfileError
from harness.importers.measure import measured_summary, peer_breakdown
from harness.importers.steps import find_windows, import_profile
from synthetic_trace import KERNEL, LAUNCH, device_task, runtime_call, trace_file

# ---------------------------------------------------------------- Kineto

TWO_GPUS = [{"id": 0, "name": "GPU zero"}, {"id": 1, "name": "GPU one"}]


def on_device(event: dict, device: int) -> dict:
    """`event` (a device task) recorded on `device`."""
    return {**event, "pid": device, "args": {**event["args"], "device": device}}


def without(event: dict, *keys: str) -> dict:
    return {k: v for k, v in event.items() if k not in keys}


def test_the_device_name_is_that_of_the_device_the_kernels_ran_on(tmp_path):
    """Two devices described (0 "GPU zero", 1 "GPU one"), a kernel on each: the busiest one (a tie: the
    first seen, device 0) by default, device 1 when rank 1 is asked for; each is named by its own entry."""
    events = [LAUNCH, KERNEL, runtime_call("cudaLaunchKernel", 20, 5, 9), on_device(device_task("k", 30, 5, 9), 1)]
    path = trace_file(tmp_path, events, deviceProperties=TWO_GPUS)
    default, second = load_profile(path), load_profile(path, rank=1)
    assert (default.device_index, default.device) == (0, "GPU zero")
    assert (second.device_index, second.device) == (1, "GPU one")


def test_a_kernel_without_a_device_or_a_numeric_pid_is_on_device_0(tmp_path):
    """A kernel with no `args.device` and no `pid` (nothing says which device): device 0, named by
    entry 0 of the two described."""
    kernel = without({**KERNEL, "args": without(KERNEL["args"], "device")}, "pid")
    profile = load_profile(trace_file(tmp_path, [LAUNCH, kernel], deviceProperties=TWO_GPUS))
    assert (profile.device_index, profile.device) == (0, "GPU zero")
    assert profile.tasks[["name", "start_us", "end_us", "key"]].values.tolist() == [["k", 8.0, 13.0, 8]]


def test_a_kernel_without_a_stream_or_a_numeric_thread_is_on_stream_0(tmp_path):
    """The kernel's stream comes from `args.stream`, else its `tid`; the tid written as text
    ("stream 7", as older Kineto does) and no `args.stream`: stream 0."""
    kernel = {**KERNEL, "tid": "stream 7", "args": without(KERNEL["args"], "stream")}
    assert load_profile(trace_file(tmp_path, [LAUNCH, kernel])).tasks["stream"].tolist() == [0]


def test_a_call_and_an_op_without_a_thread_are_both_on_thread_0(tmp_path):
    """aten::mm [1,10] µs and the launch [2,7] µs inside it, neither with a `tid`: both on thread 0, so
    the launch ran in aten::mm (row 0 of the framework ops). Times from the op's start (1 µs)."""
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "ts": 1, "dur": 9}
    profile = load_profile(trace_file(tmp_path, [op, without(LAUNCH, "tid"), KERNEL]))
    assert profile.calls[["thread", "start_us", "end_us", "op", "op_id"]].values.tolist() == [[0, 1.0, 6.0, "aten::mm", 0]]


def test_a_profiler_step_recorded_as_a_cpu_op_is_a_step_mark(tmp_path):
    """Older PyTorch writes ProfilerStep#0 under `cpu_op`: it is the step [0,20] µs (a mark), not a
    framework op the launch at 2 µs ran in."""
    step = {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 20}
    profile = load_profile(trace_file(tmp_path, [step, LAUNCH, KERNEL]))
    assert profile.marks.values.tolist() == [[1, 0.0, 20.0, "ProfilerStep#0"]]
    assert profile.framework_ops["name"].tolist() == [] and profile.calls["op"].tolist() == [""]
    rule, windows = find_windows(profile)
    assert rule == "profiler" and [(w.start_us, w.end_us) for w in windows] == [(0.0, 20.0)]


def test_a_device_row_takes_its_launch_time_only_from_the_call_sharing_its_correlation(tmp_path):
    """HTA's rows: kernel k (correlation 1) [8,13] µs, launched at 0 µs (times from 2 µs); kernel
    `loose` [28,33] µs has no correlation, and neither has the sync at 18 µs: no launch time (NaN). So
    on stream 7 the 15 µs gap before `loose` is not a host wait (nothing launched it after 13 µs) but,
    under HTA's 30 µs, a kernel wait."""
    loose = {**KERNEL, "name": "loose", "ts": 30, "args": without(KERNEL["args"], "correlation")}
    events = [runtime_call("cudaLaunchKernel", 2, 5, 1), device_task("k", 10, 5, 1), runtime_call("cudaStreamSynchronize", 20, 2), loose]
    profile = load_profile(trace_file(tmp_path, events))
    rows = profile.peer_rows
    assert rows[["name", "start_us", "end_us", "stream"]].values.tolist() == [["k", 8.0, 13.0, 7], ["loose", 28.0, 33.0, 7]]
    assert rows["runtime_start_us"].iloc[0] == 0.0 and math.isnan(rows["runtime_start_us"].iloc[1])
    peer = peer_breakdown(import_profile(profile))
    assert (peer["idle_host_wait_us"], peer["idle_kernel_wait_us"], peer["idle_other_us"]) == (0.0, 15.0, 0.0)


def test_an_async_memset_is_a_launch_of_its_own_kind_not_a_copy(tmp_path):
    """cudaMemsetAsync, cudaMemcpyAsync, cudaMemcpy and cudaLaunchKernel, each with its device task:
    four issuing calls of four different kinds (a memset taken for an async copy would be subject to the
    copy's rules, e.g. a copy into pageable memory that returns only once done)."""
    events = [
        runtime_call("cudaMemsetAsync", 2, 2, 1), device_task("Memset (Device)", 5, 1, 1, cat="gpu_memset"),
        runtime_call("cudaMemcpyAsync", 10, 2, 2), device_task("Memcpy HtoD (Pageable -> Device)", 13, 1, 2, cat="gpu_memcpy"),
        runtime_call("cudaMemcpy", 20, 8, 3), device_task("Memcpy DtoH (Device -> Pageable)", 21, 1, 3, cat="gpu_memcpy"),
        runtime_call("cudaLaunchKernel", 30, 2, 4), device_task("k", 33, 1, 4),
    ]
    kinds = load_profile(trace_file(tmp_path, events)).calls["kind"].tolist()
    assert len(set(kinds)) == 4 and all(kind in ISSUING for kind in kinds)


# ---------------------------------------------------------------- torch_npu

PYTHON_PID, CANN_PID, HARDWARE_PID = 1, 2, 3
MAIN, LAUNCHER, STREAM = 10, 20, 3  # Python thread, launch thread (in Python and CANN), device stream


def npu_processes() -> list[dict]:
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": role}}
            for pid, role in ((PYTHON_PID, "Python"), (CANN_PID, "CANN"), (HARDWARE_PID, "Ascend Hardware"))]


def npu_slice(pid: int, tid: int, name: str, ts, dur: float, cat: str | None = None, **args) -> dict:
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, **({"cat": cat} if cat else {}), **({"args": args} if args else {})}


def acl(name: str, ts: float, dur: float, tid: int = LAUNCHER) -> dict:
    """An AscendCL call on a CANN thread."""
    return npu_slice(CANN_PID, tid, f"AscendCL@{name}", ts, dur)


def npu_task(name: str, ts, dur: float) -> dict:
    """A device task on the one stream."""
    return npu_slice(HARDWARE_PID, STREAM, name, ts, dur, **{"Stream Id": STREAM})


def host_to_device(flow: str, tid: int, start, end) -> list[dict]:
    """A HostToDevice flow from CANN thread `tid` at `start` to the device stream at `end`."""
    return [{"ph": "s", "cat": "HostToDevice", "name": "HostToDevice", "id": flow, "pid": CANN_PID, "tid": tid, "ts": start},
            {"ph": "f", "cat": "HostToDevice", "name": "HostToDevice", "id": flow, "pid": HARDWARE_PID, "tid": STREAM, "ts": end, "bp": "e"}]


def npu_file(folder: Path, events: list[dict]) -> str:
    path = folder / "trace_view.json"
    path.write_text(json.dumps(npu_processes() + events))
    return str(path)


def test_flows_that_name_no_call_are_skipped_and_the_later_ones_still_link(tmp_path):
    """AscendCL calls Mul [0,5], Add [10,15], Sub [20,25] µs and tasks Mul [30,35], Add [40,45], Sub
    [50.25,55.25] (times from 1000 µs). Flows in file order: x from thread 99, which made no AscendCL
    call, to Mul; y from 7 µs, between two calls, to Add; z from inside Mul to Mul; w from inside Sub to
    1050.2504 µs, Sub's start to the ns. x and y link nothing; z and w link: Mul and Sub are launches,
    keyed by their call's number (0, 2), Add is other host time and its task is unlinked."""
    events = [
        acl("aclnnMul", 1000, 5), acl("aclnnAdd", 1010, 5), acl("aclnnSub", 1020, 5),
        npu_task("Mul", 1030, 5), npu_task("Add", 1040, 5), npu_task("Sub", "1050.250", 5),
        *host_to_device("x", 99, 1001, 1030), *host_to_device("y", LAUNCHER, 1007, 1040),
        *host_to_device("z", LAUNCHER, 1002, 1030), *host_to_device("w", LAUNCHER, 1021, "1050.2504"),
    ]
    profile = load_profile(npu_file(tmp_path, events))
    assert profile.calls[["name", "start_us", "end_us", "kind", "key"]].values.tolist() == [
        ["aclnnMul", 0.0, 5.0, CALL_LAUNCH, 0], ["aclnnAdd", 10.0, 15.0, CALL_OTHER, -1], ["aclnnSub", 20.0, 25.0, CALL_LAUNCH, 2],
    ]
    assert profile.tasks[["name", "start_us", "key"]].values.tolist() == [["Mul", 30.0, 0], ["Add", 40.0, -1], ["Sub", 50.25, 2]]
    assert profile.notes == ["2 HostToDevice flows name no call or task"]


def test_with_a_task_queue_a_launch_after_other_launch_thread_work_is_kept(tmp_path):
    """Times from 1000 µs. The Python thread runs aten::add [0,20] and enqueues [5,8] (correlation 1);
    the launch thread dequeues it [10,18] and launches aclnnAdd [11,16], after an aclrtGetDevice [8,9]
    outside any launch (dropped). The launch is issued at its Enqueue [5,8] on the Python thread, in
    aten::add; its launch time is the Dequeue's 8 µs; it became visible to the device at 16 µs. Its key
    is its call's number, 1 (the GetDevice is 0), as is its task's; it waits for no stream (-1)."""
    events = [
        npu_slice(PYTHON_PID, MAIN, "aten::add", 1000, 20, "cpu_op"),
        npu_slice(PYTHON_PID, MAIN, "Enqueue", 1005, 3, "enqueue", correlation_id=1),
        npu_slice(PYTHON_PID, LAUNCHER, "Dequeue@aten::add", 1010, 8, "dequeue", correlation_id=1),
        acl("aclrtGetDevice", 1008, 1), acl("aclnnAdd", 1011, 5),
        npu_task("Add", 1020, 5), *host_to_device("a", LAUNCHER, 1012, 1020),
    ]
    profile = load_profile(npu_file(tmp_path, events))
    assert profile.dispatch == "async"
    columns = ["thread", "start_us", "end_us", "launch_us", "ready_us", "kind", "name", "op", "key", "stream", "wait_stream", "wait_key"]
    assert profile.calls[columns].values.tolist() == [[MAIN, 5.0, 8.0, 8.0, 16.0, CALL_LAUNCH, "aclnnAdd", "aten::add", 1, -1, -1, -1]]
    assert profile.tasks[["stream", "start_us", "end_us", "name", "key"]].values.tolist() == [[STREAM, 20.0, 25.0, "Add", 1]]


def test_only_process_name_metadata_gives_a_process_its_role(tmp_path):
    """A Python thread named "CANN" (thread_name metadata, after the process names) does not make the
    Python process the CANN lane: the calls are still the CANN process's aclnnAdd [1,6] µs (from aten::add's
    start, 999 µs), linked to its task, in aten::add (same thread id), and aten::add is not a call."""
    events = [
        npu_slice(PYTHON_PID, MAIN, "aten::add", 999, 8, "cpu_op"),
        acl("aclnnAdd", 1000, 5, tid=MAIN), npu_task("Add", 1010, 5), *host_to_device("a", MAIN, 1001, 1010),
        {"ph": "M", "name": "thread_name", "pid": PYTHON_PID, "tid": MAIN, "args": {"name": "CANN"}},
    ]
    profile = load_profile(npu_file(tmp_path, events))
    assert profile.calls[["name", "start_us", "end_us", "kind", "op"]].values.tolist() == [["aclnnAdd", 1.0, 6.0, CALL_LAUNCH, "aten::add"]]
    assert profile.tasks["key"].tolist() == [0]


# ---------------------------------------------------------------- measures


def measured(folder: Path, events: list[dict]) -> dict:
    return measured_summary(import_profile(load_profile(trace_file(folder, events))))


def test_device_time_under_one_us_is_on_the_critical_path(tmp_path):
    """The one step is the whole trace [0,8.5] µs (from 2 µs): launch [0,5], kernel [8,8.5], 0.5 µs of
    device time. Idle [0,8]: 5 µs waiting for the launch (on the host: the launch call), 3 µs after it
    (front end). Path: launch 5, front_end 3, compute 0.5, of 8.5."""
    result = measured(tmp_path, [LAUNCH, {**KERNEL, "dur": 0.5}])
    expected = {"step_ms_mean": 0.0085, "breakdown_launch": 5 / 8.5, "breakdown_front_end": 3 / 8.5, "breakdown_compute": 0.5 / 8.5,
                "device_busy": 0.5 / 8.5}
    assert {key: result[key] for key in expected} == pytest.approx(expected)


def test_a_zero_length_kernel_adds_no_device_time(tmp_path):
    """Launch [0,5] µs, kernel [8,8] (no duration): the step [0,8] has no device time; all of it is the
    host's (nothing runs before the step ends): launch 5, framework 3 (the rest after the call)."""
    result = measured(tmp_path, [LAUNCH, {**KERNEL, "dur": 0}])
    breakdown = {k: v for k, v in result.items() if k.startswith("breakdown_") and v}
    assert breakdown == pytest.approx({"breakdown_launch": 5 / 8, "breakdown_framework": 3 / 8})
    assert (result["step_ms_mean"], result["device_busy"]) == (pytest.approx(0.008), 0.0)


def test_a_step_inside_the_previous_steps_device_time_is_refused(tmp_path):
    """Step 0 [0,10] µs launches kernel a [5,20], past its end; step 1 [10,20] launches kernel b [13,15]
    on another stream. Step 0 ends with a (20 µs), so step 1 would run from 20 to 20 µs: 0 µs, with b
    outside it. It was kept and measured as a 0 ms step; it is refused as the overlapping steps it is,
    naming the step and both times."""
    def mark(k, ts):
        return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1, "ts": ts, "dur": 10}

    events = [mark(0, 0), runtime_call("cudaLaunchKernel", 1, 2, 1), device_task("a", 5, 15, 1),
              mark(1, 10), runtime_call("cudaLaunchKernel", 12, 1, 2), device_task("b", 13, 2, 2, stream=9)]
    with pytest.raises(ProfileError, match=r"step 'ProfilerStep#1' ends at 20\.000 us, no later than the step before it ends \(20\.000 us\)"):
        import_profile(load_profile(trace_file(tmp_path, events)))


def test_host_wait_under_one_us_is_on_the_critical_path(tmp_path):
    """Launch [0,0.5] µs (from 2 µs), kernel [0.5,5.5]: the device waited 0.5 µs for the launch call.
    Path: launch 0.5, compute 5, of 5.5."""
    result = measured(tmp_path, [{**LAUNCH, "dur": 0.5}, {**KERNEL, "ts": 2.5}])
    expected = {"breakdown_launch": 0.5 / 5.5, "breakdown_compute": 5 / 5.5, "idle_host_wait_ms": 0.0005, "idle_device_wait_ms": 0.0}
    assert {key: result[key] for key in expected} == pytest.approx(expected)


def test_the_task_ending_an_idle_gap_is_the_first_that_runs_not_a_zero_length_one(tmp_path):
    """Launch a [0,2] µs (from 2 µs), launch b [3,5]; kernel a [8,8] (no duration) and kernel b [8,13],
    both starting at 8 µs. The idle [0,8] ends with b (a runs for no time), launched at 5 µs: 5 µs of
    host wait (launch a 2, framework 1, launch b 2), then 3 µs of device wait (front end). Path: launch
    4, framework 1, front_end 3, compute 5, of 13."""
    events = [runtime_call("cudaLaunchKernel", 2, 2, 1), runtime_call("cudaLaunchKernel", 5, 2, 2),
              device_task("a", 10, 0, 1), device_task("b", 10, 5, 2)]
    result = measured(tmp_path, events)
    expected = {"step_ms_mean": 0.013, "idle_host_wait_ms": 0.005, "idle_device_wait_ms": 0.003, "breakdown_launch": 4 / 13,
                "breakdown_framework": 1 / 13, "breakdown_front_end": 3 / 13, "breakdown_compute": 5 / 13}
    assert {key: result[key] for key in expected} == pytest.approx(expected)


def test_launch_to_start_percentiles_by_hand(tmp_path):
    """Three launches of 2 µs each; their kernels start 1, 2 and 4 µs after the launch returns. Linear
    percentiles of [1, 2, 4] (position (n-1)·q: 2q): p50 2, p90 at 1.8 → 2 + 0.8·2 = 3.6, p99 at 1.98 →
    2 + 0.98·2 = 3.96; mean 7/3, max 4."""
    events = []
    for k, delay in enumerate((1, 2, 4)):
        events += [runtime_call("cudaLaunchKernel", 10 * k, 2, k + 1), device_task(f"k{k}", 10 * k + 2 + delay, 1, k + 1)]
    result = measured(tmp_path, events)
    names = ("mean", "p50", "p90", "p99", "max")
    assert [result[f"launch_to_start_us_{n}"] for n in names] == pytest.approx([7 / 3, 2.0, 3.6, 3.96, 4.0])


def test_hta_non_compute_share_by_hand(tmp_path):
    """HTA's rows (from 2 µs): kernel [8,13], an async copy [18,23] on the same stream. Window 15 µs:
    compute 5, non-compute (the copy) 5, idle 5: 33.33 % each. The 5 µs gap: the copy's call (6 µs)
    started before the kernel ended, and it is under 30 µs: a kernel wait."""
    events = [LAUNCH, KERNEL, runtime_call("cudaMemcpyAsync", 8, 1, 9),
              device_task("Memcpy HtoD (Pageable -> Device)", 20, 5, 9, cat="gpu_memcpy")]
    peer = peer_breakdown(import_profile(load_profile(trace_file(tmp_path, events))))
    assert (peer["window_ms"], peer["compute_pct"], peer["non_compute_pct"], peer["idle_pct"]) == (pytest.approx(0.015), 33.33, 33.33, 33.33)
    assert (peer["idle_host_wait_us"], peer["idle_kernel_wait_us"], peer["idle_other_us"]) == (0.0, 5.0, 0.0)
