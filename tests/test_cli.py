"""`python -m harness` as a user runs it: files, exit codes, one-line errors, MLflow."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from conftest import compose_run, read_local_artifact, run_cli
from harness.sim.task_graph import CATEGORIES

CONTRACT_KEYS = {
    "throughput_tok_s", "step_ms_mean", "step_ms_p50", "step_ms_p99", "bubble_ratio", "device_busy", "host_busy_max",
    "bound", "bound_reason", "ops_per_step", "launches_per_step", "tasks_simulated", "sim_wall_s",
} | {f"breakdown_{c}" for c in CATEGORIES}


def test_default_run_writes_the_contract_files(tmp_path, repo_root):
    run_dir = tmp_path / "run"
    proc = run_cli("tracking.enabled=false", f"hydra.run.dir={run_dir}", "workload.steps=8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert CONTRACT_KEYS <= summary.keys()
    assert summary["bound"] == "host" and summary["workload"] == "llama2_7b_decode"
    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert len(steps) == 8 and {"latency_ms", "device_busy_ms", "bubble_ratio"} <= set(steps.columns)
    trace = json.loads((run_dir / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"host.main", "device.stream0"} <= names
    assert any(e.get("ph") == "X" and e["cat"] == "compute" for e in trace["traceEvents"])
    assert "throughput" in proc.stdout and "bound" in proc.stdout
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # tracking off: no store


def test_prefill_run_reports_ttft(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("strategy=eager", "workload=llama2_7b_prefill", "tracking.enabled=false", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ttft_ms"] > 0 and summary["bound"] == "device"


@pytest.mark.parametrize(
    "override,named",
    [("workload.batch_size=0", "workload.batch_size=0"), ("hardware.device.hbm_gbps=-1", "hardware.device.hbm_gbps=-1"), ("nokey=3", "nokey"),
     # OmegaConf's own words were printed: "Invalid value assigned: int is not a ListConfig, list or tuple.; full_key: …"
     ("strategy.graph.buckets=8", "hostbound: error: strategy.graph.buckets=8: must be a list, e.g. [1,2,4,8]"),
     ("workload.batch_size=${oops}", "hostbound: error: workload.batch_size=${oops}: ${oops} names no key"),
     # ~150 experiments were listed in one line of ~4,900 characters: the closest few and where the rest are.
     ("experiment=h100_vllm_eager", "hostbound: error: experiment=h100_vllm_eager: no such experiment preset; the closest: h100_vllm_llama2_eager_bs1, ")],
)
def test_bad_input_exits_2_with_one_line(tmp_path, override, named):
    proc = run_cli(override, "tracking.enabled=false", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and len(lines[0]) < 300 and "full_key" not in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs").exists()  # nothing started, nothing written
    if override.startswith("experiment="):
        assert "(python -m harness --help lists them)" in lines[0]


@pytest.fixture
def store(tmp_path):
    """An MLflow store holding the experiment `hostbound` and no runs."""
    import mlflow

    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    mlflow.MlflowClient(f"sqlite:///{db}").create_experiment("hostbound", artifact_location=str(tmp_path / "store" / "artifacts"))
    return db


def report(*args: str, cwd: Path) -> tuple[int, str]:
    """`python -m harness.report ARGS` from `cwd`: its status and its one line of stderr (it must be one)."""
    proc = run_cli(*args, cwd=cwd, module="harness.report")
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, lines[0]


def test_the_report_makes_no_store_at_a_sqlite_path_with_no_file(tmp_path):
    """It made a 954 KB empty store at the mistyped path (and its folder), then said `no experiment
    'hostbound'` with status 1; an empty file it turned into a store."""
    work = tmp_path / "work"
    work.mkdir()
    code, line = report("--tracking-uri", f"sqlite:///{tmp_path}/x/nonexist.db", cwd=work)
    assert code == 2 and line == (f"hostbound: error: --tracking-uri=sqlite:///{tmp_path}/x/nonexist.db: no such file {tmp_path}/x/nonexist.db;"
                                  " a report reads a store, it makes none")
    (work / "empty.db").write_bytes(b"")
    code, line = report("--tracking-uri", "sqlite:///empty.db", cwd=work)
    assert code == 2 and line.endswith("empty.db is an empty file, not an MLflow store (no experiments table)")
    (work / "notes.db").write_text("not a database, not at all\n" * 10)
    code, line = report("--tracking-uri", "sqlite:///notes.db", cwd=work)
    assert code == 2 and "notes.db is not a sqlite database" in line
    # three slashes: a path relative to where it runs; the absolute path the user meant is named
    (tmp_path / "real.db").write_bytes(b"")
    code, line = report("--tracking-uri", f"sqlite://{tmp_path}/real.db", cwd=work)
    assert code == 2 and f"(did you mean sqlite:///{tmp_path}/real.db? an absolute path takes four slashes)" in line
    assert not (tmp_path / "x").exists() and (work / "empty.db").stat().st_size == 0
    assert sorted(p.name for p in work.iterdir()) == ["empty.db", "notes.db"]  # no outputs/ either


@pytest.mark.parametrize("flags,says", [
    (["--experiment", "nosuch"], "hostbound: error: --experiment=nosuch: no such experiment in sqlite:///{db}; it holds Default, hostbound"),
    (["--experiment", "hostbond"], "hostbound: error: --experiment=hostbond: no such experiment in sqlite:///{db} (did you mean hostbound?)"),
    (["--parent", "deadbeef"], "hostbound: error: --parent=deadbeef: no run of that id in sqlite:///{db}"),
    (["--parent", "x' or '1'='1"], "hostbound: error: --parent=\"x' or '1'='1\": not a run id"),
    (["--experiment", ""], "hostbound: error: --experiment='': must name an experiment (default: hostbound)"),
    ([], "hostbound: error: --experiment=hostbound: no finished runs in sqlite:///{db}"),
], ids=["experiment", "experiment-misspelt", "parent", "parent-not-an-id", "experiment-empty", "no-runs"])
def test_the_report_names_the_flag_and_the_value_a_store_lacks(store, tmp_path, flags, says):
    """`--experiment nosuch` ended with status 1, `--parent deadbeef` with "no runs found": bad input is
    status 2 and names the flag and the value."""
    code, line = report("--tracking-uri", f"sqlite:///{store}", *flags, cwd=tmp_path)
    assert code == 2 and line.startswith(says.format(db=store))
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args,says", [
    (["{tmp}/runs", "--tracking-uri", "sqlite:///x.db"], "give sweep/run directories or --tracking-uri, not both"),
    (["{tmp}/runs", "--parent", "abc"], "--parent=abc reads an MLflow store: give --tracking-uri too"),
    (["{tmp}/runs", "--experiment", "mine"], "--experiment=mine reads an MLflow store: give --tracking-uri too"),
    (["{tmp}/runs/broken"], "hostbound: error: {tmp}/runs/broken/summary.json: not a run's summary (Expecting value"),
    (["{tmp}/runs/list"], "hostbound: error: {tmp}/runs/list/summary.json: not a run's summary (a JSON list, not an object)"),
    (["{tmp}/runs/other"], "hostbound: error: {tmp}/runs/other/summary.json: not a run's summary (no hardware)"),
    (["{tmp}/runs/empty"], "hostbound: error: {tmp}/runs/empty: no finished runs (no summary.json under it)"),
    (["{tmp}/runs/file.txt"], "hostbound: error: {tmp}/runs/file.txt: not a directory"),
])
def test_the_report_of_folders_names_what_it_cannot_read(tmp_path, args, says):
    """A summary.json that is not a run's ended in a traceback; the flags of a store were ignored without a word."""
    runs = tmp_path / "runs"
    for name, content in (("broken", '{"hardware":'), ("list", "[]"), ("other", '{"x": 1}')):
        (runs / name).mkdir(parents=True)
        (runs / name / "summary.json").write_text(content)
    (runs / "empty").mkdir()
    (runs / "file.txt").write_text("")
    code, line = report(*(a.format(tmp=tmp_path) for a in args), cwd=tmp_path)
    assert code == 2 and says.format(tmp=tmp_path) in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_mlflow_run_is_logged_to_the_given_store(tmp_path):
    db = tmp_path / "store.db"
    run_dir = tmp_path / "run"
    proc = run_cli(
        f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={run_dir}", "strategy=async", "workload.steps=4", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    with sqlite3.connect(db) as con:
        (run_id,) = con.execute("select run_uuid from runs").fetchone()
        metrics = dict(con.execute("select key, value from latest_metrics where run_uuid=?", (run_id,)).fetchall())
        params = dict(con.execute("select key, value from params where run_uuid=?", (run_id,)).fetchall())
        tags = dict(con.execute("select key, value from tags where run_uuid=?", (run_id,)).fetchall())
        step_points = con.execute("select count(*) from metrics where run_uuid=? and key='series/step_ms'", (run_id,)).fetchone()[0]
    assert metrics["headline/throughput_tok_s"] == pytest.approx(summary["throughput_tok_s"])
    assert metrics["headline/bubble_ratio"] == pytest.approx(summary["bubble_ratio"])
    # Params: the presets and what ran; the defaults of the presets are in the resolved config (below).
    assert params["strategy"] == "async" and params["workload.steps"] == "4" and "hardware.host.launch_us" not in params
    assert tags["strategy"] == "async" and tags["workload"] == "llama2_7b_decode" and tags["hardware"] == "atlas_a2"
    assert step_points == 4
    # Artifacts: the run directory's files, including Hydra's record of the config.
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{db}")
    listed = {a.path for a in mlflow.MlflowClient().list_artifacts(run_id)}
    # The large trace.json stays in the run folder only (tracking.artifacts=small), and the run says so.
    assert {"summary.json", "steps.parquet", "timeline.png", ".hydra", "resolved_config.yaml"} <= listed and "trace.json" not in listed
    resolved = OmegaConf.create(read_local_artifact(mlflow.MlflowClient(), run_id, "resolved_config.yaml"))
    assert resolved.strategy.dispatch == "async" and resolved.hardware.host.launch_us == 12.0 and resolved.workload.steps == 4
    assert tags["files_only_in_run_dir"] == "trace.json" and tags["run_dir"] == str(run_dir)
    assert (run_dir / "trace.json").exists()
    experiment = mlflow.MlflowClient().get_experiment_by_name("hostbound")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    # The shared view the README's address opens (tests/test_mlflow_ui.py sees it in a browser).
    assert json.loads(experiment.tags["mlflow.sharedViewState.hostbound"])["selectedColumns"][:2] == [
        "attributes.`Run Name`", "metrics.`headline/throughput_tok_s`"]


def test_mlflow_run_names_its_values_and_keeps_build_steps_apart(tmp_path):
    db = tmp_path / "store.db"
    proc = run_cli(f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={tmp_path / 'run'}", "strategy=acl_graph",
                   "workload.steps=4", "workload.batch_size=8", "tracking.artifacts=all", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(db) as con:
        (run_id, name) = con.execute("select run_uuid, name from runs").fetchone()
        series = {key: sorted(con.execute("select step, value from metrics where run_uuid=? and key=?", (run_id, key)).fetchall())
                  for key in ("series/step_ms", "series/warmup_step_ms")}
    assert name == "llama2_7b_decode·acl_graph·atlas_a2·steps=4·batch_size=8"
    steps = pd.read_parquet(tmp_path / "run" / "steps.parquet")
    # Step 0 captures the graph (seconds): logged apart, so series/step_ms is the replayed steps alone.
    warmup, measured = series["series/warmup_step_ms"], series["series/step_ms"]
    assert [s for s, _ in warmup] == [0] and [s for s, _ in measured] == [1, 2, 3]
    assert warmup[0][1] == pytest.approx(steps.latency_ms[0]) and warmup[0][1] > 10 * measured[0][1]
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{db}")
    assert "trace.json" in {a.path for a in mlflow.MlflowClient().list_artifacts(run_id)}  # tracking.artifacts=all


def test_runs_started_together_get_their_own_folders_and_say_what_ran(tmp_path):
    """Two runs started in the same second used to share one folder; summary.json now names its run."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    args = [sys.executable, "-m", "harness", "tracking.enabled=false", "output.timeline_steps=0", "output.trace_steps=0", "workload.steps=4"]
    procs = [subprocess.Popen([*args, f"workload.batch_size={b}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for b in (2, 4)]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "outputs" / "runs").rglob("summary.json")]
    assert sorted(s["batch_size"] for s in summaries) == [2, 4]
    for s in summaries:
        assert s["engine"] == "none" and s["hardware"] == "atlas_a2" and f"workload.batch_size={s['batch_size']}" in s["overrides"]
        assert {"context_len", "tp", "dp", "ep", "quant", "seed"} <= set(s)


@pytest.mark.parametrize("strategy", ["acl_graph", "eager"])
def test_trace_events_on_one_lane_never_overlap(strategy):
    from harness.results.outputs import chrome_trace
    from harness.sim.simulate import simulate_run

    outcome = simulate_run(compose_run("workload=deepseek_v3", f"strategy={strategy}", "workload.steps=4"))
    events = [e for e in chrome_trace(outcome, trace_steps=2)["traceEvents"] if e["ph"] == "X"]
    by_lane: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        by_lane.setdefault(e["tid"], []).append((e["ts"], e["dur"]))
    overlaps = 0
    for spans in by_lane.values():
        spans.sort()
        # Viewers work in whole nanoseconds: 1e-6 µs is float noise, 1e-3 µs would be an overlap.
        overlaps += sum(ts + dur > next_ts + 1e-6 for (ts, dur), (next_ts, _) in zip(spans, spans[1:]))
    assert len(events) > 1000 and overlaps == 0


@pytest.mark.parametrize("engine", ["vllm_v0_6", "sglang"])
def test_the_trace_holds_work_not_the_zero_length_markers_of_a_steps_structure(engine):
    """A serving step opens with a zero-time marker (its processes' side work starts there): not work, and
    trace.json leaves it out; what it holds of no op (the engine's scheduling, token copies) lasts."""
    from harness.results.outputs import chrome_trace
    from harness.sim.simulate import simulate_run

    outcome = simulate_run(compose_run("workload=llama31_8b_decode", f"engine={engine}", "workload.steps=4"))
    events = [e for e in chrome_trace(outcome, trace_steps=2)["traceEvents"] if e["ph"] == "X"]
    step_level = [e for e in events if e["name"].startswith("step ")]
    assert any(e["name"] == "step engine" for e in step_level) and all(e["dur"] > 0 for e in step_level)
    tasks, result = outcome.result.graph.tasks, outcome.result
    markers = int(((tasks["op"] < 0) & (result.end_us <= result.start_us) & (tasks["step"] < 2 + int(outcome.step_columns["measured"].argmax()))).sum())
    assert markers > 0  # the run has them: the test would see one slip into the trace


def test_help_says_what_the_harness_is_and_lists_the_presets(tmp_path):
    done = run_cli("--help", cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout.startswith("hostbound: simulate how LLM inference is scheduled between a host CPU and an accelerator")
    assert "strategy: acl_graph, async, cuda_graph, cuda_graph_piecewise, eager, ge_sink, mindspore, pipeline, tiling_cache" in done.stdout
    assert "Powered by Hydra" not in done.stdout and not (tmp_path / "outputs").exists()


def test_the_trace_and_the_timeline_show_measured_steps_not_a_graph_built_between_them():
    """A sink load in the middle of a run (the KV length crosses a shape bucket at step 2: builds at 0 and 2)
    was in trace.json as a step, and timeline.png drew steps 1-4 as one 1000 ms load, titled "device idle
    100%" where the summary's bubble is under 10 %. The trace holds the first measured steps by number; the
    timeline a stretch of consecutive measured ones, its idle taken over them alone."""
    from harness.results.outputs import chrome_trace
    from harness.results.timeline import timeline_window
    from harness.sim.simulate import simulate_run

    outcome = simulate_run(compose_run("strategy=ge_sink", "strategy.shape_buckets=true", "+workload.card_overrides.num_hidden_layers=1",
                                       "workload.steps=8", "workload.context_len=1022"))
    measured = outcome.step_columns["measured"]
    assert measured.tolist() == [False, True, False, True, True, True, True, True]  # the case: a build at step 2
    events = chrome_trace(outcome, trace_steps=4)["traceEvents"]
    assert sorted({e["args"]["step"] for e in events if e["ph"] == "X"}) == [1, 3, 4, 5]
    assert [e["name"] for e in events if e["ph"] == "i"] == ["step 1 end", "step 3 end", "step 4 end", "step 5 end"]
    window = timeline_window(outcome, 4)
    assert (window.first, window.last) == (3, 6) and set(window.tasks["step"].tolist()) == {3, 4, 5, 6}
    starts, ends = outcome.step_columns["start_ms"], outcome.step_columns["end_ms"]
    assert (window.t0, window.t1) == (starts[3] * 1e3, ends[6] * 1e3)
    assert timeline_window(outcome, 9).last == 7  # no stretch that long: the longest, as long as it is


def test_each_thing_the_timeline_draws_has_a_colour_of_its_own():
    """A host sync was drawn in the red of the device idle row: a sync bar on host.main read as a bubble."""
    from harness.results.timeline import COLOURS, HOST_OP_COLOUR, IDLE_COLOUR

    colours = [c.lower() for c in [*COLOURS.values(), HOST_OP_COLOUR, IDLE_COLOUR]]
    assert len(set(colours)) == len(colours)
