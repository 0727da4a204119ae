"""Edges of the importers' core (harness/importers/steps.py), each on a tiny trace built here and worked out
by hand: the host time a blocking copy or sync spends waiting and then on its own, which stream an event
sync waits for, which step device work no call issued belongs to at a step's very start or end, where a
sync-split trace's last step ends, annotation names holding '=', graph groups that start at op 0, the
fallback of a kernel's short name, and when device work no call issued must have been issued.

Times are µs from the trace's first event (the importer's clock); `runtime_call` and `device_task` write
Kineto events at those times (tests/synthetic_trace.py).
"""
from __future__ import annotations

import pandas as pd
import pytest

from harness.importers import load_profile
from harness.importers.measure import measured_summary
from harness.importers.steps import Window, find_windows, import_profile, ops_table, short_name
from synthetic_trace import device_task, runtime_call, trace_file

PAGEABLE_COPY = "Memcpy DtoH (Device -> Pageable)"


def annotation(name: str, ts: float, dur: float) -> dict:
    """A user annotation (record_function) on thread 1 of process 1, the thread `runtime_call` issues on."""
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def imported_from(tmp_path, events: list, rule: str = "auto"):
    return import_profile(load_profile(trace_file(tmp_path, events)), rule)


# ---------------------------------------------------------------- blocking copies and syncs


def test_a_blocking_copy_and_a_stream_sync_wait_first_then_spend_their_own_time(tmp_path):
    """Kernel k [5,15] (launched [0,5]); cudaMemcpy [6,18] whose copy runs [15,17] behind k; kernel k2
    [22,30] (launched [20,22]); cudaStreamSynchronize [23,33]. The whole trace is the step, [0,33].
    The copy call waits from its start to its copy's end, 17 - 6 = 11 µs, then spends 18 - 17 = 1 µs of its
    own; the sync waits for k2, 30 - 23 = 7 µs, then 33 - 30 = 3 µs. Between the calls: framework time
    [5,6], [18,20], [22,23]. Waiting: 11 + 7 = 18 µs; the syncs' own time 1 + 3 = 4 µs."""
    events = [
        runtime_call("cudaLaunchKernel", 0, 5, 1), device_task("k", 5, 10, 1),
        runtime_call("cudaMemcpy", 6, 12, 2), device_task(PAGEABLE_COPY, 15, 2, 2, cat="gpu_memcpy"),
        runtime_call("cudaLaunchKernel", 20, 2, 3), device_task("k2", 22, 8, 3),
        runtime_call("cudaStreamSynchronize", 23, 10),
    ]
    imported = imported_from(tmp_path, events)
    step = imported.found[0]
    assert step.main_segments == [
        (0.0, 5.0, "launch"), (5.0, 6.0, "framework"), (6.0, 17.0, "sync_wait"), (17.0, 18.0, "sync"),
        (18.0, 20.0, "framework"), (20.0, 22.0, "launch"), (22.0, 23.0, "framework"), (23.0, 30.0, "sync_wait"), (30.0, 33.0, "sync"),
    ]
    assert step.sync_wait_us == 18.0
    measured = measured_summary(imported)
    assert (measured["host_ms_sync_wait"], measured["host_ms_sync"]) == (pytest.approx(0.018), pytest.approx(0.004))


def test_a_blocking_copy_whose_copy_the_trace_shows_done_before_the_call_waited_nothing(tmp_path):
    """A device clock behind the host's: the cudaMemcpy call [10,16] and its copy recorded at [5,7], done
    before the call began (times from the copy's 5 µs: the copy [0,2], the call [5,11], the step [5,11]).
    The call waited max(0, 2 - 5) = 0 µs: all of its 6 µs are the sync's own time, none is waiting."""
    events = [runtime_call("cudaMemcpy", 10, 6, 2), device_task(PAGEABLE_COPY, 5, 2, 2, cat="gpu_memcpy")]
    imported = imported_from(tmp_path, events)
    step = imported.found[0]
    assert [(op["name"], op["host_us"]) for op in step.ops] == [("Memcpy DtoH  Pageable", 0.0), ("[sync] cudaMemcpy", 6.0)]
    assert step.sync_wait_us == 0.0 and step.main_segments == [(5.0, 11.0, "sync")]
    measured = measured_summary(imported)
    assert (measured["host_ms_sync"], measured["host_ms_sync_wait"]) == (pytest.approx(0.006), 0.0)


def test_an_event_sync_on_stream_0_waits_for_stream_0_alone(tmp_path):
    """Stream 0 is a stream (HIP's null stream), not 'unknown'. Kernel on_stream0 [4,10] on stream 0 and
    kernel on_stream7 [8,30] on stream 7; cudaEventSynchronize [12,13] for an event recorded on stream 0
    (its cuda_sync row: wait_on_stream 0). It waits for op 0 alone, which ended at 10 before the call
    began: no wait, 1 µs of its own. Not for stream 7's kernel, running until 30 (that would have made
    the whole call a wait and the sync depend on ops 0 and 1). Then host time to the step's end, 30 - 13."""
    events = [
        runtime_call("cudaLaunchKernel", 0, 3, 1), device_task("on_stream0", 4, 6, 1, stream=0),
        runtime_call("cudaLaunchKernel", 4, 3, 2), device_task("on_stream7", 8, 22, 2),
        runtime_call("cudaEventSynchronize", 12, 1, 3),
        {"ph": "X", "cat": "cuda_sync", "name": "Event Sync", "pid": 0, "tid": 0, "ts": 12, "dur": 1,
         "args": {"correlation": 3, "stream": -1, "wait_on_stream": 0, "wait_on_cuda_event_record_corr_id": -1}},
    ]
    ops = ops_table(imported_from(tmp_path, events))
    assert ops[["name", "after", "host_us"]].values.tolist() == [
        ["on_stream0", "-", 0.0], ["on_stream7", "-", 0.0], ["[sync] cudaEventSynchronize", "0", 1.0], ["[host]", "-", 17.0],
    ]


# ---------------------------------------------------------------- device work no call issued


def two_profiler_steps(stray: dict) -> list[dict]:
    """ProfilerStep#0 [0,20] launches k ([2,5], kernel [6,10]); ProfilerStep#1 [20,40] launches k again
    ([22,25], kernel [26,30]); `stray` is device work no call of the trace issued."""
    return [
        annotation("ProfilerStep#0", 0, 20), runtime_call("cudaLaunchKernel", 2, 3, 1), device_task("k", 6, 4, 1),
        annotation("ProfilerStep#1", 20, 20), runtime_call("cudaLaunchKernel", 22, 3, 2), device_task("k", 26, 4, 2),
        stray,
    ]


@pytest.mark.parametrize(
    "stray_at, ops_by_step",
    [
        (19.0, [["k", "[unlinked] stray", "[host]"], ["k", "[host]"]]),  # starts inside step 0: step 0's
        (20.0, [["k", "[host]"], ["[unlinked] stray", "k", "[host]"]]),  # starts as step 0 ends and step 1 opens: step 1's alone
    ],
)
def test_device_work_no_call_issued_belongs_to_the_one_step_it_starts_in(tmp_path, stray_at, ops_by_step):
    """A 1 µs kernel with a correlation no call holds, starting at 19 or at 20 µs, where step 0 [0,20] ends
    and step 1 [20,40] begins: a window holds its start, not its end, so the kernel is in exactly one step
    (at 20, counted in both, its time would be in both). It comes in issue order: after step 0's k (issued at
    2), before step 1's k (issued at 22). Each step ends with host time from its last launch's end."""
    imported = imported_from(tmp_path, two_profiler_steps(device_task("stray", stray_at, 1, 99)))
    assert imported.rule == "profiler"
    assert [[op["name"] for op in step.ops] for step in imported.found] == ops_by_step


@pytest.mark.parametrize(
    "ends_at, ops",
    [
        (10.0, [("k", 4.0), ("[host]", 0.0)]),  # ended as the step began: ran before it, none of its work
        (11.0, [("[launched before] before", 1.0), ("k", 4.0), ("[host]", 0.0)]),  # ran 1 µs into the step
    ],
)
def test_device_work_launched_before_the_first_step_counts_only_for_the_time_it_runs_inside(tmp_path, ends_at, ops):
    """A kernel no call issued, [0, 10] or [0, 11], before ProfilerStep#0 [10,30] (which launches k [16,20]
    in [12,15]): ending exactly as the step opens it is no work of the step; ending 1 µs later, the step
    carries in its last 1 µs (device_us 11 - 10), first in issue order."""
    events = [device_task("before", 0, ends_at, 99), annotation("ProfilerStep#0", 10, 20),
              runtime_call("cudaLaunchKernel", 12, 3, 1), device_task("k", 16, 4, 1)]
    imported = imported_from(tmp_path, events)
    assert [[(op["name"], op["device_us"]) for op in step.ops] for step in imported.found] == [ops]


def test_device_work_no_call_issued_was_issued_before_the_sync_that_waited_for_it(tmp_path):
    """Kernel a [4,10] (launched [0,3]); cudaStreamSynchronize [12,41], waiting for every stream (no
    cuda_sync row names one); a kernel no call issued, stray [30,40], on a's stream. The sync returned
    after stray ended, so stray was issued by the time the sync began, 12 µs (not at its start, 30):
    it comes before the sync (ties at one time: device work first), after a on their stream, and the sync
    waits for it: 40 - 12 = 28 µs of waiting, 41 - 40 = 1 µs of its own, after 12 - 3 = 9 µs of framework
    time. Issued at 30 instead, the sync would come first and wait for a alone (done at 10): 29 µs its own."""
    events = [runtime_call("cudaLaunchKernel", 0, 3, 1), device_task("a", 4, 6, 1),
              runtime_call("cudaStreamSynchronize", 12, 29, 2), device_task("stray", 30, 10, 99)]
    imported = imported_from(tmp_path, events)
    ops = ops_table(imported)
    assert ops[["name", "after", "framework_us", "host_us"]].values.tolist() == [
        ["a", "-", 0.0, 0.0], ["[unlinked] stray", "0", 0.0, 0.0], ["[sync] cudaStreamSynchronize", "1", 9.0, 1.0],
    ]
    assert [op["ready_us"] for op in imported.found[0].ops[:2]] == [3.0, 12.0]
    assert imported.found[0].sync_wait_us == 28.0


# ---------------------------------------------------------------- step rules


def test_every_device_wide_sync_ends_a_step_the_last_one_too(tmp_path):
    """Launch [0,2] of a [3,8], cudaDeviceSynchronize [4,10]; launch [12,14] of a [15,20],
    cudaDeviceSynchronize [16,22]: step 0 from the first call to the first sync's end, step 1 from there
    to the second sync's end."""
    events = [runtime_call("cudaLaunchKernel", 0, 2, 1), device_task("a", 3, 5, 1), runtime_call("cudaDeviceSynchronize", 4, 6),
              runtime_call("cudaLaunchKernel", 12, 2, 2), device_task("a", 15, 5, 2), runtime_call("cudaDeviceSynchronize", 16, 6)]
    assert find_windows(load_profile(trace_file(tmp_path, events))) == ("sync", [Window("sync 0", 0.0, 10.0), Window("sync 1", 10.0, 22.0)])


@pytest.mark.parametrize(
    "rule, windows",
    [
        ("mark=phase=decode", [("phase=decode", 10.0, 20.0), ("phase=decode", 20.0, 30.0)]),  # each occurrence's extent
        ("from=phase=decode", [("phase=decode", 10.0, 20.0), ("phase=decode", 20.0, 23.0)]),  # the last to the last call's end
    ],
)
def test_an_annotation_name_may_hold_an_equals_sign(tmp_path, rule, windows):
    """Annotations phase=prefill [0,10], phase=decode [10,20] and [20,30], each launching a kernel ([1,3],
    [11,13], [21,23]). Everything after the rule's first '=' is the name, 'phase=decode': its two
    occurrences are the steps, not the prefill (which 'phase' alone would take, as every name it begins)."""
    events = [
        annotation("phase=prefill", 0, 10), runtime_call("cudaLaunchKernel", 1, 2, 1), device_task("p", 3, 4, 1),
        annotation("phase=decode", 10, 10), runtime_call("cudaLaunchKernel", 11, 2, 2), device_task("d", 13, 4, 2),
        annotation("phase=decode", 20, 10), runtime_call("cudaLaunchKernel", 21, 2, 3), device_task("d", 23, 4, 3),
    ]
    applied, found = find_windows(load_profile(trace_file(tmp_path, events)), rule)
    assert applied == rule and [(w.label, w.start_us, w.end_us) for w in found] == windows


@pytest.mark.parametrize("sync_at", [39.0, 40.0])
def test_a_zero_length_sync_just_before_the_next_graph_launch_ends_the_step(tmp_path, sync_at):
    """Graph launch [0,4] replaying a [5,9]; cudaStreamSynchronize of no length at `sync_at` on the launching
    thread; the next graph launch [40,44] replaying a [45,49]; cudaStreamSynchronize [44,52]. The first
    sync came before the second launch whether it is recorded 1 µs earlier or at the very µs the launch
    starts (a thread's calls run one after another): two steps, the first ending at the sync. It was one
    step [0,52] at 40: a sync starting when the next launch does was counted as after it."""
    events = [runtime_call("cudaGraphLaunch", 0, 4, 1), device_task("a", 5, 4, 1),
              runtime_call("cudaStreamSynchronize", sync_at, 0),
              runtime_call("cudaGraphLaunch", 40, 4, 2), device_task("a", 45, 4, 2),
              runtime_call("cudaStreamSynchronize", 44, 8)]
    applied, found = find_windows(load_profile(trace_file(tmp_path, events)))
    assert applied == "graph"
    assert [(w.start_us, w.end_us) for w in found] == [(0.0, sync_at), (sync_at, 52.0)]
    # The sync is the first step's last op, not the second's first: both steps hold the same ops.
    steps = imported_from(tmp_path, events).found
    assert [[op["name"] for op in step.ops] for step in steps] == [["a", "[sync] cudaStreamSynchronize"]] * 2


@pytest.mark.parametrize("generate_ends_at", [30.0, 31.0])
def test_the_last_step_ends_with_an_annotation_around_it_that_ends_with_it_too(tmp_path, generate_ends_at):
    """--steps from=decode: generate [0, generate_ends_at] around decode [5,15] and [15,30] (launches at 6
    and 16), then a launch [31,35] outside them. The last step ends with the annotation around the last
    decode, at its end: 30 or 31, without the later launch either way. At 30 (sharing the decode's end,
    which nests as slices sharing an end do) it was not taken as around, and the step ran on to the last
    call's end, 35."""
    events = [annotation("generate", 0, generate_ends_at),
              annotation("decode", 5, 10), runtime_call("cudaLaunchKernel", 6, 2, 1), device_task("k", 8, 2, 1),
              annotation("decode", 15, 15), runtime_call("cudaLaunchKernel", 16, 2, 2), device_task("k", 18, 2, 2),
              runtime_call("cudaLaunchKernel", 31, 4, 3), device_task("post", 35, 2, 3)]
    applied, found = find_windows(load_profile(trace_file(tmp_path, events)), "from=decode")
    assert [(w.start_us, w.end_us) for w in found] == [(5.0, 15.0), (15.0, generate_ends_at)]


# ---------------------------------------------------------------- the op list


def test_a_graph_launched_first_in_its_step_is_group_0_in_the_op_list(tmp_path):
    """A graph launch [0,4] replaying a [5,10] and b [10,13], then a launch [5,7] of c [13,15]: the step's
    ops 0 and 1 are the graph's, group 0 (the index of its first op, a number like any other), and c is
    in no group (an empty cell)."""
    events = [runtime_call("cudaGraphLaunch", 0, 4, 1), device_task("a", 5, 5, 1), device_task("b", 10, 3, 1),
              runtime_call("cudaLaunchKernel", 5, 2, 2), device_task("c", 13, 2, 2)]
    ops = ops_table(imported_from(tmp_path, events))
    assert ops["name"].tolist() == ["a", "b", "c"] and ops["in_graph"].tolist() == [1, 1, 0]
    assert ops["group"].isna().tolist() == [False, False, True]
    assert ops["group"].dropna().tolist() == [0, 0] and isinstance(ops["group"].dtype, pd.Int64Dtype)


def test_a_kernel_name_with_nothing_left_after_its_last_scope_falls_back_to_its_first_80_characters():
    """'void ' + 80 x + '::(anonymous namespace)': without 'void ' and the parenthesised part, the text
    ends in '::', so its last scope is empty: the short name is the kernel's own first 80 characters,
    'void ' and 75 x."""
    kernel = "void " + "x" * 80 + "::(anonymous namespace)"
    assert short_name(kernel) == "void " + "x" * 75
