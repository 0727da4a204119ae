"""Edges of the lowering, the kernel's per-step tables and the MLflow store that mutation testing found
unpinned (docs/testing.md, "Survivors not judged equivalent"), each on a tiny run worked out by hand:

* a step's critical path in a graph whose steps are one task each (kernel `_step_category_us`);
* the barrier between two runs of steps in different modes comes from the last step of the first run
  (`Lowering._tile`'s `last_on_lane`);
* markers and side work of no op stay unnamed in trace.json (the step's first task of an imported profile,
  a serving engine's side lanes);
* an engine with nothing to do adds no lanes (`lanes_for`);
* a replay's argument refreshes are host work: they hold a host core and run at the host's speed;
* the store stamps metrics in milliseconds, and a run logged later reads its config with interpolations
  resolved.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd
import pytest

from harness.config.schema import ArtifactPolicy, EngineConfig, EngineStageConfig, OpKind, OpSpec, TrackingConfig
from harness.model.workload import build_workload
from harness.results.outputs import chrome_trace
from harness.sim.kernel import simulate
from harness.sim.lowering import lower
from harness.sim.policies import BUILD, EAGER, StepPlan
from harness.sim.simulate import simulate_run
from harness.sim.task_graph import CATEGORY
from harness.tracking.store import log_run, read_run_dir
from conftest import compose_run
from test_engine import make_graph
from test_semantics import TOKEN_BACK_US, three_op_run
from test_strategies import graph_run, piecewise_run
from test_tracking import NAMES, finished_folder, run_folder
from test_trace_io import STAGES, measured_run


# ---------------------------------------------------------------- kernel: per-step tables


def test_a_step_of_one_task_has_that_task_as_its_critical_path():
    """Two steps of one task each on one lane: step 0's compute task [0, 2], step 1's [2, 5]. Each step's
    critical path is its only task: 2 µs and 3 µs of compute, and so is the work of all its tasks. (A
    lowered step has two tasks or more; a graph handed to `simulate` may have steps of one.)"""
    graph = make_graph(lanes=[0, 0], pools=[-1, -1], units=[0, 0], durations=[2.0, 3.0], deps=[[], []], capacity=[1])
    graph.tasks["step"] = [0, 1]
    graph.tasks["category"] = CATEGORY["compute"]
    result = simulate(graph)
    assert result.end_us.tolist() == [2.0, 5.0]
    on_path, all_tasks = result.step_category_us()
    assert on_path[:, CATEGORY["compute"]].tolist() == [2.0, 3.0] and on_path.sum() == 5.0
    assert all_tasks[:, CATEGORY["compute"]].tolist() == [2.0, 3.0] and all_tasks.sum() == 5.0


# ---------------------------------------------------------------- lowering: runs of steps in different modes

# a (5 µs) on the compute stream, b a 50 µs collective after a, c (5 µs) after a.
COLLECTIVE_OPS = [OpSpec(name="a", kind=OpKind.cube, device_us=5.0), OpSpec(name="b", kind=OpKind.comm, device_us=50.0, after=[0]),
                  OpSpec(name="c", kind=OpKind.cube, device_us=5.0, after=[0])]


def test_the_step_after_a_run_of_steps_waits_for_that_runs_last_step():
    """Steps 0 and 1 eager, step 2 building a graph: two runs of steps, each tiled from its own template.
    Eager step (1 µs host stages, test_semantics): h2d issue [0,1]; a launched at 6, runs [6,11]; b launched
    at 12, runs [12,62] on the comm stream; c launched at 18, runs [18,23]; the token's D2H and the 2 µs sync
    end at 25 µs + D2H. The step ends with b at 62 µs. Step 2 starts when step 1's collective ends, at 124 µs,
    not when step 1's main thread is done (88.000125 µs) nor when step 0's last tasks ended."""
    run = three_op_run("eager", ops=COLLECTIVE_OPS, steps=3)
    workload = build_workload(run.workload)
    plan = StepPlan.host_only(workload)
    plan.mode[:] = [EAGER, EAGER, BUILD]
    result = simulate(lower(workload, run.hardware, run.strategy, run.seed, plan))
    tasks = result.graph.tasks
    assert [result.start_us[tasks["step"] == s].min() for s in range(3)] == pytest.approx([0.0, 62.0, 124.0])
    collective = tasks["category"] == CATEGORY["comm"]
    assert result.start_us[collective].tolist() == pytest.approx([12.0, 74.0, 136.0])
    # Step 2 builds its graph (50 ms of capture) on the main thread after its sync: 124 + 25 + D2H + 50 000.
    assert result.end_us.max() == pytest.approx(124.0 + 25.0 + TOKEN_BACK_US + 50_000.0)


# ---------------------------------------------------------------- lowering: what trace.json names


def test_the_first_task_of_an_imported_step_is_a_marker_not_an_event(tmp_path):
    """An imported profile's step starts with a zero-length task of no op (no token copy): trace.json leaves
    it out. c, carried in, runs [0,5]; k: framework [0,2], zero-cost stages, launch [2,3], its stream busy
    with unseen work [0,10], then k [10,13]; k's free (0 µs) at 3. Nothing is named after op c or k that
    is not theirs."""
    outcome = measured_run(
        tmp_path,
        f"step,name,kind,stream,device_us,after,carried_in,not_before_us,{STAGES}\n"
        "0,c,vector,0,5,-,1,,0,0,0,0,0,0\n"
        "0,k,vector,0,3,0,0,10,2,0,0,0,1,0\n",
    )
    lanes = outcome.result.graph.lane_names
    events = [(e["name"], lanes[e["tid"]], e["ts"], e["dur"]) for e in chrome_trace(outcome, 1)["traceEvents"] if e["ph"] == "X"]
    assert events == [
        ("c", "device.stream0", 0.0, 5.0),
        ("k framework", "host.main", 0.0, 2.0),
        ("k infer_shape", "host.main", 2.0, 0.0),
        ("k tiling", "host.main", 2.0, 0.0),
        ("k alloc", "host.main", 2.0, 0.0),
        ("k launch", "host.main", 2.0, 1.0),
        ("k external", "device.unseen", 0.0, 10.0),
        ("k", "device.stream0", 10.0, 3.0),
        ("k alloc", "host.main", 3.0, 0.0),
    ]
    first = outcome.result.graph.tasks[0]
    assert (first["op"], first["duration_us"], first["category"]) == (-1, 0.0, CATEGORY["framework"])


@pytest.mark.parametrize("strategy", ["eager", "cuda_graph"])
def test_a_group_led_by_an_op_launched_before_the_step_was_issued_before_it_too(tmp_path, strategy):
    """c, carried in, leads a launch group that f belongs to (one call launched both, before the step): f
    has no launch in the step either, host-scheduled or replayed. c runs 5 µs on stream 0, f after it:
    at once eagerly, after the h100's 0.58 µs graph-node dispatch in a replay; the same as f marked
    carried in itself. It stopped the run before ("every dependency must point to a lower task id"): f
    took its launch from c's, which the step never made."""
    dispatch_us = compose_run("hardware=h100").hardware.graph.task_dispatch_us if strategy == "cuda_graph" else 0.0  # 0.58
    f_start_us = 5.0 + dispatch_us
    header = f"step,name,kind,stream,device_us,after,group,carried_in,{STAGES}\n"
    grouped = measured_run(tmp_path, header + "0,c,vector,0,5,-,0,1,0,0,0,0,0,0\n" "0,f,vector,0,3,0,0,0,0,0,0,0,1,0\n",
                           f"strategy={strategy}", "workload.repeat=3")
    lanes = grouped.result.graph.lane_names
    device = [(e["name"], lanes[e["tid"]], e["ts"], e["dur"]) for e in chrome_trace(grouped, 1)["traceEvents"]
              if e["ph"] == "X" and lanes[e["tid"]].startswith("device")]
    step_start = device[0][2]  # the step shown: the first measured one (a graph's capture comes before it)
    assert [(name, lane, round(ts - step_start, 9), dur) for name, lane, ts, dur in device] == [
        ("c", "device.stream0", 0.0, 5.0), ("f", "device.stream0", f_start_us, 3.0)]
    both_carried = measured_run(tmp_path, header + "0,c,vector,0,5,-,,1,0,0,0,0,0,0\n" "0,f,vector,0,3,0,,1,0,0,0,0,1,0\n",
                                f"strategy={strategy}", "workload.repeat=3")
    # the step ends with f: in a replay c too waits its 0.58 µs dispatch, so the step is 0.58 + 5.58 + 3
    assert grouped.summary["step_ms_mean"] == both_carried.summary["step_ms_mean"]
    assert grouped.summary["step_ms_mean"] * 1000 == pytest.approx(dispatch_us + f_start_us + 3.0)


@pytest.mark.parametrize("leader_kind", ["host", "sync"])
def test_a_group_led_by_an_op_that_launches_nothing_is_refused_in_one_line(tmp_path, leader_kind):
    """A host or sync op issues no kernel, so no op can be issued by its launch: the file is refused, naming
    the row, the column and the value (it stopped the run with an internal error before)."""
    from harness.base.errors import ConfigError

    body = f"name,kind,stream,device_us,after,group\nh,{leader_kind},0,0,-,0\nk,vector,0,3,0,0\n"
    with pytest.raises(ConfigError) as raised:
        measured_run(tmp_path, body)
    assert str(raised.value) == (f"workload.path={str(tmp_path / 'ops.csv')!r} line 3 column 'group': '0' names a {leader_kind} op, which"
                                 " launches nothing: ops of a group are issued by their leader's launch")


def test_an_engines_side_lanes_hold_work_of_no_op():
    """An engine whose outputs are processed on its own thread (4 µs a step) and whose API server is a
    process of its own (3 µs a step): in step 1 both handle step 0's outputs from the step's start,
    28.000125 µs (the eager three-op step: 25 µs, the token's D2H, a 2 µs sync), while the model runs.
    Their work is the step's, of no op: trace.json calls it `step engine`; step 0's side tasks have
    nothing to do (no outputs before it) and are markers, left out."""
    run = dataclasses.replace(three_op_run("eager", steps=2), engine=EngineConfig(
        output=EngineStageConfig(per_step_us=4.0), api=EngineStageConfig(per_step_us=3.0), async_output=True, api_process=True))
    outcome = simulate_run(run)
    graph = outcome.result.graph
    assert outcome.steps["latency_ms"][0] * 1e3 == pytest.approx(25 + TOKEN_BACK_US + 2)
    side = np.isin(graph.tasks["lane"], [graph.lane_names.index("engine.output"), graph.lane_names.index("engine.api")])
    assert graph.tasks["op"][side].tolist() == [-1, -1, -1, -1]
    events = [(e["name"], graph.lane_names[e["tid"]], e["ts"], e["dur"]) for e in chrome_trace(outcome, 2)["traceEvents"]
              if e["ph"] == "X" and graph.lane_names[e["tid"]].startswith("engine")]
    assert events == [("step engine", "engine.output", 28.0, 4.0), ("step engine", "engine.api", 28.0, 3.0)]


def test_an_engine_with_nothing_to_do_adds_no_lanes():
    """The engine preset `none` with its switches on but no costs is no engine: no output thread, no API
    process among the lanes (trace.json lists every lane as a thread)."""
    run = dataclasses.replace(three_op_run("eager"), engine=EngineConfig(async_output=True, output_process=True, api_process=True))
    assert not run.engine.active
    outcome = simulate_run(run)
    assert outcome.result.graph.lane_names == ["host.main", "host.cpu_ops", "device.stream0", "device.comm", "copy.h2d", "copy.d2h"]
    threads = [e["args"]["name"] for e in chrome_trace(outcome, 1)["traceEvents"] if e["name"] == "thread_name"]
    assert threads == outcome.result.graph.lane_names


# ---------------------------------------------------------------- lowering: a replay's refreshes are host work

DYNAMIC_B = [OpSpec(name="a", device_us=2.0), OpSpec(name="b", device_us=10.0, dynamic=True), OpSpec(name="c", device_us=3.0)]


def test_a_replays_refresh_runs_at_the_hosts_speed_on_a_host_core():
    """test_strategies' whole-graph replay on a host twice as fast: h2d issue [0,0.5]; b's 7 µs refresh
    [0.5,4]; the 10 µs launch [4,9]; a, b, c with 0.5 µs of dispatch each [9,25.5]; the token's D2H, a
    1 µs sync. The refresh holds a host core like every task on a host thread."""
    run = graph_run("capture", ops=DYNAMIC_B)
    run = dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, host=dataclasses.replace(run.hardware.host, speed=2.0)))
    outcome = simulate_run(run)
    assert outcome.steps["mode"].tolist() == ["build", "replay", "replay", "replay"]
    assert outcome.steps["latency_ms"][1:].to_numpy() * 1e3 == pytest.approx([25.5 + TOKEN_BACK_US + 1.0] * 3)
    tasks, start, end = outcome.result.graph.tasks, outcome.result.start_us, outcome.result.end_us
    refresh = np.flatnonzero((tasks["category"] == CATEGORY["graph"]) & (tasks["step"] == 1))
    assert [(tasks["op"][i], tasks["pool"][i], tasks["units"][i]) for i in refresh] == [(1, 0, 1)]
    step_start = outcome.steps["start_ms"][1] * 1e3
    assert (start[refresh[0]] - step_start, end[refresh[0]] - step_start) == pytest.approx((0.5, 4.0))


def test_a_split_ops_refresh_after_the_launch_is_host_work_too():
    """Piecewise replay with b split off and refreshed after the launch (vllm-ascend): b's 7 µs refresh
    comes before its own host stages; on a host twice as fast it takes 3.5 µs and holds a host core."""
    run = piecewise_run(["b"], ops=DYNAMIC_B)
    graph = dataclasses.replace(run.strategy.graph, refresh_after_launch=True)
    host = dataclasses.replace(run.hardware.host, speed=2.0)
    run = dataclasses.replace(run, strategy=dataclasses.replace(run.strategy, graph=graph), hardware=dataclasses.replace(run.hardware, host=host))
    outcome = simulate_run(run)
    tasks, start, end = outcome.result.graph.tasks, outcome.result.start_us, outcome.result.end_us
    refresh = np.flatnonzero((tasks["category"] == CATEGORY["graph"]) & (tasks["step"] == 1))
    assert [(tasks["op"][i], tasks["pool"][i], tasks["units"][i]) for i in refresh] == [(1, 0, 1)]
    assert (end - start)[refresh].tolist() == pytest.approx([3.5])


# ---------------------------------------------------------------- the store


def test_metrics_are_stamped_in_milliseconds_since_the_epoch(tmp_path):
    """MLflow keeps a metric's timestamp in ms: every value logged carries the time of logging, between
    the clock read before the call and after it."""
    import mlflow

    store = f"sqlite:///{tmp_path / 'store.db'}"
    tracking = TrackingConfig(uri=store, experiment="stamps", artifacts=ArtifactPolicy.none)
    folder = run_folder(tmp_path)
    steps = pd.DataFrame({"step": [0, 1], "latency_ms": [3.0, 2.0], "measured": [False, True]})
    before_ms = int(time.time() * 1000)
    run_id = log_run(tracking, folder, {"throughput_tok_s": 12.5, "bound": "host"}, steps, {"seed": 0}, NAMES)
    after_ms = int(time.time() * 1000) + 1
    client = mlflow.MlflowClient(tracking_uri=store)
    stamps = [m.timestamp for key in ("headline/throughput_tok_s", "series/step_ms", "series/warmup_step_ms")
              for m in client.get_metric_history(run_id, key)]
    assert len(stamps) == 3 and all(before_ms <= t <= after_ms for t in stamps), (before_ms, stamps, after_ms)


def test_a_run_logged_later_reads_its_config_with_interpolations_resolved(tmp_path):
    """Hydra keeps .hydra/config.yaml unresolved: `${...}` stays in the file. The params logged later are
    the values the run used: tracking.experiment = ${workload.name} is `w7`, not the interpolation."""
    folder = finished_folder(tmp_path / "run")
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text("workload:\n  name: w7\n  steps: 4\ntracking:\n  experiment: ${workload.name}\n"
                                                  "output:\n  steps: ${workload.steps}\n")
    _, _, params, _, _ = read_run_dir(folder)
    assert params == {"workload.name": "w7", "workload.steps": 4, "tracking.experiment": "w7", "output.steps": 4}
