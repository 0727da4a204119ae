"""Every number of a run reaches every view unchanged: summary.json, MLflow, the sweep's results.csv and
the report's table of runs (read from the folders and from the store). Driven by each summary's own keys:
a number added later is checked without this test changing, and one that a view drops (MLflow keeping
only floats, a table column lost) fails it."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest

from conftest import compose_run, run_cli
from harness.config.schema import flatten
from harness.sim.outcome import WHAT_RAN_KEYS, WHAT_RAN_PARAMS
from harness.tracking.store import metric_name

# Eager and graph replay, alone and serving a request stream: graph captures, padding, request counts.
SWEEP = ["-m", "workload=llama31_8b_decode", "strategy=eager,acl_graph", "workload.serving.enabled=false,true", "workload.steps=6",
         "workload.serving.initial_requests=4", "workload.serving.output_len_mean=3", "output.print_summary=false"]
# Keys the sweep must hold among its numbers, so that a view dropping integers or a strategy's keys shows.
MUST_HOLD = {"throughput_tok_s", "tasks_simulated", "ops_per_step", "graph_captures", "padding_waste", "requests_completed", "batch_max",
             "mean_ttft_ms", "peak_mem_gb", "breakdown_launch", "batch_size", "steps", "seed"}


@pytest.fixture(scope="module")
def views(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("views")
    proc = run_cli(*SWEEP, "hydra.sweep.dir=sweep", cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    store = f"sqlite:///{cwd / 'outputs' / 'mlflow.db'}"
    parent = (cwd / "sweep" / "mlflow_parent_run_id").read_text().strip()
    for source, out in ((["sweep"], "report_dirs"), (["--tracking-uri", store, "--parent", parent], "report_store")):
        report = subprocess.run([sys.executable, "-m", "harness.report", *source, "--out", out], cwd=cwd, capture_output=True, text=True)
        assert report.returncode == 0, report.stderr
    return cwd, store


def numbers(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def row_of(table: pd.DataFrame, run_dir: str) -> dict:
    rows = table[table["run_dir"] == run_dir]
    assert len(rows) == 1, f"{run_dir}: {len(rows)} rows"
    return rows.iloc[0].to_dict()


def test_every_number_of_every_run_is_the_same_in_every_view(views):
    import mlflow

    cwd, store = views
    client = mlflow.MlflowClient(tracking_uri=store)
    results = pd.read_csv(cwd / "sweep" / "results.csv")
    report_dirs = pd.read_csv(cwd / "report_dirs" / "runs.csv")
    report_store = pd.read_csv(cwd / "report_store" / "runs.csv")
    summaries = sorted((cwd / "sweep").glob("*/summary.json"))
    assert len(summaries) == 4 and len(results) == len(report_dirs) == len(report_store) == 4
    seen: set[str] = set()
    for path in summaries:
        summary = numbers(json.loads(path.read_text()))
        seen |= summary.keys()
        assert all(math.isfinite(v) for v in summary.values())
        run_dir = str(path.parent)
        (mlflow_run,) = client.search_runs(
            [client.get_experiment_by_name("hostbound").experiment_id], filter_string=f"tags.run_dir = '{run_dir}'"
        )
        metrics, params = mlflow_run.data.metrics, mlflow_run.data.params
        # The setting a report finds each run's eager run by: the same in the summary, the store and its report.
        setting = json.loads(path.read_text())["setting_hash"]
        assert mlflow_run.data.tags["setting_hash"] == setting == row_of(report_store, run_dir)["setting_hash"], path.parent.name
        strategy = json.loads(path.read_text())["strategy_changes"]
        stored = row_of(report_store, run_dir)["strategy_changes"]  # '' is read back from CSV as NaN
        assert mlflow_run.data.tags.get("strategy_changes", "") == strategy == ("" if pd.isna(stored) else stored), path.parent.name
        if json.loads(path.read_text())["serving"]:  # sizes a serving run does not read: null, and no param to plot it by
            assert json.loads(path.read_text())["batch_size"] is None and "workload.batch_size" not in params and "workload.context_len" not in params
            assert all(math.isnan(row_of(table, run_dir)["batch_size"]) for table in (results, report_dirs, report_store))
        for key, value in summary.items():
            where = f"{path.parent.name}: {key}"
            if key in WHAT_RAN_KEYS:  # what ran is the config: a param, as the config wrote it
                assert params[WHAT_RAN_PARAMS[key]] == str(value), where
            else:
                assert metrics[metric_name(key)] == value, where
            for name, table in (("results.csv", results), ("report from folders", report_dirs), ("report from MLflow", report_store)):
                assert row_of(table, run_dir)[key] == value, f"{where} in {name}"
        # MLflow's metrics are the summary's numbers and nothing else (the step series aside).
        assert set(metrics) - {"series/step_ms", "series/warmup_step_ms"} == {metric_name(k) for k in summary.keys() - set(WHAT_RAN_KEYS)}, path.parent.name
    assert MUST_HOLD <= seen


def test_what_ran_is_the_configs_own_value():
    """summary.json's what-ran keys are the config's values under the names MLflow keeps them by."""
    from omegaconf import OmegaConf

    from harness.cli.job import identity

    run = compose_run("workload=qwen3_30b_decode", "workload.batch_size=3", "seed=7", "workload.serving.enabled=true")
    params = flatten(OmegaConf.to_container(OmegaConf.structured(run), resolve=True, enum_to_str=True))
    what_ran = identity(run)
    assert set(WHAT_RAN_PARAMS) == set(WHAT_RAN_KEYS) - {"overrides", "config_hash", "setting_hash", "strategy_changes"}
    # A serving run reads no batch_size or context_len (its requests are its batches): null, where MLflow's
    # compare views placed every serving run at batch 1 (and the run logs no such params).
    assert what_ran["batch_size"] is None and what_ran["context_len"] is None
    for key, param in WHAT_RAN_PARAMS.items():
        if key not in ("batch_size", "context_len"):
            assert str(params[param]) == str(what_ran[key]), key
    batch = identity(compose_run("workload=qwen3_30b_decode", "workload.batch_size=3", "workload.context_len=512"))
    assert (batch["batch_size"], batch["context_len"]) == (3, 512)


def test_a_note_every_row_carries_is_said_once_under_the_table():
    """A 4-step sweep's rows all carried 'step p99 over 4 measured step(s) ...': repeated on every row it
    made the first row tall enough to hide every number in MLflow's description preview. Said once under
    the table, each row keeps its own notes."""
    from harness.results.comparison import to_markdown

    shared = "step p99 over 4 measured step(s), fewer than 20: about their maximum (raise workload.steps for a tail)"
    table = pd.DataFrame({"hardware": ["a2", "a2"], "workload": ["w", "w"], "strategy": ["eager", "acl_graph"],
                          "throughput_tok_s": [1.0, 2.0], "speedup_vs_eager": [1.0, 2.0], "notes": [shared, f"1 capture; {shared}"]})
    markdown = to_markdown(table)
    rows = [line for line in markdown.splitlines() if line.startswith("| a2")]
    assert shared not in "".join(rows) and rows[1].rstrip(" |").endswith("1 capture")
    assert markdown.endswith(f"\n\nEvery run: {shared}.")
    single = to_markdown(table.iloc[:1])
    assert shared in single and "Every run" not in single  # one row: nothing to share

