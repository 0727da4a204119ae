"""The importers' building blocks, each against cases worked out by hand: timestamps, how slices on a
thread nest, which slice holds a time, reading (gzipped) JSON, kernel names and kinds, step windows."""
from __future__ import annotations

import gzip
import json
import types

import numpy as np
import pandas as pd
import pytest

from harness.importers import load_profile
from harness.importers.steps import Window, _repeated_mark, _windows_between, find_windows, import_profile, op_kind, ops_table, short_name
from harness.importers.events import (
    CALL_COLUMNS, TASK_COMM, TASK_COPY, TASK_KERNEL, TASK_SET, Clock, ProfileError, innermost, nesting_parents, read_json, top_level,
)
from harness.importers.measure import measured_summary, peer_breakdown
from synthetic_trace import GPU, KERNEL, LAUNCH, PID, TID, Layout, device_task, kineto_trace, runtime_call, trace_file


def test_the_clock_subtracts_the_whole_part_exactly():
    """torch_npu writes 16 integer digits and a fraction: a float would lose the fraction."""
    clock = Clock(1704161511422000)
    assert clock("1704161511422904.204") == pytest.approx(904.204, abs=1e-9)
    assert clock("1704161511422904") == 904.0
    assert clock(1704161511422010) == 10.0 and isinstance(clock(1704161511422010), float)
    assert Clock(100)(102.5) == 2.5
    clock = Clock(Clock.whole_part("1704161511422904.204"))
    assert clock("1704161511422904.204") == pytest.approx(0.204, abs=1e-9) and clock("1704161511422910.5") == pytest.approx(6.5, abs=1e-9)
    assert Clock.whole_part("1704161511422904.204") == 1704161511422904 and Clock.whole_part(12.9) == 12


def test_slices_on_a_thread_nest_in_start_order_longest_first():
    """Slices: 0 [0,10], 1 [0,4] (same start, shorter: inside 0), 2 [4,6] (starts where 1 ends: beside 1,
    inside 0), 3 [5,6] (inside 2), 4 [10,12] (starts where 0 ends: top level)."""
    start = np.array([0.0, 0.0, 4.0, 5.0, 10.0])
    end = np.array([10.0, 4.0, 6.0, 6.0, 12.0])
    order, parent = nesting_parents(start, end)
    assert order.tolist() == [0, 1, 2, 3, 4]
    assert parent.tolist() == [-1, 0, 0, 2, -1]
    assert top_level(start, end).tolist() == [True, False, False, False, True]
    # The innermost slice holding each time (a slice holds its start and its end; the later slice wins a tie).
    assert innermost(start, end, np.array([0.0, 3.0, 4.0, 5.5, 6.0, 7.0, 10.0, 12.0, 12.5, -1.0])).tolist() == [1, 1, 2, 3, 3, 0, 4, 4, -1, -1]
    assert innermost(np.zeros(0), np.zeros(0), np.array([1.0, 2.0])).tolist() == [-1, -1]
    # Given out of order: indices are the caller's.
    start, end = np.array([0.0, 1.0, 2.0, 10.0]), np.array([9.0, 5.0, 3.0, 12.0])
    assert innermost(start, end, np.array([2.5, 4.0, 8.0, 11.0, 20.0])).tolist() == [2, 1, 0, 3, -1]
    assert top_level(start[::-1], end[::-1]).tolist() == [True, False, False, True]


def test_reading_json_plain_gzipped_or_not_at_all(tmp_path):
    (tmp_path / "a.json").write_text('{"traceEvents": []}')
    (tmp_path / "b.json").write_bytes(gzip.compress(b'{"x": 1}'))  # gzipped whatever the name says
    assert read_json(tmp_path / "a.json") == {"traceEvents": []} and read_json(tmp_path / "b.json") == {"x": 1}
    (tmp_path / "c.json").write_bytes(b"\x1f\x8b not gzip")
    (tmp_path / "d.json").write_text("{nope")
    for name, words in (("c.json", "not a readable gzip file"), ("d.json", "not JSON"), ("missing.json", "cannot read")):
        with pytest.raises(ProfileError, match=words):
            read_json(tmp_path / name)


@pytest.mark.parametrize(
    "kernel, short",
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
         "vectorized_elementwise_kernel"),
        ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int, float)", "vectorized_elementwise_kernel"),
        ("MatMulV2", "MatMulV2"),
        ("<unnamed>", "<unnamed>"),
        ("k" * 100, "k" * 80),
    ],
)
def test_short_kernel_names(kernel, short):
    assert short_name(kernel) == short


@pytest.mark.parametrize(
    "task_kind, kernel, kind",
    [
        (TASK_COPY, "Memcpy HtoD", "copy"), (TASK_SET, "Memset", "copy"), (TASK_COMM, "ncclKernel_AllReduce", "comm"),
        (TASK_KERNEL, "sm90_xmma_gemm_bf16", "cube"), (TASK_KERNEL, "flash_fwd_kernel", "cube"), (TASK_KERNEL, "MatMulV3", "cube"),
        (TASK_KERNEL, "triton_poi_fused_add_0", "vector"), (TASK_KERNEL, "RmsNorm", "vector"),
    ],
)
def test_a_device_task_has_the_kind_of_its_unit(task_kind, kernel, kind):
    assert op_kind(task_kind, kernel) == kind


def test_windows_run_from_each_start_to_the_next_and_empty_ones_are_dropped():
    windows = _windows_between([0.0, 5.0, 5.0, 9.0], 12.0, ["a", "b", "c", "d"])
    assert [(w.label, w.start_us, w.end_us) for w in windows] == [("a", 0.0, 5.0), ("c", 5.0, 9.0), ("d", 9.0, 12.0)]
    assert isinstance(windows[0], Window)


def test_the_repeated_mark_is_the_most_frequent_that_never_overlaps_itself():
    marks = pd.DataFrame({
        "thread": [1] * 7,
        "name": ["fwd", "fwd", "fwd", "layer", "layer", "once", "nested"],
        "start_us": [0.0, 10.0, 20.0, 1.0, 11.0, 2.0, 3.0],
        "end_us": [9.0, 19.0, 29.0, 5.0, 15.0, 3.0, 4.0],
    })
    assert _repeated_mark(marks) == "fwd"
    overlapping = marks.assign(end_us=[12.0, 19.0, 29.0, 5.0, 15.0, 3.0, 4.0])  # fwd's first occurrence overlaps its second
    assert _repeated_mark(overlapping) == "layer"
    later = marks.assign(end_us=[9.0, 21.0, 29.0, 5.0, 15.0, 3.0, 4.0])  # only the second overlaps the third
    assert _repeated_mark(later) == "layer"
    # Equally frequent: the one that starts first.
    tie = pd.DataFrame({"thread": [1] * 4, "name": ["b", "a", "b", "a"], "start_us": [1.0, 0.0, 11.0, 10.0], "end_us": [2.0, 1.0, 12.0, 11.0]})
    assert _repeated_mark(tie) == "a"
    assert _repeated_mark(marks[marks["name"] == "once"]) is None


def test_driver_calls_count_only_where_no_runtime_call_holds_them(tmp_path):
    """A driver call inside the runtime call that made it is the same host time (dropped); a driver call
    on its own (thread 1 at 20 µs, thread 2 even while thread 3 runs a call) is a host call of its own.
    Times from the first event (2 µs)."""
    events = [
        LAUNCH,
        runtime_call("cuLaunchKernel", 3, 3, 8, cat="cuda_driver"),
        runtime_call("cuMemAlloc", 20, 2, cat="cuda_driver"),
        runtime_call("cuLaunchKernel", 3, 3, 9, tid=2, cat="cuda_driver"),
        runtime_call("cudaLaunchKernel", 2, 5, 10, tid=3),
        KERNEL,
    ]
    calls = load_profile(trace_file(tmp_path, events)).calls
    assert list(calls.columns) == list(CALL_COLUMNS)
    assert calls[["name", "thread", "start_us", "end_us", "launch_us", "key"]].values.tolist() == [
        ["cudaLaunchKernel", 1, 0.0, 5.0, 5.0, 8], ["cudaLaunchKernel", 3, 0.0, 5.0, 5.0, 10], ["cuLaunchKernel", 2, 1.0, 4.0, 3.0, 9],
        ["cuMemAlloc", 1, 18.0, 20.0, 2.0, -1],
    ]
    assert (calls["wait_stream"] == -1).all() and (calls["wait_key"] == -1).all()  # none of them waits for a stream


@pytest.mark.parametrize("driver_first", [True, False])
def test_a_driver_call_timed_exactly_like_its_runtime_call_is_inside_it(tmp_path, driver_first):
    """cuLaunchKernel and cudaLaunchKernel both [10,15] µs on one thread: the same host time, one launch,
    whichever the file lists first (listed first, the driver call had been taken for the outer one and
    kept: 2 launches a step)."""
    runtime, driver = runtime_call("cudaLaunchKernel", 10, 5, 1), runtime_call("cuLaunchKernel", 10, 5, 2, cat="cuda_driver")
    events = [driver, runtime] if driver_first else [runtime, driver]
    imported = import_profile(load_profile(trace_file(tmp_path, [*events, device_task("k", 20, 3, 1)])))
    assert imported.profile.calls["name"].tolist() == ["cudaLaunchKernel"]
    assert measured_summary(imported)["launches_per_step"] == 1.0


def test_slices_of_one_extent_nest_as_the_caller_says():
    """Slices 0 and 1 both [0,10], slice 2 [2,3]: in the order given, 0 holds 1 (and 1 holds 2); with
    slice 0 marked inner, 1 holds 0, and 0, the innermost, holds 2."""
    start, end = np.array([0.0, 0.0, 2.0]), np.array([10.0, 10.0, 3.0])
    assert top_level(start, end).tolist() == [True, False, False]
    assert top_level(start, end, inner=np.array([True, False, False])).tolist() == [False, True, False]
    order, parent = nesting_parents(start, end, np.array([True, False, False]))
    assert order.tolist() == [1, 0, 2] and parent.tolist() == [-1, 0, 1]


def test_a_rank_not_in_the_trace_is_refused_with_what_it_holds(tmp_path):
    with pytest.raises(ProfileError, match=r"rank 3 is not there \(the trace holds no rank, devices 0\)"):
        load_profile(trace_file(tmp_path, [LAUNCH, KERNEL]), rank=3)
    with pytest.raises(ProfileError, match=r"rank 3 is not there \(the trace holds rank 0, devices 0\)"):
        load_profile(trace_file(tmp_path, [LAUNCH, KERNEL], distributedInfo={"rank": 0}), rank=3)


def test_a_trace_without_host_calls_is_one_window(tmp_path):
    """Device tasks only (the kernel of 5 µs): no host call to split steps by."""
    assert find_windows(load_profile(trace_file(tmp_path, [KERNEL]))) == ("whole", [Window("whole trace", 0.0, 5.0)])


def test_collectives_go_to_the_comm_stream(tmp_path):
    """A step of two kernels on stream 7 and an NCCL all-reduce on stream 9: harness streams 0 and 1."""
    trace = kineto_trace(Layout(steps=1, ops=2))
    trace["traceEvents"] += [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": TID, "ts": 1050, "dur": 3, "args": {"correlation": 500}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": GPU, "tid": 9, "ts": 1054, "dur": 10,
         "args": {"correlation": 500, "stream": 9, "device": GPU}},
    ]
    path = tmp_path / "comm.json"
    path.write_text(json.dumps(trace))
    ops = ops_table(import_profile(load_profile(path)))
    device = ops[ops["stream"].notna()]
    assert device[["kind", "stream"]].values.tolist() == [["vector", 0], ["vector", 0], ["comm", 1]]


def test_text_timestamps_keep_their_fraction(tmp_path):
    """Timestamps written as text, 16 digits and a fraction: the launch at …002.1 µs, its kernel at
    …010.3 µs starts 8.2 µs after it (a float of the whole stamp would keep quarters of a µs only)."""
    events = [{**LAUNCH, "ts": "1704161511422002.1"}, {**KERNEL, "ts": "1704161511422010.3"}]
    profile = load_profile(trace_file(tmp_path, events))
    assert profile.calls[["start_us", "end_us"]].values.tolist() == [[0.0, 5.0]]
    assert profile.tasks[["start_us", "end_us"]].values.tolist() == [[pytest.approx(8.2, abs=1e-9), pytest.approx(13.2, abs=1e-9)]]


def test_trace_streams_map_to_harness_streams():
    """The busiest compute stream is 0, streams of collectives 1, the other streams 2, 3, … in order of
    first use; beyond the last harness stream (15) they share it."""
    from harness.config.limits import MAX_STREAMS  # the harness's streams, which the trace's must fit
    from harness.importers.steps import harness_streams

    def op(stream, kind="vector", device_us=1.0):
        return {"trace_stream": stream, "kind": kind, "device_us": device_us}

    step = types.SimpleNamespace(ops=[op(-1, "host"), op(3), op(7, device_us=50.0), op(9, "comm"), op(4), op(7), op(5)])
    assert harness_streams(None, [step]) == {7: 0, 9: 1, 3: 2, 4: 3, 5: 4}
    many = types.SimpleNamespace(ops=[op(100, device_us=9.0)] + [op(s) for s in range(MAX_STREAMS + 2)])
    mapping = harness_streams(None, [many])
    assert mapping[100] == 0 and [mapping[s] for s in range(MAX_STREAMS + 2)] == list(range(2, MAX_STREAMS)) + [MAX_STREAMS - 1] * 4


def test_ops_of_a_trace_without_framework_ops_by_hand(tmp_path):
    """Two launches (correlation 0 and 1; no framework op around them, so each op is named after its
    kernel) and a blocking cudaMemcpy. Times from the first call (2 µs): launch a [0,5], kernel a [8,13];
    launch b [18,23], kernel b [24,29]; cudaMemcpy [38,53.5] whose copy runs [43,53], so 0.5 µs of the
    call is the sync's own. Framework time is the host time since the previous call."""
    events = [
        runtime_call("cudaLaunchKernel", 2, 5, 0), device_task("void gemm_a<float>(float*)", 10, 5, 0),
        runtime_call("cudaLaunchKernel", 20, 5, 1), device_task("void gemm_b<float>(float*)", 26, 5, 1),
        runtime_call("cudaMemcpy", 40, 15.5, 2), device_task("Memcpy DtoH (Device -> Pageable)", 45, 10, 2, cat="gpu_memcpy"),
    ]
    imported = import_profile(load_profile(trace_file(tmp_path, events)))
    assert imported.rule == "whole" and imported.kept == [0]
    ops = ops_table(imported)
    assert ops[["name", "kind", "device_us", "framework_us", "launch_us", "host_us"]].values.tolist() == [
        ["gemm_a", "cube", 5.0, 0.0, 5.0, 0.0],
        ["gemm_b", "cube", 5.0, 13.0, 5.0, 0.0],
        ["Memcpy DtoH  Pageable", "copy", 10.0, 15.0, 0.0, 0.0],
        ["[sync] cudaMemcpy", "sync", pytest.approx(np.nan, nan_ok=True), 0.0, 0.0, 0.5],
    ]
    assert ops["group"].isna().all() and list(ops["after"]) == ["-", "0", "1", "2"]


def test_events_without_a_duration_last_nothing(tmp_path):
    """A launch, its kernel and a step mark with no `dur` (the mark with no thread either: thread 0);
    times from the mark at 1 µs."""
    launch = {k: v for k, v in LAUNCH.items() if k != "dur"}
    kernel = {k: v for k, v in KERNEL.items() if k != "dur"}
    mark = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "ts": 1}
    profile = load_profile(trace_file(tmp_path, [launch, kernel, mark]))
    assert profile.calls[["start_us", "end_us"]].values.tolist() == [[1.0, 1.0]]
    assert profile.tasks[["start_us", "end_us"]].values.tolist() == [[9.0, 9.0]]
    assert profile.marks.values.tolist() == [[0, 0.0, 0.0, "ProfilerStep#0"]]


@pytest.mark.parametrize("kernel_ts, not_before_us", [(57.0, None), (57.5, 55.5)])
def test_a_kernel_later_than_50_us_after_its_launch_waited_for_unseen_work(tmp_path, kernel_ts, not_before_us):
    """The launch returns at 5 µs (times from its start at 2 µs): a kernel starting 50 µs later is
    explained; 50.5 µs later, it waited for device work the trace does not show, until 55.5 µs."""
    events = [LAUNCH, {**KERNEL, "ts": kernel_ts}]
    ops = ops_table(import_profile(load_profile(trace_file(tmp_path, events))))
    kernel = ops[ops["name"] == "k"]
    assert len(kernel) == 1
    waited = float(kernel["not_before_us"].iloc[0])
    assert waited == pytest.approx(not_before_us) if not_before_us else np.isnan(waited)


def test_a_graph_step_is_the_outermost_annotation_around_its_launch(tmp_path):
    """`decode` [0,100] holds `replay` [45,60], which holds the graph launch at 50 µs: the step is decode's."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "decode", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "replay", "pid": 1, "tid": 1, "ts": 45, "dur": 15},
        {**LAUNCH, "name": "cudaGraphLaunch", "ts": 50, "dur": 3},
        {**KERNEL, "ts": 55},
    ]
    assert find_windows(load_profile(trace_file(tmp_path, events))) == ("graph", [Window("graph launch 0", 0.0, 100.0)])


def piecewise_events(sync_between: bool, annotated: bool) -> list[dict]:
    """Two graph pieces (launches at 10 and 40 µs) with an eagerly launched attention kernel between them
    (at 25 µs), as vLLM V1 runs a step with piecewise graphs; a stream sync at 30 µs when asked, an
    annotation from 5 to 65 µs when asked."""
    events = [
        runtime_call("cudaGraphLaunch", 10, 4, 1), device_task("piece0_gemm", 15, 5, 1), device_task("piece0_norm", 20, 2, 1),
        runtime_call("cudaLaunchKernel", 25, 3, 2), device_task("attention", 28, 6, 2),
        runtime_call("cudaGraphLaunch", 40, 4, 3), device_task("piece1_gemm", 45, 5, 3),
        runtime_call("cudaStreamSynchronize", 60, 2),
    ]
    if sync_between:
        events.append(runtime_call("cudaStreamSynchronize", 30, 5))
    if annotated:
        events.append({"ph": "X", "cat": "user_annotation", "name": "execute_model", "pid": 1, "tid": 1, "ts": 5, "dur": 60})
    return events


@pytest.mark.parametrize("annotated", [False, True])
def test_graph_pieces_with_eager_work_between_them_are_one_step(tmp_path, annotated):
    """Both launches under one annotation, or with no blocking sync between them, are the pieces of one
    step: it holds both pieces and the eager kernel (the importer made a step of each launch, most of them
    empty, and its replay was ten times off a vLLM V1 profile)."""
    profile = load_profile(trace_file(tmp_path, piecewise_events(sync_between=False, annotated=annotated)))
    rule, windows = find_windows(profile)
    expected = (0.0, 60.0) if annotated else (0.0, 52.0)  # µs from the trace's first event (5 or 10)
    assert rule == "graph" and [(w.start_us, w.end_us) for w in windows] == [expected]
    imported = import_profile(profile)
    ops = ops_table(imported)
    devices = ops[ops["kernel"] != ""]
    assert devices["kernel"].tolist() == ["piece0_gemm", "piece0_norm", "attention", "piece1_gemm"]
    assert devices["in_graph"].tolist() == [1, 1, 0, 1]
    measured = measured_summary(imported)
    assert (measured["graph_launches_per_step"], measured["graph_ops_per_step"], measured["launches_per_step"]) == (2, 3, 3)


def test_graph_launches_with_a_blocking_sync_between_them_are_two_steps(tmp_path):
    """The host waited for the first launch's results before the second: two steps, split at the sync."""
    rule, windows = find_windows(load_profile(trace_file(tmp_path, piecewise_events(sync_between=True, annotated=False))))
    assert rule == "graph" and [(w.start_us, w.end_us) for w in windows] == [(0.0, 25.0), (25.0, 52.0)]  # from 10 µs


def test_whole_step_graphs_launched_back_to_back_are_a_step_each(tmp_path):
    """Three launches of one graph (the same kernels), each after a prep kernel, and one sync at the end
    (a host that runs ahead): three steps, not one step of three pieces."""
    events, correlation = [], 1
    for k in range(3):
        t = 100.0 * k
        events += [runtime_call("cudaLaunchKernel", t, 3, correlation), device_task("prep", t + 5, 2, correlation),
                   runtime_call("cudaGraphLaunch", t + 10, 4, correlation + 1), device_task("gemm", t + 15, 20, correlation + 1),
                   device_task("norm", t + 36, 3, correlation + 1)]
        correlation += 2
    events.append(runtime_call("cudaStreamSynchronize", 300, 2))
    rule, windows = find_windows(load_profile(trace_file(tmp_path, events)))
    assert rule == "graph" and len(windows) == 3
    imported = import_profile(load_profile(trace_file(tmp_path, events)))
    assert measured_summary(imported)["graph_launches_per_step"] == 1


def test_unannotated_pieces_before_an_annotated_one_join_its_step(tmp_path):
    """Piece 0 launched outside the annotation, piece 1 inside it, attention between, no sync: one step
    from piece 0's window to the annotation's end, holding the attention launch."""
    events = piecewise_events(sync_between=False, annotated=False)
    events.append({"ph": "X", "cat": "user_annotation", "name": "execute_model", "pid": 1, "tid": 1, "ts": 38, "dur": 30})
    rule, windows = find_windows(load_profile(trace_file(tmp_path, events)))
    assert rule == "graph" and [(w.start_us, w.end_us) for w in windows] == [(0.0, 58.0)]  # from 10 µs to 68 µs
    ops = ops_table(import_profile(load_profile(trace_file(tmp_path, events))))
    assert ops.loc[ops["kernel"] != "", "kernel"].tolist() == ["piece0_gemm", "piece0_norm", "attention", "piece1_gemm"]


def test_entries_that_are_not_events_are_skipped(tmp_path):
    """A number, a string and a duration event with no category in traceEvents (seen in hand-edited
    files) are passed over, not the end of the trace."""
    uncategorised = {"ph": "X", "name": "x", "pid": 1, "tid": 1, "ts": 1, "dur": 1}
    profile = load_profile(trace_file(tmp_path, [7, "note", uncategorised, LAUNCH, KERNEL]))
    assert len(profile.calls) == 1 and len(profile.tasks) == 1


def test_hta_reads_a_kernel_on_stream_1(tmp_path):
    """One kernel of 5 µs on stream 1 (a stream number the importer must not take for 'none'): all of
    HTA's window is compute."""
    kernel = device_task("k", 10, 5, 8, stream=1)
    peer = peer_breakdown(import_profile(load_profile(trace_file(tmp_path, [LAUNCH, kernel]))))
    assert (peer["window_ms"], peer["compute_pct"], peer["idle_pct"]) == (pytest.approx(0.005), 100.0, 0.0)


def test_hta_figures_of_events_shorter_than_a_whole_us(tmp_path):
    """HTA rounds fractional times to whole µs, start up and end down. One kernel [1000.0, 1000.8]: [1000,
    1000], a window of 0 µs: no percentages (it divided by zero). Kernels [1000.2, 1000.7] and [1001.3,
    1001.7] round to [1001, 1000] and [1002, 1001], ending before they start: each lasts 0 µs at its rounded
    start, so the window is 1001 to 1002, 1 µs, all idle (the window had been 0 µs, or negative with
    percentages past 100)."""
    launch = runtime_call("cudaLaunchKernel", 995.5, 4.0, 1)
    one = peer_breakdown(import_profile(load_profile(trace_file(tmp_path, [launch, device_task("k", 1000.0, 0.8, 1)]))))
    assert (one["window_ms"], one["idle_pct"], one["compute_pct"], one["non_compute_pct"]) == (0.0, None, None, None)
    two = [launch, device_task("k", 1000.2, 0.5, 1), runtime_call("cudaLaunchKernel", 996.0, 4.0, 2), device_task("k", 1001.3, 0.4, 2)]
    peer = peer_breakdown(import_profile(load_profile(trace_file(tmp_path, two))))
    assert (peer["window_ms"], peer["idle_pct"], peer["compute_pct"], peer["non_compute_pct"]) == (pytest.approx(0.001), 100.0, 0.0, 0.0)


def test_an_eager_step_is_not_replayed_with_graph_replays_of_the_same_kernels(tmp_path):
    """Step 0 launches kernels a and b one by one; steps 1 and 2 replay them from one graph launch. The
    same kernels, but issued otherwise: step 0 is left out of the op list."""
    def call(name, ts, correlation):
        return runtime_call(name, ts, 3, correlation)

    def kernel(name, ts, correlation):
        return device_task(name, ts, 5, correlation)

    def mark(k, ts):
        return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1, "ts": ts, "dur": 40}

    events = [
        mark(0, 0), call("cudaLaunchKernel", 2, 1), kernel("void a<float>()", 6, 1),
        call("cudaLaunchKernel", 10, 2), kernel("void b<float>()", 14, 2),
        mark(1, 50), call("cudaGraphLaunch", 52, 3), kernel("void a<float>()", 56, 3), kernel("void b<float>()", 62, 3),
        mark(2, 100), call("cudaGraphLaunch", 102, 4), kernel("void a<float>()", 106, 4), kernel("void b<float>()", 112, 4),
    ]
    imported = import_profile(load_profile(trace_file(tmp_path, events)))
    assert (imported.rule, len(imported.found), imported.kept, list(imported.left_out)) == ("profiler", 3, [1, 2], [0])


def test_an_allocation_between_launches_is_the_next_ops_host_time(tmp_path):
    """Launch 1 ends at 5 µs (from 2 µs); a 0.5 µs cudaMalloc at 5.1 µs; launch 2 at 5.8 µs: of the
    0.8 µs between the launches, 0.5 µs are the second op's allocation and 0.3 µs its framework time."""
    malloc = runtime_call("cudaMalloc", 7.1, 0.5)
    second = [runtime_call("cudaLaunchKernel", 7.8, 5, 9), device_task("k", 20, 5, 9)]
    ops = ops_table(import_profile(load_profile(trace_file(tmp_path, [LAUNCH, KERNEL, malloc, *second]))))
    assert ops[["framework_us", "alloc_us", "launch_us"]].values.tolist()[:2] == [[0.0, 0.0, 5.0], pytest.approx([0.3, 0.5, 5.0])]


def test_device_idle_is_split_into_host_and_device_waits_by_hand(tmp_path):
    """One 40 µs step: kernel a [8,13] (launched [2,7]), kernel b [20,25] (launched [9,12], started late by
    something the trace does not show, under the 50 µs that would make it an unseen wait). Idle: [0,8] is
    7 µs of waiting for the host (a was not launched yet) and 1 µs for the device; [13,20], b was ready:
    7 µs device wait; [25,40] after the last kernel: 15 µs host. On the critical path: framework
    2 + 15 µs, launch 5 µs, compute 10 µs busy, and the 8 µs of device wait on the device's front end."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 40},
        LAUNCH, {**KERNEL, "ts": 8},
        runtime_call("cudaLaunchKernel", 9, 3, 9), device_task("k", 20, 5, 9),
    ]
    measured = measured_summary(import_profile(load_profile(trace_file(tmp_path, events))))
    expected = {"step_ms_mean": 0.040, "device_busy": 10 / 40, "idle_host_wait_ms": 0.022, "idle_device_wait_ms": 0.008,
                "idle_host_wait_share": 22 / 30, "breakdown_framework": 17 / 40, "breakdown_launch": 5 / 40, "breakdown_compute": 10 / 40,
                "breakdown_front_end": 8 / 40}
    assert {key: measured[key] for key in expected} == pytest.approx(expected)


def test_union_of_intervals():
    """[0,2] and [1,3] overlap, [3,4] touches them (one busy piece), [5,6] stands alone; none: none."""
    from harness.importers.measure import union

    assert union(np.array([[5.0, 6.0], [1.0, 3.0], [0.0, 2.0], [3.0, 4.0]])).tolist() == [[0.0, 4.0], [5.0, 6.0]]
    assert union(np.zeros((0, 2))).shape == (0, 2)
