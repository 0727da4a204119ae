"""Importing real profiler traces: reading, linking, steps, measured numbers, the op list, its replay.

Nine traces in tests/data/traces were recorded by others (see its README). Their reference
figures (device busy, HolisticTraceAnalysis 0.5's temporal and idle-time breakdowns, kernels
linked) come from the shared trace collection's README; the tests check the importer against them
and the replay of each op list against what the trace measured. Three more were recorded for this
project on an H200 (benchmarks/record_traces.py): eager and CUDA-graph replay of one decoder.
"""
from __future__ import annotations

import copy
import gzip
import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import compose_run
from harness.importers import ProfileError, load_profile
from harness.importers.steps import find_windows, import_profile, ops_table
from harness.model.ops_csv import write_ops_table
from harness.importers.events import (
    CALL_ALLOC,
    CALL_COPY,
    CALL_COPY_SYNC,
    CALL_GRAPH,
    CALL_LAUNCH,
    CALL_OTHER,
    CALL_RECORD,
    CALL_SYNC,
    CALL_TILING,
    CALL_WAIT,
    TASK_COMM,
    TASK_KERNEL,
)
from harness.importers.kineto import call_kind
from harness.importers.measure import linkage, measured_summary, peer_breakdown, step_table, union
from harness.cli.profile import describe, replay_overrides
from harness.sim.simulate import simulate_run
from harness.model.workload import build_workload
from synthetic_trace import GPU, LAUNCH, PID, TID, Layout, device_task, expected_step_us, kineto_trace, runtime_call, trace_file

TRACES = Path(__file__).parent / "data" / "traces"

# From the shared collection's README: device busy (union of device tasks over the first start to the
# last end), HTA idle % / compute %, HTA idle host wait / kernel wait (µs, summed over streams; None:
# not reported), kernels linked / kernels (Ascend: hardware tasks).
REFERENCE = {
    "tl_vllm_decode_fullgraph_amd": (0.9976, 4.26, 95.42, None, 458.0, (425, 425)),
    # Measured here (HTA was not run on it): 413 kernels and 10 copies.
    "tl_vllm_prefilldecode_piecewise_mi300": (0.9976, None, None, None, None, (413, 413)),
    "tl_sglang_qwen3_decode_mi300": (0.0206, 98.05, 1.94, 465987.0, 558.0, (555, 555)),
    "tl_qwen05b_mi300": (0.9146, 11.76, 88.24, 3424.0, 1936.0, (1053, 1516)),
    # Measured here (HTA was not run on it): the same HF forward on an H100; 1,465 kernels and 241 memsets.
    "tl_qwen05b_h100": (0.9193, None, None, None, None, (1029, 1465)),
    "hta_event_sync_multistream_a100": (0.0191, 98.08, 1.90, 32.0, 30.0, (3, 3)),
    "hta_gpu_annot_gp100": (0.0376, 96.24, 3.75, 7446.0, None, (130, 130)),
    "hta_alexnet_a100": (0.0051, 99.49, 0.08, 24866725.0, 107.0, (79, 79)),
    "ascend_msprof_analyze_ut": (0.1589, None, None, None, None, (274, 276)),
    # Recorded here (benchmarks/record_traces.py; HTA not run): 8 decode steps of 1,309 kernels each
    # (the graph trace also holds kernels of the profiler's warm-up steps).
    "h200_qwen25_7b_eager_b1": (0.1887, None, None, None, None, (10472, 10472)),
    "h200_qwen25_7b_graph_b1": (0.8144, None, None, None, None, (10488, 10488)),
    "h200_qwen25_7b_graph_b8": (0.8165, None, None, None, None, (10472, 10472)),
}
# How auto splits each trace: rule, steps found, steps replayed.
STEPS = {
    "tl_vllm_decode_fullgraph_amd": ("graph", 1, [0]),
    "tl_vllm_prefilldecode_piecewise_mi300": ("graph", 1, [0]),  # 25 pieces under one annotation
    "tl_sglang_qwen3_decode_mi300": ("graph", 1, [0]),
    "tl_qwen05b_mi300": ("profiler", 1, [0]),
    "tl_qwen05b_h100": ("profiler", 1, [0]),
    "hta_event_sync_multistream_a100": ("sync", 1, [0]),
    "hta_gpu_annot_gp100": ("from=Optimizer.zero_grad#SGD.zero_grad", 5, [0, 1, 2, 3]),
    "hta_alexnet_a100": ("sync", 3, [2]),
    "ascend_msprof_analyze_ut": ("profiler", 1, [0]),
    "h200_qwen25_7b_eager_b1": ("profiler", 8, list(range(8))),
    "h200_qwen25_7b_graph_b1": ("profiler", 8, list(range(8))),
    "h200_qwen25_7b_graph_b8": ("profiler", 8, list(range(8))),
}
REPLAY_TOLERANCE = 0.10  # replaying a trace must reproduce its step span and device busy within ±10 %


def trace(name: str) -> Path:
    return TRACES / f"{name}.json.gz"


@pytest.fixture(scope="module")
def imported():
    return {name: import_profile(load_profile(trace(name))) for name in REFERENCE}


# ---------------------------------------------------------------- reading and linking


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_device_busy_as_recorded_matches_the_reference(name):
    tasks = load_profile(trace(name)).tasks
    pieces = union(tasks[["start_us", "end_us"]].to_numpy())
    busy = (pieces[:, 1] - pieces[:, 0]).sum() / (tasks["end_us"].max() - tasks["start_us"].min())
    assert busy == pytest.approx(REFERENCE[name][0], abs=6e-4)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_kernels_linked_to_their_launch(name, imported):
    profile = imported[name].profile
    kernels = profile.tasks[profile.tasks["kind"].isin([TASK_KERNEL, TASK_COMM])] if profile.source == "kineto" else profile.tasks
    launches = profile.calls[profile.calls["kind"].isin([CALL_LAUNCH, CALL_GRAPH, CALL_COPY, CALL_COPY_SYNC]) & (profile.calls["key"] >= 0)]
    linked = int(kernels["key"].isin(set(launches["key"])).sum())
    assert (linked, len(kernels)) == REFERENCE[name][5]


@pytest.mark.parametrize("name", [n for n, ref in REFERENCE.items() if ref[1] is not None])
def test_idle_compute_split_agrees_with_hta(name, imported):
    """The issue asks for 1 percentage point; the recomputation follows HTA's definitions exactly."""
    peer = peer_breakdown(imported[name])
    _, idle, compute, host_wait, kernel_wait, _ = REFERENCE[name]
    assert abs(peer["idle_pct"] - idle) <= 0.01 and abs(peer["compute_pct"] - compute) <= 0.01
    # HTA links a kernel without a launch to the file's first event (a quirk we do not copy): up to 7 µs
    # of qwen05b's idle time moves between host wait and kernel wait.
    if host_wait is not None:
        assert peer["idle_host_wait_us"] == pytest.approx(host_wait, abs=10)
    if kernel_wait is not None:
        assert peer["idle_kernel_wait_us"] == pytest.approx(kernel_wait, abs=10)


def test_hta_does_not_read_the_ascend_format(imported):
    assert peer_breakdown(imported["ascend_msprof_analyze_ut"]) is None


@pytest.mark.parametrize("name, preset", [("h200_qwen25_7b_eager_b1", "h200"), ("tl_qwen05b_mi300", "mi300x"), ("hta_alexnet_a100", "a100"),
                                          ("hta_gpu_annot_gp100", "h100")])
def test_a_replay_runs_on_the_preset_of_the_traces_device(name, preset, imported, tmp_path):
    """Graph capture costs and the like come from the preset of the device the trace names (h100 where no
    shipped preset is for it: a Quadro GP100)."""
    assert f"hardware={preset}" in replay_overrides(imported[name], tmp_path / "ops.csv")


def test_ascend_trace_is_the_async_dispatch_of_the_harness(imported, tmp_path):
    im = imported["ascend_msprof_analyze_ut"]
    assert im.profile.source == "torch_npu" and im.profile.dispatch == "async"
    overrides = replay_overrides(im, tmp_path / "ops.csv")
    assert "strategy=async" in overrides and "strategy.queue_capacity=4096" in overrides and "hardware=atlas_a2" in overrides
    ops = ops_table(im)
    launched = ops[ops["launch_us"] > 0]
    # The Dequeue on the launch thread is the launch; the Enqueue on the Python thread is framework time.
    assert len(launched) == int((im.profile.calls["kind"] == CALL_LAUNCH).sum()) == 146
    # Each launch stands where its op was enqueued (two Python threads), not on the launch thread (439084).
    calls = im.profile.calls
    assert calls[calls["kind"] == CALL_LAUNCH].groupby("thread").size().to_dict() == {437675: 113, 439228: 33}
    # Calls outside any framework op: the launch thread's own 51 (no Python ops there) and one sync.
    outside = calls[calls["op"] == ""]
    assert outside.groupby(["kind", "thread"]).size().to_dict() == {(CALL_OTHER, 439085): 51, (CALL_SYNC, 437675): 1}
    assert (launched["framework_us"] > 0).all()
    assert ops["tiling_us"].sum() > 0  # aclnn*GetWorkspaceSize on the Python thread
    # Every tiling query and allocation call of the step is host time of some op, whole: the host time
    # around them always holds them here.
    calls, window = im.profile.calls, im.found[0].window
    inside = calls[(calls["start_us"] >= window.start_us) & (calls["end_us"] <= window.end_us)]
    for kind, column in ((CALL_TILING, "tiling_us"), (CALL_ALLOC, "alloc_us")):
        mine = inside[inside["kind"] == kind]
        assert len(mine) > 0 and ops[column].sum() == pytest.approx((mine["end_us"] - mine["start_us"]).sum())


def test_an_async_traces_critical_path_waits_for_the_launch_thread_as_its_replay_does(imported, tmp_path):
    """torch_npu's task queue: while the device waits for the host, it waits for the launch thread's
    Dequeue first, and for the Python threads only where that thread was not launching. The measured
    path gave framework 80 % and launch 0 % (the Python threads' segments alone) where the replay of the
    same op list gives launch 59 %, framework 34 %; now launch 55 %, framework 29 %."""
    im = imported["ascend_msprof_analyze_ut"]
    measured, replayed = measured_summary(im), replay(im, tmp_path)
    assert measured["breakdown_launch"] > 0.5 and replayed["breakdown_launch"] > 0.5
    for category in ("launch", "framework"):
        assert measured[f"breakdown_{category}"] == pytest.approx(replayed[f"breakdown_{category}"], abs=0.06), category
    # The path still covers the step: its shares sum to one.
    assert sum(v for k, v in measured.items() if k.startswith("breakdown_")) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("name", sorted(STEPS))
def test_auto_steps(name, imported):
    rule, found, kept = STEPS[name]
    im = imported[name]
    assert (im.rule, len(im.found), im.kept) == (rule, found, kept)


def test_explicit_step_rules():
    gp100 = load_profile(trace("hta_gpu_annot_gp100"))
    rule, windows = find_windows(gp100, "mark=Optimizer.step")
    assert rule == "mark=Optimizer.step" and len(windows) == 5
    assert all(w.end_us - w.start_us < 200 for w in windows)  # the annotation's own extent
    assert len(find_windows(gp100, "whole")[1]) == 1
    with pytest.raises(ProfileError, match="no 'ProfilerStep#N' annotation"):
        find_windows(gp100, "profiler")
    with pytest.raises(ProfileError, match="not a rule"):
        find_windows(gp100, "bogus")
    # --keep 1:3 of the 5 steps found: steps 1 and 2 by their numbers in the trace (it had renumbered them
    # 0 and 1 and dropped the others: "2 replayed of 2 found").
    im = import_profile(gp100, "from=Optimizer.zero_grad", keep=slice(1, 3))
    assert len(im.found) == 5 and im.kept == [1, 2]
    assert im.left_out == {0: "outside --keep", 3: "outside --keep", 4: "outside --keep"}


# ---------------------------------------------------------------- the op list and its replay


def replay(im, tmp_path: Path) -> dict:
    path = tmp_path / "ops.csv"
    write_ops_table(ops_table(im), path)
    return simulate_run(compose_run(*replay_overrides(im, path), "tracking.enabled=false")).summary


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_replay_reproduces_what_the_trace_measured(name, imported, tmp_path):
    """The harness's first check against measurements nobody here chose (README table)."""
    measured = measured_summary(imported[name])
    replayed = replay(imported[name], tmp_path)
    assert replayed["step_ms_mean"] == pytest.approx(measured["step_ms_mean"], rel=REPLAY_TOLERANCE)
    assert replayed["device_busy"] == pytest.approx(measured["device_busy"], rel=REPLAY_TOLERANCE)
    assert replayed["bound"] == measured["bound"]


def test_a_profiles_p99_over_few_steps_says_so_as_a_runs_does(imported):
    """profile.json gave step_ms_p99 over 1, 2 or 8 steps with no note, where a run says its p99 is about
    the maximum of fewer than 20 steps."""
    hf = measured_summary(imported["tl_qwen05b_mi300"])
    assert hf["steps_measured"] == 1 and hf["step_ms_p99"] == hf["step_ms_mean"]
    assert hf["steps_note"] == "step p99 over 1 measured step(s), fewer than 20: about their maximum (a trace of more steps for a tail)"


def test_a_step_that_waits_for_work_outside_the_trace_says_how_much_work_is_its_own(imported):
    """SGLang's decode step measures 473.8 ms, 98 % of it waiting for work outside the trace: its device
    work, the union of its 558 tasks, is 9.773 ms, the figure a prediction of the device compares with
    (the MI300X claim in conf/claims.yaml); a step with no such wait does not print the line."""
    sglang, hf = measured_summary(imported["tl_sglang_qwen3_decode_mi300"]), measured_summary(imported["tl_qwen05b_mi300"])
    assert sglang["device_work_ms"] == pytest.approx(9.773, abs=5e-4)
    assert sglang["device_work_ms"] == pytest.approx(sglang["step_ms_mean"] * sglang["device_busy"])

    def record(im, measured):
        return {"trace": im.profile.path, "source": im.profile.source, "device": im.profile.device, "dispatch": im.profile.dispatch,
                "steps_replayed": im.kept, "steps_found": len(im.found), "steps_rule": im.rule, "linkage": linkage(im), **measured}

    assert "device work  9.773 ms a step; 98% of the critical path" in describe(record(imported["tl_sglang_qwen3_decode_mi300"], sglang))
    assert "  device work  " not in describe(record(imported["tl_qwen05b_mi300"], hf))


def test_op_list_round_trips_through_the_csv_reader(imported, tmp_path):
    im = imported["hta_gpu_annot_gp100"]
    table = ops_table(im)
    path = tmp_path / "ops.csv"
    write_ops_table(table, path)
    workload = build_workload(compose_run("workload=trace", f"workload.path={path}").workload)
    per_step = len(table) // len(im.kept)
    assert workload.steps == len(im.kept) and workload.n_ops == per_step
    assert workload.op_names == table["name"].iloc[:per_step].tolist()
    assert not workload.step_io and workload.host_cost_us.shape == (workload.steps, per_step, 7)
    launch = workload.host_cost_us[:, :, 4]
    assert np.allclose(launch.ravel(), table["launch_us"].to_numpy(), atol=1e-3)
    device = table["device_us"].fillna(0).to_numpy().reshape(workload.steps, per_step)
    assert np.allclose(np.nan_to_num(workload.device_us), device, atol=1e-3)


def test_a_copy_call_that_returns_only_once_its_copy_is_done_is_a_copy_and_a_wait(imported):
    """tensor.to("cpu") into pageable memory: cudaMemcpyAsync returns only once its copy is done, in the
    H200 graph trace ~6.7 ms after the call, behind the replayed graph. That is a copy and a wait for it
    (no launch cost), so the replay's critical path is the device's, as the trace's is; taken as 6.7 ms of
    launching, the replay said host-bound."""
    table = ops_table(imported["h200_qwen25_7b_graph_b1"])
    copies = table[table["kernel"].str.startswith("Memcpy DtoH (Device -> Pageable)")]
    assert len(copies) == 8 and (copies["launch_us"] == 0).all()
    waits = table[table["name"] == "[sync] cudaMemcpyAsync"]
    assert len(waits) == 8 and (waits.index.to_numpy() == copies.index.to_numpy() + 1).all()  # each right after its copy
    assert (waits["host_us"] < 20).all()  # the call's own time after the copy: the 6.7 ms were the wait


@pytest.mark.parametrize("copy, blocking", [("Memcpy DtoH (Device -> Pageable)", True), ("Memcpy DtoD (Device -> Device)", False),
                                             ("Memcpy HtoD (Pageable -> Device)", False)])
def test_only_a_copy_into_pageable_host_memory_is_a_wait_when_its_call_outlasts_it(tmp_path, copy, blocking):
    """A kernel [10, 40] µs, then a cudaMemcpyAsync call [8, 45] µs whose 2 µs copy runs at [41, 43]: into
    pageable host memory the call waited for it (CUDA returns once the copy is done), so the op list holds
    the copy with no launch cost and a wait; any other copy that ends before its call returns was only
    quick, and its 37 µs stay launch time."""
    events = [runtime_call("cudaLaunchKernel", 2, 5, 1), device_task("k", 10, 30, 1),
              runtime_call("cudaMemcpyAsync", 8, 37, 2), device_task(copy, 41, 2, 2, cat="gpu_memcpy")]
    table = ops_table(import_profile(load_profile(Path(trace_file(tmp_path, events))), "whole"))
    copy_row = table[table["kernel"] == copy].iloc[0]
    waits = table[table["name"] == "[sync] cudaMemcpyAsync"]
    if blocking:
        assert copy_row["launch_us"] == 0 and len(waits) == 1 and waits["host_us"].iloc[0] == pytest.approx(2.0)
    else:
        assert copy_row["launch_us"] == pytest.approx(37.0) and waits.empty


def test_graph_launch_replays_as_one_launch_and_a_group(imported):
    table = ops_table(imported["tl_vllm_decode_fullgraph_amd"])
    graph = table[table["in_graph"] == 1]
    assert len(graph) == 421 and graph["group"].nunique() == 1
    leader = int(graph["group"].iloc[0])
    assert table.loc[leader, "launch_us"] > 400  # hipGraphLaunch took ~507 µs of host time
    assert (graph.drop(index=leader)[["framework_us", "launch_us"]] == 0).all().all()


def test_device_work_the_trace_did_not_launch_is_carried_in(imported):
    qwen = ops_table(imported["tl_qwen05b_mi300"])
    carried = qwen[qwen["carried_in"] == 1]
    assert len(carried) == 463 - 7  # seven of the 463 ran entirely before ProfilerStep#6 opened
    assert (carried[["framework_us", "launch_us"]] == 0).all().all()
    sync = qwen[qwen["kind"] == "sync"].iloc[0]
    assert int(sync["after"]) in set(carried.index)  # the step's first sync waits for that work


def test_device_work_no_call_issued_is_carried_in_alone(imported):
    """The qwen05b trace's step holds 456 device tasks no host call of the trace launched (455 unlinked,
    one launched before the step): each is an op of its own, carried in (no launch to wait for), in no
    graph and no group."""
    ops = ops_table(imported["tl_qwen05b_mi300"])
    issued_by_none = ops[ops["name"].str.startswith(("[unlinked] ", "[launched before] "))]
    assert issued_by_none["name"].str.startswith("[unlinked] ").sum() == 455 and len(issued_by_none) == 456
    assert (issued_by_none["carried_in"] == 1).all() and (issued_by_none["in_graph"] == 0).all() and issued_by_none["group"].isna().all()


def test_unseen_device_work_becomes_a_wait(imported):
    sglang = ops_table(imported["tl_sglang_qwen3_decode_mi300"])
    waited = sglang[sglang["not_before_us"].notna()]
    assert len(waited) == 1 and waited["not_before_us"].iloc[0] > 460_000  # 463 ms behind an event from outside


def test_synthetic_trace_costs_are_exact(tmp_path):
    layout = Layout(steps=3, ops=4)
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps(kineto_trace(layout)))
    im = import_profile(load_profile(path))
    table = ops_table(im)
    kernels = table[table["kind"] == "vector"]
    assert im.rule == "profiler" and im.kept == [0, 1, 2]
    assert set(kernels["launch_us"]) == {layout.launch_us} and set(kernels["device_us"]) == {layout.kernel_us}
    first = kernels.groupby("step").head(1)
    assert set(first["framework_us"]) == {layout.framework_us}
    assert set(kernels.groupby("step").tail(3)["framework_us"]) == {layout.framework_us + 2}
    assert (kernels["name"] == [f"aten::op{k}" for k in range(4)] * 3).all()
    syncs = table[table["kind"] == "sync"]
    assert np.allclose(syncs["host_us"], layout.sync_own_us)
    measured = measured_summary(im)
    assert measured["step_ms_mean"] * 1e3 == pytest.approx(expected_step_us(layout))
    assert measured["launches_per_step"] == 4
    replayed = replay(im, tmp_path)
    assert replayed["step_ms_mean"] == pytest.approx(measured["step_ms_mean"], rel=1e-9)
    assert replayed["device_busy"] == pytest.approx(measured["device_busy"], rel=1e-9)


def test_synthetic_trace_steps_and_linkage_by_hand(tmp_path):
    """Three ProfilerSteps of 98 µs (expected_step_us) with 4 µs of host time between them: step k runs
    from k × 102 µs after the first step's start; each holds its 4 kernels, each kernel linked to its launch."""
    layout = Layout(steps=3, ops=4)
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps(kineto_trace(layout)))
    im = import_profile(load_profile(path))
    assert step_table(im) == [
        {"step": k, "label": f"ProfilerStep#{k}", "start_ms": pytest.approx(k * 0.102), "end_ms": pytest.approx(k * 0.102 + 0.098),
         "latency_ms": pytest.approx(0.098), "ops": 4, "replayed": True, "left_out": ""}
        for k in range(3)
    ]
    assert linkage(im) == {"device_tasks": 12, "device_tasks_linked": 12, "launch_calls": 12, "launch_calls_linked": 12}


def test_synthetic_trace_measures_by_hand(tmp_path):
    """Two steps of two ops (framework 10 µs, launch 5 µs, kernel 20 µs; 2 µs of the op's own code after
    each launch; the sync returns 3 µs after the stream drains). A step: launch [10,15], kernel 0 [15,35];
    launch [27,32], kernel 1 waits for the stream [35,55]; the sync [34,58]. So 58 µs, 40 µs of them busy;
    the device waits for the host over [0,15] (10 µs framework, 5 µs launch) and [55,58] (the sync's own
    3 µs). The host thread is busy 58 − 21 µs (the sync's wait); its framework time is 10 + 12 + 2 µs a
    step (the 2 µs after the last launch run before the sync); kernel 1 starts 3 µs after its launch."""
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps(kineto_trace(Layout(steps=2, ops=2))))
    measured = measured_summary(import_profile(load_profile(path)))
    step = 58.0
    expected = {
        "step_ms_mean": step / 1e3, "step_ms_p50": step / 1e3, "step_ms_p99": step / 1e3, "window_ms": 2 * step / 1e3, "steps_measured": 2,
        "device_busy": 40 / step, "bubble_ratio": 18 / step, "host_busy_max": 37 / step, "host_cpu_load": 37 / step,
        "ops_per_step": 2.0, "launches_per_step": 2.0, "bound": "device",
        "breakdown_framework": 10 / step, "breakdown_launch": 5 / step, "breakdown_sync": 3 / step, "breakdown_compute": 40 / step,
        "idle_host_wait_ms": 0.018, "idle_device_wait_ms": 0.0, "idle_host_wait_share": 1.0,
        "host_ms_framework": 0.024, "host_ms_launch": 0.010, "host_ms_sync": 0.003, "host_ms_sync_wait": 0.021,
        "host_ms_alloc": 0.0, "host_ms_tiling": 0.0, "host_ms_copy": 0.0,
        "launch_to_start_us_mean": 1.5, "launch_to_start_us_p50": 1.5, "launch_to_start_us_p90": 3.0, "launch_to_start_us_p99": 3.0,
        "launch_to_start_us_max": 3.0,
    }
    assert {key: measured[key] for key in expected} == pytest.approx(expected)
    others = [key for key in measured if key.startswith("breakdown_") and key not in expected]
    assert others and all(measured[key] == 0.0 for key in others)


def test_a_sync_with_nothing_launched_is_host_time(tmp_path):
    """Each step opens with a 3 µs cudaDeviceSynchronize at 1 µs, before any launch: nothing to wait
    for, so all of it is the sync's own host time; the first op's framework time runs from its end (4 µs)
    to the launch (10 µs)."""
    syncs = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": PID, "tid": TID, "ts": ts, "dur": 3,
              "args": {"correlation": 700 + k}} for k, ts in enumerate((1001, 1063))]
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps(kineto_trace(Layout(steps=2, ops=2, events=syncs))))
    ops = ops_table(import_profile(load_profile(path)))
    step = ops[ops["step"] == 0]
    assert step[["name", "framework_us", "launch_us", "host_us"]].values.tolist() == [
        ["[sync] cudaDeviceSynchronize", 1.0, 0.0, 3.0], ["aten::op0", 6.0, 5.0, 0.0], ["aten::op1", 12.0, 5.0, 0.0],
        ["[sync] cudaStreamSynchronize", 2.0, 0.0, 3.0],
    ]


def test_where_the_clock_starts_changes_nothing(tmp_path):
    """The synthetic trace of two steps, plus a kernel launched from a second thread at 1110 µs, before
    the stream's last kernel ends (1117), that starts at 1140: a 23 µs kernel wait to HTA (launched
    before the gap began, shorter than 30 µs). The same trace with an earlier event of a category the
    importer skips (the clock then starts before the first event it keeps), or with its timestamps
    written as text with a fraction (which HTA's whole-µs rounding leaves alone), reads the same."""
    late = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": TID + 1, "ts": 1110, "dur": 2, "args": {"correlation": 900}},
        {"ph": "X", "cat": "kernel", "name": "void late<float>(float*)", "pid": GPU, "tid": 7, "ts": 1140, "dur": 5,
         "args": {"correlation": 900, "stream": 7, "device": GPU}},
    ]
    plain = kineto_trace(Layout(steps=2, ops=2, events=late))
    early = copy.deepcopy(plain)
    early["traceEvents"].append({"ph": "X", "cat": "python_function", "name": "<module>", "pid": PID, "tid": TID, "ts": 900, "dur": 1})
    text = copy.deepcopy(plain)  # every stamp half a µs later, as text (never rounded), and one without a stamp
    for event in text["traceEvents"]:
        if "ts" in event:
            event["ts"] = f"{event['ts'] + 0.5:.1f}"
    text["traceEvents"].append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID, "tid": TID})
    read = []
    for name, content in (("plain", plain), ("early", early), ("text", text)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(content))
        im = import_profile(load_profile(path))
        read.append((peer_breakdown(im), im.profile.calls.to_dict("list"), im.profile.tasks.to_dict("list")))
    assert read[0][0]["idle_kernel_wait_us"] == 23.0 and read[0][0]["window_ms"] == pytest.approx(0.130)  # 15 µs to 1145 µs
    # The one other gap: from the first step's last kernel (55 µs) to the second step's first (77 µs),
    # launched at 72 µs, after the gap began.
    assert read[0][0]["idle_host_wait_us"] == 22.0 and read[0][0]["idle_other_us"] == 0.0
    assert read[1] == read[0] and read[2] == read[0]


@pytest.mark.parametrize("name", ["hta_gpu_annot_gp100", "hta_alexnet_a100"])
def test_measured_step_percentiles_are_those_of_the_step_table(name, imported):
    im = imported[name]
    latency = [row["latency_ms"] for row in step_table(im) if row["replayed"]]
    measured = measured_summary(im)
    for q in (50, 99):
        assert measured[f"step_ms_p{q}"] == pytest.approx(np.percentile(latency, q))
    assert measured["step_ms_mean"] == pytest.approx(np.mean(latency)) and measured["steps_measured"] == len(latency)


# Device tasks, those linked to the call that issued them, issuing calls (launches, graph launches,
# copies, memsets), those linked to a task. The kernels among them are REFERENCE's counts; the rest are
# copies and memsets (the Ascend trace's two unlinked tasks are its hardware tasks without a launch).
LINKAGE = {
    "ascend_msprof_analyze_ut": (276, 274, 152, 152),
    "hta_alexnet_a100": (98, 98, 100, 98),  # 79 kernels, 16 copies, 3 memsets; two issuing calls left no task
    "hta_event_sync_multistream_a100": (6, 6, 6, 6),  # 3 kernels, 3 memsets
    "hta_gpu_annot_gp100": (140, 140, 140, 140),  # 130 kernels, 10 copies
    "tl_qwen05b_mi300": (1517, 1054, 1054, 1054),  # 1516 kernels (1053 linked) and one copy
    "tl_sglang_qwen3_decode_mi300": (558, 558, 15, 15),  # 555 kernels and 3 copies from graph launches and copies
    "tl_vllm_decode_fullgraph_amd": (434, 434, 14, 14),  # 425 kernels and 9 copies
}


@pytest.mark.parametrize("name", sorted(LINKAGE))
def test_linkage_counts_every_device_task_and_launch(name, imported):
    counts = linkage(imported[name])
    assert tuple(counts.values()) == LINKAGE[name]
    assert counts["device_tasks_linked"] >= REFERENCE[name][5][0]


def test_event_waits_become_dependencies_across_streams(tmp_path):
    """Kernel B on stream 8 waits (cudaStreamWaitEvent) for an event recorded after kernel A on stream 7."""
    def kernel(name, stream, ts, dur, corr):
        return device_task(name, ts, dur, corr, stream=stream)

    events = [
        runtime_call("cudaLaunchKernel", 100, 5, 1), kernel("A_gemm", 7, 105, 300, 1),
        runtime_call("cudaEventRecord", 110, 2, 2),
        runtime_call("cudaStreamWaitEvent", 115, 2, 3),
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 8, "ts": 116, "dur": 1,
         "args": {"correlation": 3, "stream": 8, "wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 2}},
        runtime_call("cudaLaunchKernel", 120, 5, 4), kernel("B_add", 8, 405, 10, 4),
        runtime_call("cudaDeviceSynchronize", 130, 290, 5),
    ]
    path = tmp_path / "streams.json"
    path.write_text(json.dumps({"traceEvents": events}))
    im = import_profile(load_profile(path))
    table = ops_table(im)
    b = table[table["kernel"] == "B_add"].iloc[0]
    a_index = int(table.index[table["kernel"] == "A_gemm"][0])
    assert b["after"] == str(a_index) and b["stream"] != table.loc[a_index, "stream"]
    replayed = replay(im, tmp_path)
    assert replayed["step_ms_mean"] == pytest.approx(measured_summary(im)["step_ms_mean"], rel=0.01)


# ---------------------------------------------------------------- the command line


def run_profile(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.profile", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_command_writes_files_and_its_replay_line_reproduces_the_trace(tmp_path):
    done = run_profile(str(trace("hta_gpu_annot_gp100")), "--out", "imported", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "imported"
    assert {p.name for p in out.iterdir()} == {"profile.json", "ops.csv", "replay.txt"}
    profile = json.loads((out / "profile.json").read_text())
    for key in ("step_ms_mean", "device_busy", "bubble_ratio", "host_busy_max", "bound", "bound_reason", "launches_per_step",
                "breakdown_framework", "launch_to_start_us_p50", "idle_host_wait_ms", "idle_device_wait_ms", "host_ms_launch"):
        assert key in profile
    line = (out / "replay.txt").read_text().strip()
    assert line.count("\n") == 0 and line in done.stdout and line.startswith("python -m harness ")
    replayed = subprocess.run(
        [sys.executable, *shlex.split(line)[1:], "tracking.enabled=false"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert replayed.returncode == 0, replayed.stderr
    summary = json.loads(next((tmp_path / "outputs" / "runs").rglob("summary.json")).read_text())
    assert summary["step_ms_mean"] == pytest.approx(profile["step_ms_mean"], rel=REPLAY_TOLERANCE)


def test_partly_linked_trace_warns_with_the_counts(tmp_path):
    done = run_profile(str(trace("tl_qwen05b_mi300")), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0
    assert "1054 of 1517 device tasks linked" in done.stderr and "463" in done.stderr


def _write(path: Path, content) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


KERNEL = device_task("k", 10, 5, 9)  # LAUNCH's correlation is 8: nothing links them


@pytest.mark.parametrize(
    "content,extra,fragment",
    [
        ("this is not json", [], "not JSON"),
        (gzip.compress(b"{broken", mtime=0), [], "not JSON"),
        ({"hello": "world"}, [], "not a profiler trace"),
        ([1, 2, 3], [], "not a profiler trace"),
        ({"traceEvents": [LAUNCH]}, [], "no device events"),
        ({"traceEvents": [LAUNCH, KERNEL]}, [], "no device task is linked"),
        ({"traceEvents": [LAUNCH, KERNEL], "distributedInfo": {"rank": 0}}, ["--rank", "3"], "rank 3 is not there"),
        ({"traceEvents": [LAUNCH, KERNEL]}, ["--steps", "profiler"], "no 'ProfilerStep#N'"),
        # Fields of the wrong type where the reader needs them (each was a traceback).
        ({"traceEvents": [LAUNCH, KERNEL, {**LAUNCH, "cat": ["x"]}]}, [], "has cat=['x']: not text or a number"),
        ({"traceEvents": [{**LAUNCH, "name": ["a"]}, KERNEL]}, [], "has name=['a']: not text or a number"),
        ({"traceEvents": [LAUNCH, KERNEL], "distributedInfo": [1]}, [], "distributedInfo is [1]: not an object"),
        ({"traceEvents": [LAUNCH, KERNEL], "deviceProperties": 5}, [], "deviceProperties is 5: not a list"),
        # Overlapping occurrences of the step annotation (mark=NAME would put a kernel in two steps).
        ({"traceEvents": [LAUNCH, KERNEL, *({"ph": "X", "cat": "user_annotation", "name": "f", "pid": 1, "tid": 1, "ts": ts, "dur": 10}
                                             for ts in (0, 3))]}, ["--steps", "mark=f"], "steps must not overlap"),
    ],
)
def test_bad_traces_fail_in_one_line_and_write_nothing(tmp_path, content, extra, fragment):
    path = _write(tmp_path / "trace.json", content)
    done = run_profile(str(path), "--out", str(tmp_path / "out"), *extra, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "trace.json" in lines[0], done.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "name,kind",
    [
        ("cudaLaunchKernel", CALL_LAUNCH), ("cudaLaunchKernelExC", CALL_LAUNCH), ("cuLaunchKernelEx", CALL_LAUNCH),
        ("hipLaunchKernel", CALL_LAUNCH), ("hipExtModuleLaunchKernel", CALL_LAUNCH), ("hipModuleLaunchKernel", CALL_LAUNCH),
        ("cudaGraphLaunch", CALL_GRAPH), ("hipGraphLaunch", CALL_GRAPH), ("cudaMemcpyAsync", CALL_COPY),
        ("cudaMemcpy", CALL_COPY_SYNC), ("hipMemcpyWithStream", CALL_COPY_SYNC), ("cudaStreamSynchronize", CALL_SYNC),
        ("hipDeviceSynchronize", CALL_SYNC), ("cudaEventSynchronize", CALL_SYNC), ("cudaEventRecord", CALL_RECORD),
        ("cudaEventRecordWithFlags", CALL_RECORD),
        ("cudaStreamWaitEvent", CALL_WAIT), ("cudaEventQuery", CALL_OTHER), ("cudaStreamIsCapturing", CALL_OTHER),
    ],
)
def test_runtime_calls_are_classified_by_name(name, kind):
    assert call_kind(name) == kind


def test_the_same_trace_imports_to_the_same_files(tmp_path):
    """Determinism: two imports of one trace write byte-identical profile.json and ops.csv."""
    outs = []
    for k in range(2):
        out = tmp_path / f"out{k}"
        done = run_profile(str(trace("ascend_msprof_analyze_ut")), "--out", str(out), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        outs.append(out)
    for name in ("profile.json", "ops.csv"):
        first, second = ((o / name).read_text() for o in outs)
        assert first.replace(str(outs[0]), "") == second.replace(str(outs[1]), "")


def test_graph_launches_without_annotations_split_steps(tmp_path):
    """Two steps, each: a copy, then a graph launch of three kernels (no annotation around them)."""
    events, corr = [], 1
    for step in range(2):
        t = 1000.0 * step
        events += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": t + 10, "dur": 4, "args": {"correlation": corr}},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": t + 15, "dur": 2, "args": {"correlation": corr, "stream": 7, "device": 0}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": t + 30, "dur": 20, "args": {"correlation": corr + 1}},
        ]
        events += [
            {"ph": "X", "cat": "kernel", "name": f"k{j}_gemm", "pid": 0, "tid": 7, "ts": t + 40 + 101 * j, "dur": 100,
             "args": {"correlation": corr + 1, "stream": 7, "device": 0}}
            for j in range(3)
        ]
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1, "ts": t + 60, "dur": 285, "args": {"correlation": corr + 2}})
        corr += 3
    path = _write(tmp_path / "graphs.json", {"traceEvents": events})
    im = import_profile(load_profile(path))
    assert im.rule == "graph" and len(im.found) == 2 and im.kept == [0, 1]
    table = ops_table(im)
    graph = table[table["in_graph"] == 1]
    assert len(graph) == 6 and set(graph.groupby("step")["group"].first()) == {1}
    assert set(graph.groupby("step")["launch_us"].max()) == {20.0}
    measured = measured_summary(im)
    assert measured["launches_per_step"] == 2 and measured["ops_per_step"] == 4
    replayed = replay(im, tmp_path)
    assert replayed["step_ms_mean"] == pytest.approx(measured["step_ms_mean"], rel=0.02)
    assert replayed["launches_per_step"] == 2


@pytest.mark.parametrize("field, value", [("ts", "nan"), ("ts", "12abc"), ("ts", float("inf")), ("dur", "abc"), ("dur", -5.0), ("ts", [1])])
def test_an_event_whose_time_is_not_a_time_is_refused_in_one_line(tmp_path, field, value):
    """A malformed timestamp or duration in a duration event: one line naming the file and the event."""
    trace_data = kineto_trace(Layout(steps=2, ops=2))
    event = next(e for e in trace_data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel")
    event[field] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(trace_data))
    with pytest.raises(ProfileError, match=rf"^{path}: event '.*' has ts=.*, dur=.*: not a time in µs$"):
        load_profile(path)


def test_a_kept_steps_time_does_not_depend_on_which_others_are_kept(tmp_path):
    """Three 50 µs ProfilerStep windows whose 45 µs kernels run 12-57, 62-107 and 112-157 µs: a step starts
    when its window opens or the step before it ended, whichever is later, so step 1 runs 57-107 = 50 µs
    (and step 2 107-157). Keeping steps 1 and 2 (`--keep 1:`) must not move step 1's start to its window's
    50 µs (it measured 57)."""
    events = []
    for s in range(3):
        at = 50 * s
        events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": at, "dur": 50},
                   runtime_call("cudaLaunchKernel", at + 10, 2, s + 1), device_task("A", at + 12, 45, s + 1)]
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}))
    whole = import_profile(load_profile(path))
    kept = import_profile(load_profile(path), keep=slice(1, None))
    assert [(s.start_us, s.end_us) for s in whole.found] == [(0, 57), (57, 107), (107, 157)]
    assert kept.kept == [1, 2] and [(kept.found[i].start_us, kept.found[i].end_us) for i in kept.kept] == [(57, 107), (107, 157)]


def test_a_replay_keeps_a_measured_graph_exit_gap_without_task_pairs(tmp_path):
    """A piecewise trace whose graphs hold one task each measures an exit gap (a kernel launched alone right
    after a graph: 3 µs) but no gap between two tasks of a graph: replay.txt passes the exit gap all the
    same (it had been dropped with the pairs: a step 8 % short)."""
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"traceEvents": [runtime_call("cudaLaunchKernel", 2, 5, 1), device_task("k", 10, 5, 1)],
                                "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}))
    imported = import_profile(load_profile(path))
    overrides = replay_overrides(imported, tmp_path / "ops.csv", graph_gaps=np.zeros(0), front_end_gaps=(np.array([1.0]), np.array([4.0])))
    assert "hardware.graph.exit_gap_us=3" in overrides and not any("task_dispatch_us" in o for o in overrides)
    plain = replay_overrides(imported, tmp_path / "ops.csv", graph_gaps=np.zeros(0), front_end_gaps=(np.array([1.0]), np.zeros(0)))
    assert not any("exit_gap_us" in o for o in plain) and "hardware.device.kernel_gap_us=1" in plain


def test_device_work_no_call_issued_belongs_to_the_step_it_starts_in(tmp_path):
    """A task with no launch in the trace (U, 40-70 µs) that runs past its step's window (0-50) into the next
    is that step's op, 30 µs, and not the next one's too (it had been counted again there as 20 µs of
    carried-in work: 50 µs of op time for 30 of work)."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": 50 * s, "dur": 50} for s in (0, 1)]
    events += [runtime_call("cudaLaunchKernel", 10, 2, 1), device_task("A", 12, 8, 1), device_task("U", 40, 30, 99),
               runtime_call("cudaLaunchKernel", 60, 2, 2), device_task("B", 70, 10, 2)]
    path = tmp_path / "loose.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}))
    found = import_profile(load_profile(path)).found
    kernels = [[(op["kernel"], op["device_us"]) for op in step.ops if op["kernel"]] for step in found]
    assert kernels == [[("A", 8.0), ("U", 30.0)], [("B", 10.0)]]


# ---------------------------------------------------------------- reviewed: steps, host time, --keep, odd fields


def prefix_trace(folder: Path) -> Path:
    """Three `decode` annotations of 100 µs, 200 µs apart, each holding a 30 µs gemm (launched 10 µs in)
    and a nested 30 µs `decode_sample` annotation with a 5 µs argmax (launched 65 µs in)."""
    events = []
    for s in range(3):
        t = 1000 + 200 * s
        events += [
            {"ph": "X", "cat": "user_annotation", "name": "decode", "pid": 1, "tid": 1, "ts": t, "dur": 100},
            runtime_call("cudaLaunchKernel", t + 10, 5, 2 * s + 1), device_task("gemm", t + 20, 30, 2 * s + 1),
            {"ph": "X", "cat": "user_annotation", "name": "decode_sample", "pid": 1, "tid": 1, "ts": t + 60, "dur": 30},
            runtime_call("cudaLaunchKernel", t + 65, 5, 2 * s + 2), device_task("argmax", t + 75, 5, 2 * s + 2),
        ]
    path = folder / "prefix.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_mark_takes_the_annotation_of_that_name_not_every_name_it_begins(tmp_path):
    """mark=decode is the three `decode` windows, 100 µs each (step mean 0.100 ms) with the gemm and the
    argmax in each; the `decode_sample` inside each is not a step of its own (it was: 6 overlapping steps,
    a mean of -0.010 ms). auto picks from=decode (3 occurrences, apart; decode_sample ties at 3 but starts
    later): from each start to the next, 200 µs, the last to the last call (465 + 5 - 400 = 70 µs)."""
    profile = load_profile(prefix_trace(tmp_path))
    im = import_profile(profile, "mark=decode")
    assert [(s.start_us, s.end_us) for s in im.found] == [(0, 100), (200, 300), (400, 500)]
    assert [[op["kernel"] for op in s.ops if op["kernel"]] for s in im.found] == [["gemm", "argmax"]] * 3
    assert measured_summary(im)["step_ms_mean"] == pytest.approx(0.100)
    rule, windows = find_windows(profile)
    assert rule == "from=decode" and [(w.start_us, w.end_us) for w in windows] == [(0, 200), (200, 400), (400, 470)]
    assert len(find_windows(profile, "mark=decode_sample")[1]) == 3  # and the inner name still finds its own


def test_a_name_no_annotation_has_takes_the_numbered_ones_it_begins(tmp_path):
    """Steps annotated decode_step_0, decode_step_1, decode_step_2 (numbered without '#'): mark=decode_step_
    names none of them exactly, so it takes every name it begins, three steps of 100 µs."""
    events = json.loads(prefix_trace(tmp_path).read_text())["traceEvents"]
    decodes = [e for e in events if e.get("name") == "decode"]
    for k, event in enumerate(decodes):
        event["name"] = f"decode_step_{k}"
    path = tmp_path / "numbered.json"
    path.write_text(json.dumps({"traceEvents": events}))
    im = import_profile(load_profile(path), "mark=decode_step_")
    assert [(s.start_us, s.end_us) for s in im.found] == [(0, 100), (200, 300), (400, 500)]
    assert measured_summary(im)["step_ms_mean"] == pytest.approx(0.100)


def test_overlapping_steps_are_refused_in_one_line(tmp_path):
    """A `fwd` annotation [0,100] holding another `fwd` [20,50] (mark=fwd: its kernel would be in both steps),
    and a ProfilerStep#1 [20,50] inside ProfilerStep#0 [0,100]: step 1 would start where step 0 ended
    (100 µs) and end at 50 µs, a step of -50 µs (it was replayed so)."""
    events = [runtime_call("cudaLaunchKernel", 30, 5, 1), device_task("k", 40, 5, 1)]
    marks = [{"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
             for name, ts, dur in (("fwd", 0, 100), ("fwd", 20, 30))]
    with pytest.raises(ProfileError, match=r"--steps mark=fwd: the 'fwd' at 20\.000 us starts before an earlier occurrence ends"):
        find_windows(load_profile(trace_file(tmp_path, events + marks)), "mark=fwd")
    steps = [{**m, "name": f"ProfilerStep#{k}"} for k, m in enumerate(marks)]
    with pytest.raises(ProfileError, match=r"step 'ProfilerStep#1' ends at 50\.000 us, no later than the step before it ends \(100\.000 us\)"):
        import_profile(load_profile(trace_file(tmp_path, events + steps)))


def test_host_time_between_launches_counts_once_with_its_allocations(tmp_path):
    """A 30 µs step: launch [2,7] of kernel a [8,9], a cudaMalloc [10,14], launch [16,19] of kernel b [25,30].
    The issuing thread's time in disjoint pieces: framework [0,2], launch, framework [7,10], alloc, framework
    [14,16], launch, framework [19,30] (the framework piece had spanned [7,16], the allocation in it). Per
    category: framework 2 + 3 + 2 + 11 = 18 µs, alloc 4, launch 8 = the 30 µs step (it summed to 34).
    Critical path: [0,8] idle, a ready at 7: host 7 (framework 2, launch 5), front end 1; [9,25] idle, b
    ready at 19: host 10 = framework [9,10] + [14,16] 3, alloc 4, launch 3 (framework had been 7 more: 14 µs
    of host in a 10 µs wait), front end 6; compute 1 + 5. The op list is as before: b's framework 9 - 4 = 5."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 30},
        runtime_call("cudaLaunchKernel", 2, 5, 8), device_task("a", 8, 1, 8),
        runtime_call("cudaMalloc", 10, 4),
        runtime_call("cudaLaunchKernel", 16, 3, 9), device_task("b", 25, 5, 9),
    ]
    im = import_profile(load_profile(trace_file(tmp_path, events)))
    assert im.found[0].main_segments == [(0, 2, "framework"), (2, 7, "launch"), (7, 10, "framework"), (10, 14, "alloc"),
                                         (14, 16, "framework"), (16, 19, "launch"), (19, 30, "framework")]
    measured = measured_summary(im)
    expected = {"host_ms_framework": 0.018, "host_ms_alloc": 0.004, "host_ms_launch": 0.008, "breakdown_framework": 5 / 30,
                "breakdown_alloc": 4 / 30, "breakdown_launch": 8 / 30, "breakdown_compute": 6 / 30, "breakdown_front_end": 7 / 30}
    assert {key: measured[key] for key in expected} == pytest.approx(expected)
    assert ops_table(im)[["framework_us", "alloc_us", "launch_us"]].values.tolist()[:2] == [[2.0, 0.0, 5.0], [5.0, 4.0, 3.0]]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_host_time_by_category_never_exceeds_the_step(name, imported):
    """The issuing threads' time is cut into disjoint pieces, one category each, so the categories sum to at
    most the step (they had summed to 68.8 ms in AlexNet's 36.0 ms step, 15.0 in Ascend's 14.1, 20.6 in the
    event-sync trace's 19.9: allocations and tiling counted as framework time too)."""
    measured = measured_summary(imported[name])
    host = sum(measured[f"host_ms_{c}"] for c in ("framework", "launch", "alloc", "tiling", "copy", "sync", "sync_wait"))
    assert host <= measured["step_ms_mean"] * (1 + 1e-9)


def test_alexnets_cudamalloc_time_is_allocation_not_framework(imported):
    """AlexNet's measured forward (between the 3rd and 4th cudaDeviceSynchronize, by hand from the file):
    a 36,019 µs window whose runtime calls take 34,133 µs, 63 µs of them calls that are host time of no
    category of their own (cudaStreamIsCapturing 12, cudaEventRecord 25, cudaStreamWaitEvent 10,
    occupancy queries 8, cudaFuncSetAttribute 5, stream priorities 3): framework 36,019 - 34,133 + 63 =
    1,949 µs, and its five cudaMalloc 32,814 µs (framework had been 34.763 ms, the allocations again)."""
    measured = measured_summary(imported["hta_alexnet_a100"])
    assert measured["host_ms_framework"] == pytest.approx(1.949, abs=1e-6)
    assert measured["host_ms_alloc"] == pytest.approx(32.814, abs=1e-6)
    assert measured["breakdown_alloc"] > 0.8 > 0.05 > measured["breakdown_framework"]  # 0.840 and 0.009 (0.457, 0.461 before)


def test_keep_reports_the_steps_found_and_the_kept_ones_by_their_numbers(tmp_path, capsys):
    """Four synthetic steps, --keep 1:3: 2 replayed of 4 found, steps 1 and 2 (it said 2 of 2, steps 0 and 1);
    the step table lists all four, 0 and 3 outside --keep."""
    from harness.cli.profile import main as profile_main

    path = tmp_path / "four.json"
    path.write_text(json.dumps(kineto_trace(Layout(steps=4, ops=2))))
    profile_main([str(path), "--out", str(tmp_path / "out"), "--keep", "1:3"])
    assert "steps        2 replayed of 4 found (profiler)" in capsys.readouterr().out
    record = json.loads((tmp_path / "out" / "profile.json").read_text())
    assert (record["steps_found"], record["steps_replayed"]) == (4, [1, 2])
    assert [(s["step"], s["replayed"], s["left_out"]) for s in record["steps"]] == [
        (0, False, "outside --keep"), (1, True, ""), (2, True, ""), (3, False, "outside --keep")]
