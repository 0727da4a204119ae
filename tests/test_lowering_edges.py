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
  resolved;
* the lowering target's survivors of 2026-12-05: the thread each host stage runs on, the records of tasks
  of no op or no host stage (op -1, stage 0, the pool they hold), the order frees handed to the main thread
  go back in a piecewise replay, an imported profile's per-step costs and waits, the barrier after a replay
  that ends on the device, a kernel on one AI core, a compute-dependent op's 64-byte read-back, the jitter
  generator, an engine's side work and its start, refreshes (none for host code), `lower(only_steps=...)`.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd
import pytest

from harness.config.schema import ArtifactPolicy, Dispatch, EngineConfig, EngineStageConfig, OpKind, OpSpec, StrategyConfig, TrackingConfig
from harness.model.workload import build_workload
from harness.results.outputs import chrome_trace
from harness.sim.kernel import simulate
from harness.sim.lowering import HOST_STAGES, engine_in_effect, lanes_for, lower
from harness.sim.policies import BUILD, EAGER, StepPlan
from harness.sim.simulate import simulate_run
from harness.sim.task_graph import CATEGORY, LANE_HOST
from harness.tracking.store import log_run, read_run_dir
from conftest import compose_run
from test_engine import make_graph
from test_semantics import THREE_OPS, TOKEN_BACK_US, three_op_run
from test_strategies import graph_run, piecewise_run
from test_tracking import NAMES, finished_folder, run_folder
from test_trace_io import STAGES, measured_run

STAGE_FREE = HOST_STAGES.index("free") + 1  # a task's `stage`: 1 + its index in HOST_STAGES


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


# ---------------------------------------------------------------- lowering: mutation survivors (lowering target)


def test_lowering_only_some_steps_lowers_those_steps_alone():
    """`lower(..., only_steps=[2])` of a three-step eager run: one step's tasks, numbered 2, timed as the
    eager three-op step of test_semantics (25 µs, the token's D2H, a 2 µs sync) from 0. The template: the
    h2d issue and its copy, 3 ops × (6 host stages + a device task), the D2H and the sync: 25 tasks."""
    run = three_op_run("eager", steps=3)
    workload = build_workload(run.workload)
    result = simulate(lower(workload, run.hardware, run.strategy, run.seed, only_steps=np.array([2])))
    tasks = result.graph.tasks
    assert len(tasks) == 2 + 3 * 7 + 2 and set(tasks["step"].tolist()) == {2}
    assert result.end_us.max() == pytest.approx(25 + TOKEN_BACK_US + 2)


# s0, s1, s2 (1 µs each) split off, launched eagerly between graph pieces; g (2 µs) the graph's one op.
THREE_SPLIT_OPS = [OpSpec(name="s0.attn", device_us=1.0), OpSpec(name="s1.attn", device_us=1.0), OpSpec(name="s2.attn", device_us=1.0),
                   OpSpec(name="g", device_us=2.0)]


def test_a_piecewise_replays_frees_handed_to_the_main_thread_go_back_oldest_first():
    """Piecewise replay, async dispatch, frees handed back to the main thread one queue length (2) later.
    1 µs host stages, test_strategies' graph costs (10 µs trigger, 0.5 µs graph dispatch). Main thread: h2d
    issue [0,1]; s0 framework/InferShape/Tiling [1,4]; s1's [4,7]; launch thread: s0 alloc/launch [4,6],
    s1's [7,9]. At s2 (2 ops after s0) s0's free, and only it, is due: [7,8] on the main thread; s2's
    stages [8,11], its alloc/launch [11,13]; g's trigger [11,21], g [21,23.5] (2 µs + 0.5 dispatch); the
    frees left, s1's [21,22] and s2's [22,23], then the token's D2H after g and the 2 µs sync: the step is
    23.5 µs + D2H + 2 µs. Handing back s1's free early (newest first) would hold the main thread until s1's launch
    ends at 9 and push the trigger, g and the step 3 µs later."""
    run = piecewise_run(["attn"], ops=THREE_SPLIT_OPS, steps=2)
    run = dataclasses.replace(run, strategy=dataclasses.replace(run.strategy, dispatch=Dispatch["async"], free_on_main=True, queue_capacity=2))
    outcome = simulate_run(run)
    assert outcome.steps["mode"].tolist() == ["build", "replay"]
    assert outcome.steps["latency_ms"][1] * 1e3 == pytest.approx(23.5 + TOKEN_BACK_US + 2)
    tasks, start = outcome.result.graph.tasks, outcome.result.start_us - outcome.steps["start_ms"][1] * 1e3
    main = outcome.result.graph.lane_names.index("host.main")
    frees = np.flatnonzero((tasks["step"] == 1) & (tasks["lane"] == main) & (tasks["stage"] == STAGE_FREE))
    assert [(tasks["op"][i], start[i]) for i in frees] == [(0, pytest.approx(7.0)), (1, pytest.approx(21.0)), (2, pytest.approx(22.0))]


def test_a_replayed_step_that_ends_on_the_device_holds_the_next_step_until_its_last_kernel_ends(tmp_path):
    """An imported step (no token copies, no closing sync) of a (5 µs) then k (3 µs), replayed from a CUDA
    graph on the h100 preset: the step's marker, the 15 µs replay launch [0,15], a [15,20.58] and k
    [20.58,24.16] (0.58 µs of graph dispatch each). The step's last task is k, on the compute stream, not on
    the main thread: the barrier still makes the next step wait for it, so each replay takes 24.16 µs and
    the next one starts 24.16 µs later (not once the main thread is free, at 15 µs, overlapping)."""
    outcome = measured_run(tmp_path, f"step,name,kind,stream,device_us,after,{STAGES}\n"
                           "0,a,vector,0,5,-,2,0,0,0,1,0\n" "0,k,vector,0,3,0,2,0,0,0,1,0\n", "strategy=cuda_graph", "workload.repeat=3")
    steps = outcome.steps
    assert steps["mode"].tolist() == ["build", "replay", "replay"]
    replay_us = 15.0 + (5.0 + 0.58) + (3.0 + 0.58)
    assert steps["latency_ms"][1:].to_numpy() * 1e3 == pytest.approx([replay_us] * 2)
    assert (steps["start_ms"][2] - steps["start_ms"][1]) * 1e3 == pytest.approx(replay_us)
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(replay_us)


def test_the_lanes_of_a_dispatch_mode_without_a_workload():
    """`lanes_for` with no workload: the dispatch mode's host threads, the CPU-op lane, the two streams every
    run has (compute and communication) and the two copy engines; no external or engine lane."""
    lanes = lanes_for(StrategyConfig(dispatch=Dispatch["async"]))
    assert lanes.names == ["host.main", "host.launch", "host.cpu_ops", "device.stream0", "device.comm", "copy.h2d", "copy.d2h"]
    assert (lanes.cpu, lanes.stream, lanes.h2d, lanes.d2h, lanes.external, lanes.engine_output, lanes.engine_api) == (2, {0: 3, 1: 4}, 5, 6, -1, -1, -1)


def test_an_engine_with_nothing_to_do_keeps_its_switches_in_an_eager_run():
    """An engine whose async output needs graphs is turned to inline output in an eager run (vLLM 0.6's
    enforce_eager), with a note: but only an engine that runs. The preset `none` (no costs) with those
    switches on is no engine: the run comes back as it was, with no note."""
    run = dataclasses.replace(three_op_run("eager"), engine=EngineConfig(async_output=True, async_output_needs_graphs=True))
    assert not run.engine.active
    assert engine_in_effect(run) == (run, "")
    active = dataclasses.replace(run, engine=dataclasses.replace(run.engine, output=EngineStageConfig(per_step_us=4.0)))
    changed, note = engine_in_effect(active)
    assert changed.engine.async_output is False and note.startswith("engine ")


def test_a_sink_replays_trigger_is_for_no_one_op():
    """Graph sink replay (test_strategies' costs): h2d issue [0,1], the addresses updated [1,4], one 4 µs
    trigger [4,8], a, b, c with 0.5 µs of dispatch each [8,24.5], the token's D2H and a 2 µs sync. The
    update and the trigger are the step's, of no op: trace.json names them after the step, as it names
    the h2d issue and the sync, and the trigger is the step's one launch. All four are host work."""
    outcome = simulate_run(graph_run("sink"))
    steps = outcome.steps
    assert steps["mode"].tolist() == ["build", "replay", "replay", "replay"]
    assert steps["latency_ms"][1] * 1e3 == pytest.approx(24.5 + TOKEN_BACK_US + 2)
    assert steps["launches"].tolist() == [3, 1, 1, 1]
    lanes = outcome.result.graph.lane_names
    main = [(e["name"], e["ts"], e["dur"]) for e in chrome_trace(outcome, 4)["traceEvents"]
            if e["ph"] == "X" and lanes[e["tid"]] == "host.main" and e["args"]["step"] == 1]
    main = [(name, round(ts - main[0][1], 6), dur) for name, ts, dur in main]  # from the step's first task
    tasks = outcome.result.graph.tasks
    on_main = (tasks["step"] == 1) & (tasks["lane"] == lanes.index("host.main"))
    assert tasks["op"][on_main].tolist() == [-1, -1, -1, -1]  # -1: no op
    assert tasks["pool"][on_main].tolist() == [0, 0, 0, 0]  # each holds a host core
    assert main == [("step launch", 0.0, 1.0), ("step graph", 1.0, 3.0), ("step launch", 4.0, 4.0), ("step sync", pytest.approx(24.5 + TOKEN_BACK_US, abs=1e-3), 2.0)]  # trace.json: to the ns


def test_an_eager_steps_records_name_their_op_and_host_stage_and_no_other():
    """The eager three-op step's 25 records in template order: the h2d issue and its copy (no op, no
    stage); per op its framework, InferShape, Tiling, alloc and launch (stages 1-5), its device task
    (stage 0), its free (stage 6); the token's D2H and the sync (no op, no stage). `op` is -1 and `stage`
    0 for a task of no op or no host stage (task_graph.TASK_DTYPE)."""
    tasks = simulate_run(three_op_run("eager")).result.graph.tasks
    per_op = lambda j: [j] * 7  # noqa: E731
    assert tasks["op"].tolist() == [-1, -1, *per_op(0), *per_op(1), *per_op(2), -1, -1]
    assert tasks["stage"].tolist() == [0, 0, *[1, 2, 3, 4, 5, 0, 6] * 3, 0, 0]
    assert tasks["category"][-2:].tolist() == [CATEGORY["copy"], CATEGORY["sync"]]


def test_an_engine_with_nothing_to_do_adds_no_tasks():
    """A run's default engine (the preset `none`: no costs) is no engine: the eager three-op step keeps its 25
    tasks (test above), none of them the engine's, and its hand-computed 25 µs + D2H + 2 µs."""
    run = three_op_run("eager")
    assert not run.engine.active
    outcome = simulate_run(run)
    tasks = outcome.result.graph.tasks
    assert len(tasks) == 25 and not np.any(tasks["category"] == CATEGORY["engine"])
    assert outcome.steps["latency_ms"][0] * 1e3 == pytest.approx(25 + TOKEN_BACK_US + 2)


def test_a_compute_dependent_ops_shape_comes_back_in_64_bytes():
    """b's output shape is known only once b ran: 64 bytes back over PCIe (1 µs + 64 B / 32 GB/s =
    1.002 µs) and a 2 µs sync before c is issued. Eager: a's stages [1,7], a [6,8]; b's [7,13], b [12,22];
    the shape's D2H [22,23.002], the sync [23.002,25.002]; c's stages [25.002,31.002], c [30.002,33.002];
    the token's D2H and the 2 µs sync: 35.002 µs + D2H."""
    ops = [THREE_OPS[0], dataclasses.replace(THREE_OPS[1], compute_dependent=True), THREE_OPS[2]]
    outcome = simulate_run(three_op_run("eager", ops=ops))
    # b ends at 22; the shape's copy and sync; c's five stages up to its launch, c's 3 µs; the token's D2H and sync
    assert outcome.steps["latency_ms"][0] * 1e3 == pytest.approx(22 + (1 + 64 / 32_000) + 2 + 5 + 3 + TOKEN_BACK_US + 2, abs=1e-9)


def test_a_kernel_on_one_ai_core_holds_it(tmp_path):
    """A kernel of no FLOPs runs on one AI core (device.block_dim). On a device of one AI core, a and b on
    two compute streams, neither waiting for the other (imported profile: 2 µs framework, 1 µs launch):
    a launched at 3 runs [3,13]; b, launched at 6 on stream 2, waits for a's core and runs [13,23]. Each
    holds the core (pool 1, 1 unit)."""
    outcome = measured_run(tmp_path, f"step,name,kind,stream,device_us,after,{STAGES}\n"
                           "0,a,vector,0,10,-,2,0,0,0,1,0\n" "0,b,vector,2,10,-,2,0,0,0,1,0\n", "hardware.device.ai_cores=1")
    result = outcome.result
    device = np.flatnonzero(result.graph.tasks["category"] == CATEGORY["compute"])
    assert [(result.start_us[i], result.end_us[i]) for i in device] == [(3.0, 13.0), (13.0, 23.0)]
    assert result.graph.tasks["pool"][device].tolist() == [1, 1] and result.graph.tasks["units"][device].tolist() == [1, 1]
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(23.0)


def test_an_eager_step_pays_no_graph_exit_gap_however_long():
    """The graph exit gap is paid by a kernel launched alone right after a graph's tasks on its stream; an
    eager step has no graph, so its first kernel on each stream pays none either. With a 10 µs exit gap
    (longer than the 4 µs the host leaves between a's end at 8 and b's launch at 12, which would hide a
    shorter one: a [6,18] would push b to [18,28], c to [28,31]) the eager three-op step is still a [6,8], b
    [12,22], c [22,25]: 25 µs + D2H + 2 µs, none of it front-end idle."""
    run = three_op_run("eager")
    run = dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, graph=dataclasses.replace(run.hardware.graph, exit_gap_us=10.0)))
    steps = simulate_run(run).steps
    assert steps["latency_ms"][0] * 1e3 == pytest.approx(25 + TOKEN_BACK_US + 2)
    assert steps["front_end_idle_ms"][0] == 0.0


def test_a_serving_graph_runs_records_in_template_order():
    """Every task of a serving engine's build step and replay step, in template order, as (lane, op, pool,
    stage): an engine scheduling ahead, with its outputs on a thread and its API server in a process of their
    own, under a whole-graph capture of a, b (dynamic), c. Tasks of no op (the engine's, the token copies'
    issue and sync, the replay's trigger, the capture) have op -1; a task on a host thread holds a host core
    (pool 0), a kernel an AI core (pool 1), a copy, the step's opening marker and the API server's process
    (a core of its own, not one of hardware.host.threads) nothing (-1); `stage` is the host stage + 1 (the
    trigger is the replay's launch, 5), 0 for the rest."""
    run = graph_run("capture", ops=DYNAMIC_B, steps=2)
    run = dataclasses.replace(run, engine=EngineConfig(schedule=EngineStageConfig(per_step_us=1.0), async_scheduling=True,
                                                       async_output=True, api_process=True))
    graph = simulate_run(run).result.graph
    tasks = graph.tasks

    def records(step):
        mine = tasks[tasks["step"] == step]
        return [(graph.lane_names[r["lane"]], r["op"], r["pool"], r["stage"]) for r in mine]

    main, out, api, h2d, d2h, stream = "host.main", "engine.output", "engine.api", "copy.h2d", "copy.d2h", "device.stream0"
    opening = [(main, -1, -1, 0), (main, -1, 0, 0), (out, -1, 0, 0), (api, -1, -1, 0),  # marker, schedule, side work
               (main, -1, 0, 0), (h2d, -1, -1, 0)]  # the token copy's issue, the copy
    closing = [(main, -1, 0, 0), (d2h, -1, -1, 0), (main, -1, 0, 0),  # schedule ahead, the token's D2H, the sync
               (main, -1, 0, 0), (main, -1, 0, 0), (main, -1, 0, 0)]  # sample, outputs and API inline (nothing to do)
    eager_op = lambda j: [(main, j, 0, 1), (main, j, 0, 2), (main, j, 0, 3), (main, j, 0, 4), (main, j, 0, 5),  # noqa: E731
                          (stream, j, 1, 0), (main, j, 0, 6)]
    assert records(0) == opening + eager_op(0) + eager_op(1) + eager_op(2) + closing + [(main, -1, 0, 0)]  # + the capture
    assert records(1) == opening + [(main, 1, 0, 0), (main, -1, 0, 5),  # b's refresh, the trigger
                                    (stream, 0, 1, 0), (stream, 1, 1, 0), (stream, 2, 1, 0)] + closing
    host = tasks["pool"] == 0
    assert (tasks["units"][host] == 1).all() and (tasks["units"][tasks["pool"] == -1] == 0).all()


def test_a_graph_pieces_refreshes_after_its_launch_are_host_work_too():
    """Piecewise replay, b split off, b and c dynamic, refreshed after the launch (vllm-ascend): b's refresh
    before its own stages, c's after its piece's trigger; on a host twice as fast each takes 3.5 µs of the
    7 µs preset and holds a host core (pool 0, 1 unit)."""
    ops = [DYNAMIC_B[0], DYNAMIC_B[1], dataclasses.replace(DYNAMIC_B[2], dynamic=True)]
    run = piecewise_run(["b"], ops=ops)
    graph = dataclasses.replace(run.strategy.graph, refresh_after_launch=True)
    host = dataclasses.replace(run.hardware.host, speed=2.0)
    run = dataclasses.replace(run, strategy=dataclasses.replace(run.strategy, graph=graph), hardware=dataclasses.replace(run.hardware, host=host))
    outcome = simulate_run(run)
    tasks, start, end = outcome.result.graph.tasks, outcome.result.start_us, outcome.result.end_us
    refresh = np.flatnonzero((tasks["category"] == CATEGORY["graph"]) & (tasks["step"] == 1))
    assert [(tasks["op"][i], tasks["pool"][i], tasks["units"][i]) for i in refresh] == [(1, 0, 1), (2, 0, 1)]
    assert (end - start)[refresh].tolist() == pytest.approx([3.5, 3.5])


def test_an_engine_working_inline_has_no_side_work_in_its_steps():
    """An engine that processes its outputs and serves its API on its main thread has no side lanes and no
    side tasks: its eager three-op step is the opening marker, the scheduling, the token copy's issue and
    copy, the ops' tasks, the (empty) scheduling ahead, the token's D2H and sync, then sampling, outputs and
    API inline: 4 + 21 + 6 = 31 tasks, none on another host lane."""
    run = dataclasses.replace(three_op_run("eager"), engine=EngineConfig(output=EngineStageConfig(per_step_us=4.0),
                                                                        api=EngineStageConfig(per_step_us=3.0)))
    graph = simulate_run(run).result.graph
    assert graph.lane_names == ["host.main", "host.cpu_ops", "device.stream0", "device.comm", "copy.h2d", "copy.d2h"]
    records = [(graph.lane_names[r["lane"]], r["op"], r["pool"]) for r in graph.tasks]
    main, h2d, d2h, stream = "host.main", "copy.h2d", "copy.d2h", "device.stream0"
    per_op = lambda j: [(main, j, 0)] * 5 + [(stream, j, 1), (main, j, 0)]  # noqa: E731
    assert records == [(main, -1, -1), (main, -1, 0), (main, -1, 0), (h2d, -1, -1), *per_op(0), *per_op(1), *per_op(2),
                       (main, -1, 0), (d2h, -1, -1), (main, -1, 0), (main, -1, 0), (main, -1, 0), (main, -1, 0)]


def test_a_launch_group_led_by_the_steps_first_op_is_one_launch(tmp_path):
    """g, the step's first op (op 0), launches its graph's two kernels, g and h, in one call: 3 µs framework,
    7 µs launch [3,10]; g [10,15], h [15,22] (4 and 6 µs, +1 µs device-side dispatch each). h has no host
    work of its own: one launch a step, no task on the host for h."""
    outcome = measured_run(
        tmp_path,
        f"step,name,kind,stream,device_us,after,group,in_graph,{STAGES}\n"
        "0,g,cube,0,4,-,0,1,3,0,0,0,7,0\n"
        "0,h,cube,0,6,0,0,1,0,0,0,0,0,0\n",
        "hardware.graph.task_dispatch_us=1",
    )
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(22.0)
    assert outcome.summary["launches_per_step"] == 1
    tasks = outcome.result.graph.tasks
    host = outcome.result.graph.lane_kinds[tasks["lane"]] == LANE_HOST
    assert sorted(set(tasks["op"][host].tolist())) == [-1, 0]


def test_an_engines_api_process_starts_with_the_step_and_its_output_thread_after_scheduling():
    """An engine scheduling each step in 5 µs, its outputs on a thread of its own (4 µs a step) and its API
    server in a process of its own (3 µs a step). In step 1 (from its start) the API process handles step 0's
    outputs at once, [0,3]; the output thread is the engine's own and starts once the step is scheduled,
    [5,9]."""
    run = dataclasses.replace(three_op_run("eager", steps=2), engine=EngineConfig(
        schedule=EngineStageConfig(per_step_us=5.0), output=EngineStageConfig(per_step_us=4.0), api=EngineStageConfig(per_step_us=3.0),
        async_output=True, api_process=True))
    outcome = simulate_run(run)
    graph, start, end = outcome.result.graph, outcome.result.start_us, outcome.result.end_us
    step_start = start[graph.tasks["step"] == 1].min()
    side = {}
    for lane in ("engine.output", "engine.api"):
        (i,) = np.flatnonzero((graph.tasks["step"] == 1) & (graph.tasks["lane"] == graph.lane_names.index(lane)))
        side[lane] = (start[i] - step_start, end[i] - step_start)
    assert side == {"engine.output": pytest.approx((5.0, 9.0)), "engine.api": pytest.approx((0.0, 3.0))}


@pytest.mark.parametrize("dispatch, lanes", [
    ("eager", ["host.main"] * 6),
    ("async", ["host.main"] * 3 + ["host.launch"] * 3),
    ("pipeline", ["host.infer", "host.infer", "host.tiling", "host.launch", "host.launch", "host.launch"]),
])
def test_each_host_stage_runs_on_its_dispatch_modes_thread(dispatch, lanes):
    """framework, InferShape, Tiling, alloc, launch, free of op a, by dispatch mode (the module docstring):
    eager all on the main thread; async the first three on the main thread, the rest on the launch thread;
    pipeline framework + InferShape | Tiling | alloc + launch + free on three threads."""
    graph = simulate_run(three_op_run(dispatch)).result.graph
    tasks = graph.tasks
    of_a = np.flatnonzero((tasks["op"] == 0) & (tasks["stage"] > 0))
    assert tasks["stage"][of_a].tolist() == [1, 2, 3, 4, 5, 6]
    assert [graph.lane_names[k] for k in tasks["lane"][of_a]] == lanes


@pytest.mark.parametrize("cv", [0.2, 1.0])
def test_host_jitter_is_drawn_from_the_documented_generator(cv):
    """Step s's host jitter comes from numpy's generator seeded (seed, 0, s): lognormal with mean 1 and the
    configured coefficient of variation, so with σ² = ln(1 + cv²) the draws are lognormal(-σ²/2, σ)."""
    from harness.sim.lowering import _jitter

    sigma2 = np.log(1 + cv * cv)
    expected = np.stack([np.random.default_rng([5, 0, s]).lognormal(-sigma2 / 2, np.sqrt(sigma2), size=3) for s in (4, 9)])
    assert _jitter(5, np.array([4, 9]), cv, 3) == pytest.approx(expected, rel=1e-12)


def test_an_imported_profiles_costs_and_waits_are_those_of_each_step(tmp_path):
    """A two-step profile of one op k. Step 0: 2 µs framework, 1 µs launch [2,3], its stream busy with unseen
    work until 10: k [10,13]. Step 1: 6 µs framework, launch [6,7], unseen work until 2: k [7,10]. Each step
    reads its own row of costs and waits: 13 µs and 10 µs (step 0's costs would make step 1 6 µs, its wait
    13 µs)."""
    outcome = measured_run(tmp_path, f"step,name,kind,stream,device_us,after,not_before_us,{STAGES}\n"
                           "0,k,vector,0,3,-,10,2,0,0,0,1,0\n" "1,k,vector,0,3,-,2,6,0,0,0,1,0\n")
    assert outcome.steps["latency_ms"].to_numpy() * 1e3 == pytest.approx([13.0, 10.0])


def test_a_replay_refreshes_no_host_op_even_a_dynamic_one():
    """a, h (host code, 1 µs, its shapes dynamic), c under a whole-graph capture: the graph skips h, so a
    replay has no argument of h's to refresh. Replay: h2d issue [0,1], the 10 µs trigger [1,11], a [11,13.5],
    c [13.5,17] (0.5 µs dispatch each), the token's D2H and the 2 µs sync; no refresh (7 µs) anywhere."""
    ops = [OpSpec(name="a", device_us=2.0), OpSpec(name="h", kind=OpKind.host, host_us=1.0, dynamic=True), OpSpec(name="c", device_us=3.0)]
    outcome = simulate_run(graph_run("capture", ops=ops))
    steps = outcome.steps
    assert steps["mode"].tolist() == ["build", "replay", "replay", "replay"]
    assert steps["latency_ms"][1:].to_numpy() * 1e3 == pytest.approx([17 + TOKEN_BACK_US + 2] * 3)
    tasks = outcome.result.graph.tasks
    assert not np.any((tasks["category"] == CATEGORY["graph"]) & (tasks["step"] > 0))
