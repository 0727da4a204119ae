"""Metrics: busy-time arithmetic, window accounting, and the breakdown over the critical path."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import compose_run
from harness.sim.task_graph import CATEGORIES, LANE_DEVICE
from harness.sim.busy import BusyTime
from harness.sim.simulate import simulate_run


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10)), min_size=0, max_size=30),
    st.integers(0, 60),
    st.integers(0, 60),
)
def test_busy_time_matches_brute_force(intervals, a, b):
    a, b = min(a, b), max(a, b)
    starts = np.array([s for s, _ in intervals], dtype=float)
    ends = np.array([s + d for s, d in intervals], dtype=float)
    covered = np.zeros(120, dtype=bool)  # unit grid: integer intervals are exact
    for s, e in zip(starts.astype(int), ends.astype(int)):
        covered[s:e] = True
    expected = covered[a:b].sum()
    assert BusyTime(starts, ends).between(np.array(a, float), np.array(b, float)) == pytest.approx(expected)


@pytest.mark.parametrize("strategy", ["eager", "async", "pipeline"])
@pytest.mark.parametrize("workload", ["llama2_7b_decode", "llama2_7b_prefill"])
def test_accounting_identities(workload, strategy):
    outcome = simulate_run(compose_run(f"workload={workload}", f"strategy={strategy}", "workload.steps=3"))
    s, steps = outcome.summary, outcome.steps
    # Busy + idle = window, per run and per step; step latencies tile the window.
    assert s["device_busy"] + s["bubble_ratio"] == pytest.approx(1.0)
    assert steps["latency_ms"].sum() == pytest.approx(s["window_ms"])
    assert (steps["device_busy_ms"] <= steps["latency_ms"] + 1e-9).all()
    assert steps["device_busy_ms"].sum() == pytest.approx(s["device_busy"] * s["window_ms"])
    # The front end's gaps are a part of the bubble, never more.
    assert 0.0 < s["bubble_front_end"] <= s["bubble_ratio"] + 1e-12
    assert steps["front_end_idle_ms"].sum() == pytest.approx(s["bubble_front_end"] * s["window_ms"])
    # The breakdown covers the whole critical path.
    assert sum(s[f"breakdown_{c}"] for c in CATEGORIES) == pytest.approx(1.0)
    # Time by category covers every task of the measured steps.
    assert sum(s[f"time_share_{c}"] for c in CATEGORIES if c != "front_end") == pytest.approx(1.0)
    assert "time_share_front_end" not in s  # no task's work is a front-end gap
    work_all = outcome.result.end_us - outcome.result.work_start_us  # a kernel without its front-end gap
    assert s["task_ms_per_step"] * s["steps_measured"] == pytest.approx(work_all.sum() / 1e3)
    path = outcome.result.critical_path()
    durations = outcome.result.end_us[path] - outcome.result.start_us[path]
    assert durations.sum() == pytest.approx(outcome.result.makespan_us)
    # Device busy can never exceed the sum of device task work (streams may overlap, not add).
    graph = outcome.result.graph
    on_device = graph.lane_kinds[graph.tasks["lane"]] == LANE_DEVICE
    device_sum = (outcome.result.end_us - outcome.result.work_start_us)[on_device].sum()
    assert s["device_busy"] * s["window_ms"] * 1e3 <= device_sum + 1e-6


def test_warmup_steps_are_left_out_of_the_window():
    full = simulate_run(compose_run("workload.steps=6")).summary
    warm = simulate_run(compose_run("workload.steps=6", "workload.warmup_steps=2"))
    assert warm.summary["steps_measured"] == 4
    assert warm.summary["window_ms"] == pytest.approx(warm.steps["latency_ms"][2:].sum())
    assert warm.summary["window_ms"] < full["window_ms"]


def test_throughput_counts_tokens_per_phase():
    decode = simulate_run(compose_run("workload.batch_size=4", "workload.steps=3")).summary
    assert decode["throughput_tok_s"] == pytest.approx(4 * 3 / (decode["window_ms"] / 1e3))
    prefill = simulate_run(compose_run("workload=llama2_7b_prefill", "workload.steps=2", "workload.context_len=512")).summary
    assert prefill["throughput_tok_s"] == pytest.approx(512 * 2 / (prefill["window_ms"] / 1e3))
    assert prefill["ttft_ms"] == pytest.approx(prefill["step_ms_mean"])
    assert "ttft_ms" not in decode


@pytest.mark.parametrize(
    "overrides",
    [
        ("strategy=eager",),
        ("strategy=pipeline", "workload=qwen3_30b_decode"),
        ("strategy=async", "strategy.free_on_main=true"),  # allocs and frees on different threads
        ("strategy=acl_graph", "workload=qwen3_30b_decode"),
    ],
)
def test_lane_merges_agree_with_sorting(overrides):
    """busy_of_lanes and the peak-activation merge rely on FIFO lanes instead of sorting: they must
    give what sorting every interval/event gives."""
    from harness.sim.metrics import ALLOC_STAGE, FREE_STAGE, busy_of_lanes, peak_activation_bytes

    outcome = simulate_run(compose_run(*overrides, "workload.steps=4"))
    result, graph = outcome.result, outcome.result.graph
    lane = graph.tasks["lane"]
    probe = np.linspace(0.0, result.makespan_us, 97)
    for lanes in [np.flatnonzero(graph.lane_kinds == LANE_DEVICE), *[[k] for k in np.unique(lane)]]:
        mine = np.isin(lane, lanes)
        reference = BusyTime(result.work_start_us[mine], result.end_us[mine])
        merged = busy_of_lanes(result, lanes)
        assert np.array_equal(merged.starts, reference.starts) and np.array_equal(merged.ends, reference.ends)
        assert np.allclose(merged.covered_until(probe), reference.covered_until(probe))
    # Peak live activation bytes by sorting all alloc (+) and free (−) events, frees first at equal times.
    stage, step, op = graph.tasks["stage"], graph.tasks["step"], graph.tasks["op"]
    size = outcome.workload.activation_bytes()
    allocs, frees = np.flatnonzero(stage == ALLOC_STAGE), np.flatnonzero(stage == FREE_STAGE)
    times = np.concatenate([result.end_us[allocs], result.end_us[frees]])
    deltas = np.concatenate([size[step[allocs], op[allocs]], -size[step[frees], op[frees]]])
    expected = np.cumsum(deltas[np.lexsort((deltas, times))]).max(initial=0.0)
    assert allocs.size > 0 and expected > 0
    assert peak_activation_bytes(result, outcome.workload) == pytest.approx(expected, rel=1e-12)


def shares(**parts) -> np.ndarray:
    from harness.sim.task_graph import CATEGORY

    out = np.zeros(len(CATEGORIES))
    for name, value in parts.items():
        out[CATEGORY[name]] = value
    return out


@pytest.mark.parametrize("host, bound", [(0.4999999, "device"), (0.5, "device"), (0.5000001, "host")])
def test_a_run_is_host_bound_above_half_the_critical_path_on_the_host(host, bound):
    from harness.sim.metrics import occupancy

    out = occupancy(shares(launch=host, compute=1 - host), 30.0, {"host.main": 80.0, "host.launch": 20.0}, 100.0)
    assert out["bound"] == bound
    assert out["bubble_ratio"] == pytest.approx(0.7) and out["device_busy"] == pytest.approx(0.3)
    assert out["host_busy_max"] == pytest.approx(0.8) and out["host_cpu_load"] == pytest.approx(1.0)


def test_front_end_gaps_are_device_time_not_host_work():
    """60 % of the path in kernels' front-end gaps and 40 % in launch calls: device-bound, though no kernel
    works for most of the path (no host-side change removes a gap)."""
    from harness.sim.metrics import occupancy

    out = occupancy(shares(front_end=0.6, launch=0.4), 30.0, {"host.main": 40.0}, 100.0)
    assert out["bound"] == "device"
    assert out["bound_reason"] == "device time is 60% of the critical path (front_end 60%); device idle 70% of the window"


def test_an_empty_window_has_no_bubble_and_no_load():
    from harness.sim.metrics import occupancy

    out = occupancy(shares(compute=1.0), 0.0, {"host.main": 0.0}, 0.0)
    assert (out["bubble_ratio"], out["device_busy"], out["host_busy_max"], out["host_cpu_load"]) == (0.0, 1.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "parts, bubble, reason",
    [
        (dict(launch=0.4, framework=0.3, tiling=0.1, alloc=0.05, compute=0.15), 0.7,
         "host work is 85% of the critical path (launch 40%, framework 30%, tiling 10%); device idle 70% of the window"),
        (dict(compute=0.6, comm=0.3, launch=0.1), 0.1,
         "device time is 90% of the critical path (compute 60%, comm 30%); device idle 10% of the window"),
        (dict(external=0.6, compute=0.4), 0.2,
         "device time is 100% of the critical path (external 60%, compute 40%); device idle 20% of the window;"
         " 60% is the device waiting for work outside the trace (another stream, process or step)"),
        (dict(external=0.5, compute=0.5), 0.2, "device time is 100% of the critical path (compute 50%, external 50%); device idle 20% of the window"),
    ],
)
def test_the_bound_reason_names_the_three_largest_shares_of_its_side(parts, bubble, reason):
    from harness.sim.metrics import HOST_CATEGORIES, bound_reason

    breakdown = shares(**parts)
    host_share = sum(v for k, v in parts.items() if k in HOST_CATEGORIES)
    assert bound_reason(host_share, breakdown, bubble) == reason


def test_measured_steps_leave_out_warm_up_and_graph_builds_unless_every_step_builds():
    from harness.sim.metrics import measured_steps
    from harness.sim.policies import BUILD, EAGER, REPLAY, StepPlan

    workload = type("W", (), {"steps": 4, "warmup_steps": 1})()

    def plan(*modes):
        return StepPlan(mode=np.array(modes, dtype=np.int8), tiling_hit=np.zeros((4, 1), dtype=bool), cpu_ops=np.zeros(1, dtype=bool))

    assert measured_steps(workload, plan(BUILD, REPLAY, BUILD, EAGER)).tolist() == [False, True, False, True]
    assert measured_steps(workload, plan(BUILD, BUILD, BUILD, BUILD)).tolist() == [False, True, True, True]
    assert measured_steps(workload).tolist() == [False, True, True, True]


def test_a_run_that_only_builds_graphs_measures_its_build_steps():
    """One step of graph capture: nothing else to measure, so the build step is the measured one (and
    its capture is in the step time)."""
    run = compose_run("strategy=acl_graph", "workload.steps=1")
    outcome = simulate_run(run)
    assert outcome.steps["mode"].tolist() == ["build"] and outcome.summary["steps_measured"] == 1
    assert outcome.summary["step_ms_mean"] == pytest.approx(outcome.steps["latency_ms"][0])
    assert outcome.summary["step_ms_mean"] > run.hardware.graph.capture_ms and outcome.summary["capture_ms"] == pytest.approx(outcome.summary["step_ms_mean"])


def test_busy_time_of_nothing_is_zero():
    assert BusyTime(np.zeros(0), np.zeros(0)).between(np.array([0.0, 3.0]), np.array([5.0, 9.0])).tolist() == [0.0, 0.0]


STAGE_COLUMNS = "framework_us,infer_shape_us,tiling_us,alloc_us,launch_us,free_us"


@pytest.mark.parametrize(
    "framework_us, device_us, expected",
    [
        # A measured step of 0.25 µs of host work, then a 0.5 µs kernel: a window of 0.75 µs.
        (0.25, 0.5, dict(throughput_tok_s=1 / 0.75e-6, bubble_ratio=1 / 3, host_busy_max=1 / 3, host_cpu_load=1 / 3,
                         breakdown_framework=1 / 3, breakdown_compute=2 / 3, time_share_framework=1 / 3, time_share_compute=2 / 3)),
        # Nothing takes any time: no window, no throughput, no shares (not 0 / 0).
        (0.0, 0.0, dict(throughput_tok_s=0.0, bubble_ratio=0.0, host_busy_max=0.0, host_cpu_load=0.0, breakdown_framework=0.0,
                        breakdown_compute=0.0, time_share_framework=0.0, time_share_compute=0.0)),
    ],
)
def test_summaries_of_tiny_and_empty_windows(tmp_path, framework_us, device_us, expected):
    path = tmp_path / "ops.csv"
    path.write_text(f"step,name,kind,device_us,{STAGE_COLUMNS}\n0,k,vector,{device_us},{framework_us},0,0,0,0,0\n")
    summary = simulate_run(compose_run("workload=trace", f"workload.path={path}", "workload.steps=1", "hardware.device.kernel_gap_us=0")).summary
    assert {key: summary[key] for key in expected} == pytest.approx(expected)
    assert summary["window_ms"] == pytest.approx((framework_us + device_us) / 1e3)


def test_step_percentiles_are_those_of_the_measured_steps():
    outcome = simulate_run(compose_run("hardware.host.jitter_cv=0.3", "workload.steps=7", "workload.warmup_steps=1"))
    latency = outcome.steps["latency_ms"][1:].to_numpy()
    assert len(set(latency)) == 6
    summary = outcome.summary
    assert summary["step_ms_p50"] == np.median(latency) and summary["step_ms_p99"] == np.percentile(latency, 99)
    assert summary["step_ms_p99"] < latency.max() and summary["step_ms_mean"] == pytest.approx(latency.mean())


def test_work_per_step_of_a_single_measured_step():
    outcome = simulate_run(compose_run("workload.steps=1"))
    result = outcome.result
    durations = result.end_us - result.start_us
    leads = result.graph.tasks["lead_us"]
    assert leads.sum() > 0  # the default preset's kernels queue behind each other: each pays a front-end gap
    # A profiler's time-by-category table: each kernel's own time, without the idle gap before it.
    assert outcome.summary["task_ms_per_step"] == pytest.approx((durations - leads).sum() / 1e3)


def test_no_allocations_no_activation_memory():
    from harness.sim.kernel import simulate
    from harness.sim.task_graph import TASK_DTYPE, TaskGraph, csr_from_edges
    from harness.sim.metrics import peak_activation_bytes

    tasks = np.zeros(2, dtype=TASK_DTYPE)
    tasks["duration_us"] = [1.0, 2.0]
    ptr, idx = csr_from_edges(2, np.zeros(0, np.int64), np.zeros(0, np.int64))
    result = simulate(TaskGraph(tasks, ptr, idx, ["lane0"], np.zeros(1, np.int8), ["pool0"], np.array([1])))
    workload = type("W", (), {"activation_bytes": lambda self: np.ones((1, 1))})()
    assert peak_activation_bytes(result, workload) == 0.0


def test_the_bound_reason_at_exactly_half_on_the_host_takes_the_device_side():
    from harness.sim.metrics import bound_reason

    breakdown = shares(launch=0.5, compute=0.5)
    assert bound_reason(0.5, breakdown, 0.4) == "device time is 50% of the critical path (compute 50%); device idle 40% of the window"


def test_lanes_merge_in_key_order_whichever_lane_holds_them():
    """The merge of FIFO lanes by key, with tasks on the last lane too (n_lanes = 3) and one lane not taken."""
    from harness.sim.metrics import _merge_lanes

    lane = np.array([2, 0, 2, 1, 0, 1])
    key = np.array([1.0, 2.0, 5.0, 3.0, 4.0, 9.0])
    assert _merge_lanes(lane, np.ones(6, np.bool_), key, 3).tolist() == [0, 1, 3, 4, 2, 5]
    assert _merge_lanes(lane, lane != 1, key, 3).tolist() == [0, 1, 4, 2]


def test_the_steps_table_starts_a_step_where_the_one_before_ended():
    """Two eager steps of three ops: step 1 starts at step 0's end, in ms like every column."""
    from test_semantics import three_op_run

    table = simulate_run(three_op_run("eager", steps=2)).steps
    assert table["start_ms"].tolist() == [0.0, pytest.approx(table["end_ms"][0])]
    assert (table["end_ms"] - table["start_ms"]).tolist() == pytest.approx(table["latency_ms"].tolist())
    assert 0.01 < table["end_ms"][1] < 1.0  # two steps of a few tens of µs


def test_a_kernels_front_end_gap_holds_its_stream_but_is_device_idle(tmp_path):
    """Two 10 µs kernels, 1 µs of host work each, a 2 µs front-end gap before each: host k1 [0,1],
    k2 [1,2]; the stream runs k1 [1,13] (its work from 3) and k2 [13,25] (work from 15). The step is
    25 µs, the device works 20 of them (as a profiler would show: a gap before each kernel), the
    summary says which part of the bubble the gaps are, and the trace's events start where the work does."""
    from harness.results.outputs import chrome_trace

    path = tmp_path / "ops.csv"
    path.write_text(f"step,name,kind,device_us,{STAGE_COLUMNS}\n0,k1,vector,10,1,0,0,0,0,0\n0,k2,vector,10,1,0,0,0,0,0\n")
    outcome = simulate_run(compose_run(
        "workload=trace", f"workload.path={path}", "workload.steps=1", "hardware=h100", "hardware.device.kernel_gap_us=2",
        "hardware.host.jitter_cv=0",
    ))
    summary = outcome.summary
    assert summary["step_ms_mean"] * 1e3 == pytest.approx(25.0)
    assert summary["device_busy"] == pytest.approx(20.0 / 25.0)
    # Of the 5 µs of bubble, 1 waits for the host's first launch and 4 are the two gaps.
    assert summary["bubble_front_end"] == pytest.approx(4.0 / 25.0)
    assert outcome.steps["front_end_idle_ms"].tolist() == [pytest.approx(4.0e-3)]
    # The path holds the stream's whole tasks: their work is compute, the two gaps before it front end.
    assert summary["breakdown_compute"] == pytest.approx(20.0 / 25.0)
    assert summary["breakdown_front_end"] == pytest.approx(4.0 / 25.0)
    assert summary["task_ms_per_step"] * 1e3 == pytest.approx(2.0 + 20.0)
    kernels = {e["name"]: (e["ts"], e["dur"]) for e in chrome_trace(outcome, 1)["traceEvents"] if e.get("cat") == "compute"}
    assert kernels == {"k1": (pytest.approx(3.0), pytest.approx(10.0)), "k2": (pytest.approx(15.0), pytest.approx(10.0))}


def test_a_front_end_gap_while_another_stream_works_is_not_idle(tmp_path):
    """a on stream 0 and b on stream 1, independent, 10 µs each, 1 µs of host work each, a 2 µs gap
    before each. Stream 0 holds [1,13] (work from 3), stream 1 [2,14] (work from 4): the device works
    [3,14], 11 µs of the 14 µs step; of its 3 µs idle, [1,3] is front end (stream 1's gap [2,4] overlaps
    a's work from 3: not idle)."""
    path = tmp_path / "ops.csv"
    path.write_text(f"step,name,kind,stream,after,device_us,{STAGE_COLUMNS}\n0,a,vector,0,-,10,1,0,0,0,0,0\n0,b,vector,1,-,10,1,0,0,0,0,0\n")
    summary = simulate_run(compose_run(
        "workload=trace", f"workload.path={path}", "workload.steps=1", "hardware=h100", "hardware.device.kernel_gap_us=2",
        "hardware.host.jitter_cv=0",
    )).summary
    assert summary["step_ms_mean"] * 1e3 == pytest.approx(14.0)
    assert summary["bubble_ratio"] == pytest.approx(3.0 / 14.0)
    assert summary["bubble_front_end"] == pytest.approx(2.0 / 14.0)  # not the leads' sum, 4 µs
