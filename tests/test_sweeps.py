"""Sweeps and comparison: joblib multirun into one MLflow parent with child runs, the report, the
timeline files, and a real MLflow server on loopback."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import urllib.request

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from conftest import compose_run, free_port, run_cli, wait_until_up

SWEEP = ["-m", "hydra/launcher=joblib", "strategy=eager,acl_graph", "workload=llama2_7b_decode,qwen25_7b_decode",
         "workload.steps=4", "output.print_summary=false"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("sweep")
    proc = run_cli(*SWEEP, "hydra.sweep.dir=sweep", cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return cwd


def test_joblib_sweep_makes_one_parent_and_four_finished_children(sweep):
    with sqlite3.connect(sweep / "outputs" / "mlflow.db") as con:
        runs = con.execute("select run_uuid, status from runs").fetchall()
        parent = (sweep / "sweep" / "mlflow_parent_run_id").read_text().strip()
        children = [r for (r,) in con.execute("select run_uuid from tags where key='mlflow.parentRunId' and value=?", (parent,))]
        metrics = {r: dict(con.execute("select key, value from latest_metrics where run_uuid=?", (r,)).fetchall()) for r in children}
        names = dict(con.execute("select run_uuid, name from runs").fetchall())
    assert len(runs) == 5 and all(status == "FINISHED" for _, status in runs)
    assert len(children) == 4
    # The parent is named by what its jobs share, then what they vary; each child leads with its values of
    # what varies (in command-line order), where the UI's table cuts a long name.
    assert names[parent].startswith("sweep atlas_a2·steps=4 · strategy=eager,acl_graph × workload=llama2_7b_decode,qwen25_7b_decode · ")
    assert {names[c] for c in children} == {f"{s}·{w}·atlas_a2·steps=4" for w in ("llama2_7b_decode", "qwen25_7b_decode") for s in ("eager", "acl_graph")}
    assert (sweep / "sweep" / "swept_keys").read_text().split() == ["strategy", "workload"]
    for values in metrics.values():
        assert {"headline/throughput_tok_s", "headline/bubble_ratio", "path_share/launch", "other/bubble_front_end"} <= values.keys()
    artifacts = list((sweep / "outputs" / "mlartifacts").rglob("summary.json"))
    assert len(artifacts) == 4
    results_md = (sweep / "sweep" / "results.md").read_text()
    assert results_md.count("atlas_a2") == 4
    # Fixed decimals and the notes a reader needs next to the numbers (graph captures).
    assert "e+0" not in results_md and "| notes" in results_md and results_md.count("| 1 capture") == 2
    # Next to the bubble, the part of it that is kernels' front-end gaps.
    header = [cell.strip() for cell in results_md.splitlines()[0].strip("|").split("|")]
    assert header[header.index("bubble_ratio") + 1] == "bubble_front_end"
    # The parent holds the comparison: the table as its description, table and plots as its artifacts.
    with sqlite3.connect(sweep / "outputs" / "mlflow.db") as con:
        (description,) = con.execute("select value from tags where run_uuid=? and key='mlflow.note.content'", (parent,)).fetchone()
    assert description.startswith(results_md.strip() + "\n\n**4 jobs** of `python -m harness -m ")
    logged = {p.name for p in (sweep / "outputs" / "mlartifacts").glob(f"**/{parent}/artifacts/*")}
    assert logged == {"results.csv", "results.md", "speedup.png", "bubble.png"}


def test_a_report_of_several_folders_writes_apart_and_reads_no_artifact_copies(sweep):
    """`harness.report sweep outputs`: the launch folder's outputs/ holds MLflow's copies of the runs' files
    (outputs/mlartifacts/<id>/artifacts/summary.json), which were read as runs again (each run "2 runs of
    this configuration"); and the report of two folders replaced the first one's bubble.png, the plot its
    results.md names, with one of both folders' runs. Now 4 runs, written to outputs/report."""
    own_plot = (sweep / "sweep" / "bubble.png").read_bytes()
    proc = subprocess.run([sys.executable, "-m", "harness.report", "sweep", "outputs"], cwd=sweep, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    runs = pd.read_csv(sweep / "outputs" / "report" / "runs.csv")
    assert len(runs) == 4 and not runs["run_dir"].str.contains("mlartifacts").any()
    assert (sweep / "sweep" / "bubble.png").read_bytes() == own_plot and not (sweep / "sweep" / "comparison.csv").exists()
    assert "runs of this configuration" not in (sweep / "outputs" / "report" / "comparison.md").read_text()


def test_report_prints_the_speedup_table(sweep):
    out = sweep / "report"
    proc = subprocess.run([sys.executable, "-m", "harness.report", "sweep", "--out", str(out)], cwd=sweep, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "speedup_vs_eager" in proc.stdout and "acl_graph" in proc.stdout
    table = pd.read_csv(out / "comparison.csv")
    eager = table[table.strategy == "eager"]
    assert np.allclose(eager.speedup_vs_eager, 1.0)
    graph = table[table.strategy == "acl_graph"].set_index("workload")
    assert graph.loc["llama2_7b_decode", "speedup_vs_eager"] > 1
    assert (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"
    # The same table from the tracking store, restricted to the sweep's children.
    parent = (sweep / "sweep" / "mlflow_parent_run_id").read_text().strip()
    proc = subprocess.run(
        [sys.executable, "-m", "harness.report", "--tracking-uri", f"sqlite:///{sweep / 'outputs' / 'mlflow.db'}", "--parent", parent,
         "--out", str(sweep / "report2")], cwd=sweep, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    again = pd.read_csv(sweep / "report2" / "comparison.csv", keep_default_na=False)
    # 4 steps: eager measures 4, a graph run 3 (its build step apart), each too few for a p99, which its notes say
    thin = "step p99 over {} measured step(s), fewer than 20: about their maximum (raise workload.steps for a tail)"
    assert sorted(again.notes) == sorted(pd.read_csv(out / "comparison.csv", keep_default_na=False).notes) == sorted(
        [thin.format(4)] * 2 + [f"1 capture; {thin.format(3)}"] * 2)
    assert np.allclose(again.sort_values(["workload", "strategy"]).speedup_vs_eager, table.sort_values(["workload", "strategy"]).speedup_vs_eager)


def test_trace_events_match_the_steps_table(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("tracking.enabled=false", f"hydra.run.dir={run_dir}", "workload.steps=4", "output.trace_steps=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    steps = pd.read_parquet(run_dir / "steps.parquet")
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    assert {e["args"]["step"] for e in spans} == {0, 1}
    for step in (0, 1):
        mine = [e for e in spans if e["args"]["step"] == step]
        device = sorted((e["ts"], e["ts"] + e["dur"]) for e in mine if tracks[e["tid"]].startswith("device."))
        busy, reach = 0.0, -1.0
        for start, end in device:  # union of device intervals
            busy += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        # The trace keeps times to the nanosecond (1e-6 ms): at most that much off per interval edge.
        assert busy / 1e3 == pytest.approx(steps.device_busy_ms[step], rel=0, abs=len(device) * 1e-6)
        span = max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)
        assert span / 1e3 == pytest.approx(steps.latency_ms[step], rel=0, abs=2e-6)
    assert (run_dir / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_mlflow_server_on_loopback_serves_the_runs(tmp_path):
    db = tmp_path / "store.db"
    proc = run_cli(f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={tmp_path / 'run'}", "workload.steps=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_up(f"{base}/health", server, 60)
        request = urllib.request.Request(
            f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=hostbound", method="GET"
        )
        experiment = json.load(urllib.request.urlopen(request, timeout=10))["experiment"]["experiment_id"]
        body = json.dumps({"experiment_ids": [experiment]}).encode()
        search = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", data=body, headers={"Content-Type": "application/json"})
        runs = json.load(urllib.request.urlopen(search, timeout=10))["runs"]
        assert len(runs) == 1
        metrics = {m["key"]: m["value"] for m in runs[0]["data"]["metrics"]}
        assert metrics["headline/throughput_tok_s"] > 0 and "headline/bubble_ratio" in metrics
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_submitit_local_launcher_runs_the_jobs(tmp_path):
    # The SLURM launcher's local mode: the same code path as hydra/launcher=submitit_slurm, no cluster.
    proc = run_cli("-m", "hydra/launcher=submitit_local", "strategy=eager,async", "workload.steps=2", "tracking.enabled=false",
                   "output.print_summary=false", "hydra.sweep.dir=sw", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summaries = sorted((tmp_path / "sw").glob("*/summary.json"))
    assert [json.loads(p.read_text())["strategy"] for p in summaries] == ["eager", "async"]


def test_the_slurm_preset_submits_one_array_job_of_the_sweep(tmp_path):
    """hydra/launcher=slurm on a machine without SLURM: a stand-in `sbatch` keeps the script it is given
    (and refuses it, so the sweep stops there); the script is what a cluster would run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/sh\nfor last; do :; done\ncp "$last" "$SBATCH_CAPTURE"\necho "sbatch: not a cluster" >&2\nexit 1\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")  # submitit checks that srun exists
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = tmp_path / "submitted.sh"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SBATCH_CAPTURE": str(script), "MLFLOW_DISABLE_TELEMETRY": "true"}
    subprocess.run(
        [sys.executable, "-m", "harness", "-m", "hydra/launcher=slurm", "hydra.launcher.partition=debug", "strategy=eager,async,pipeline",
         "tracking.uri=http://mlflow-host:5000", "hydra.sweep.dir=sw"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )
    text = script.read_text()
    for line in ("#SBATCH --array=0-2%3", "#SBATCH --partition=debug", "#SBATCH --cpus-per-task=2", "#SBATCH --mem=4GB",
                 "#SBATCH --time=30", "#SBATCH --job-name=hostbound", "export MLFLOW_DISABLE_TELEMETRY=true"):
        assert line in text.splitlines(), line
    command = text.splitlines()[-1]
    assert command.startswith("srun ") and f"{sys.executable} -u -m submitit.core._submit {tmp_path / 'sw' / '.submitit'}" in command


def test_swept_values_show_what_differs_between_jobs():
    from harness.results.comparison import swept_values

    overrides = pd.Series(["strategy=eager +workload.card_overrides.x=1 workload.steps=4", "strategy=acl_graph +workload.card_overrides.x=2 workload.steps=4"])
    assert swept_values(overrides).tolist() == ["+workload.card_overrides.x=1", "+workload.card_overrides.x=2"]
    assert swept_values(pd.Series(["strategy=eager", "strategy=async"])).tolist() == ["", ""]
    # Where files and runs went is not what ran: a tracked eager run and an untracked graph run compare.
    where = pd.Series([r"strategy=eager tracking.uri=sqlite\:////tmp/m.db workload.steps=4", "strategy=acl_graph tracking.enabled=false hydra.run.dir=x"])
    assert swept_values(where).tolist() == ["workload.steps=4", ""]
    same = pd.Series(["strategy=eager tracking.uri=sqlite:////tmp/m.db", "strategy=acl_graph tracking.enabled=false"])
    assert swept_values(same).tolist() == ["", ""]


def test_results_record_each_jobs_overrides(sweep):
    results = pd.read_csv(sweep / "sweep" / "results.csv")
    assert sorted(results["overrides"].str.contains("strategy=acl_graph")) == [False, False, True, True]


def test_results_csv_writes_counts_as_counts(sweep):
    """The eager jobs have no graph_captures: pandas made the column float, and results.csv read 1.0 and 51.0
    where summary.json has 1 and 51."""
    cells = pd.read_csv(sweep / "sweep" / "results.csv", dtype=str, keep_default_na=False)  # as written
    for column in ("graph_captures", "graph_buckets", "ops_per_step"):
        assert all(cell == "" or cell.isdigit() for cell in cells[column]), f"{column}: {cells[column].tolist()}"
    assert (cells["graph_captures"] != "").any() and (cells["graph_captures"] == "").any()


def test_speedup_compares_with_the_eager_run_of_the_same_swept_values():
    from harness.results.comparison import comparison

    runs = pd.DataFrame(
        {
            "hardware": ["a2"] * 4,
            "workload": ["w"] * 4,
            "strategy": ["eager", "acl_graph", "eager", "acl_graph"],
            "throughput_tok_s": [10.0, 40.0, 20.0, 60.0],
            "overrides": [f"strategy={s} workload.batch_size={b}" for s, b in [("eager", 16), ("acl_graph", 16), ("eager", 64), ("acl_graph", 64)]],
        }
    )
    table = comparison(runs).set_index(["strategy", "swept"])
    assert table.loc[("acl_graph", "workload.batch_size=16"), "speedup_vs_eager"] == pytest.approx(4.0)
    assert table.loc[("acl_graph", "workload.batch_size=64"), "speedup_vs_eager"] == pytest.approx(3.0)
    assert table.loc[("eager", "workload.batch_size=64"), "speedup_vs_eager"] == pytest.approx(1.0)


def test_a_speed_up_is_over_the_plain_eager_run_not_the_mean_of_eager_runs_with_other_switches():
    """`-m experiment=a2_deepseek_eager,a2_deepseek_fusion,a2_deepseek_acl_graph`: two eager runs of one
    setting, the second with task fusion (an experiment's switch, not on the command line). The graph's
    speed-up was over their mean, 217.567 / ((43.104 + 45.729) / 2) = 4.898x, where over plain eager it is
    217.567 / 43.104 = 5.047x; fusion's own is 45.729 / 43.104 = 1.061x. With a switch every run adds
    (strategy.tiling_cache=true on the command line) the run with the fewest switches is the baseline;
    with two eager runs of one switch each, none is, and the footer does not call that "no eager run"."""
    from harness.results.comparison import comparison, missing_eager, to_markdown

    runs = pd.DataFrame({
        "hardware": ["atlas_a2"] * 3, "workload": ["deepseek_v3"] * 3, "strategy": ["eager", "eager", "acl_graph"],
        "throughput_tok_s": [43.104, 45.729, 217.567], "setting_hash": ["s"] * 3,
        "strategy_changes": ["", "strategy.fusion=true", "strategy.graph.mode=capture strategy.name=acl_graph"],
        "overrides": ["+experiment=a2_deepseek_eager", "+experiment=a2_deepseek_fusion", "+experiment=a2_deepseek_acl_graph"],
        "run_dir": ["/x/sweep/0_eager", "/x/sweep/1_eager", "/x/sweep/2_acl_graph"],
    })
    table = comparison(runs).set_index("swept")
    assert table.loc["+experiment=a2_deepseek_acl_graph", "speedup_vs_eager"] == pytest.approx(217.567 / 43.104)
    assert table.loc["+experiment=a2_deepseek_fusion", "speedup_vs_eager"] == pytest.approx(45.729 / 43.104)
    assert len(table) == 3  # two configurations, not two runs of one that differ
    assert all("over the plain eager run, sweep/0_eager" in n and "runs of this setting that differ" not in n for n in table["notes"])
    tiled = comparison(runs.assign(strategy_changes=["strategy.tiling_cache=true", "strategy.fusion=true strategy.tiling_cache=true",
                                                     "strategy.graph.mode=capture strategy.name=acl_graph strategy.tiling_cache=true"]))
    assert tiled.set_index("strategy")["speedup_vs_eager"].max() == pytest.approx(217.567 / 43.104)
    assert all("fewest strategy switches (strategy.tiling_cache=true), sweep/0_eager" in n for n in tiled["notes"])
    tied = comparison(runs.assign(strategy_changes=["strategy.tiling_cache=true", "strategy.fusion=true", "strategy.name=acl_graph"]))
    assert tied["speedup_vs_eager"].isna().all() and all("none in fewer than the others" in n for n in tied["notes"])
    assert missing_eager(tied) == [] and "No speed-up (nan) where no eager run" not in to_markdown(tied)
    # One eager run, or summaries from before strategy_changes: that run is the baseline, as before.
    assert comparison(runs.iloc[[1, 2]]).set_index("strategy").loc["acl_graph", "speedup_vs_eager"] == pytest.approx(217.567 / 45.729)


def test_a_plain_eager_run_records_no_strategy_changes_and_a_switch_is_named(tmp_path):
    """The job compares its resolved strategy.* with conf/'s plain strategy=eager, read without Hydra (a
    sweep's end asks inside Hydra's running app): the two must agree on a plain run."""
    changes = []
    for extra in ([], ["strategy.fusion=true"], ["+experiment=h100_sglang_eager_bs1"]):
        run_dir = tmp_path / f"run{len(changes)}"
        proc = run_cli("strategy=eager", "workload.steps=2", "tracking.enabled=false", f"hydra.run.dir={run_dir}", *extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        changes.append(json.loads((run_dir / "summary.json").read_text())["strategy_changes"])
    assert changes[:2] == ["", "strategy.fusion=true"]
    assert changes[2] == ""  # an experiment that runs plain eager on another machine


def test_report_orders_rows_eager_first_in_numeric_order_and_names_missing_eager_runs():
    from harness.results.comparison import comparison, missing_eager, to_markdown

    runs = pd.DataFrame(
        {
            "hardware": ["a2"] * 5,
            "workload": ["w"] * 5,
            "strategy": ["async", "eager", "async", "eager", "async"],
            "throughput_tok_s": [30.0, 10.0, 90.0, 20.0, 50.0],
            "overrides": [f"workload.batch_size={b}" for b in (32, 32, 8, 8, 1)],
        }
    )
    table = comparison(runs)
    assert table["swept"].tolist() == ["workload.batch_size=1", "workload.batch_size=8", "workload.batch_size=8",
                                       "workload.batch_size=32", "workload.batch_size=32"]
    assert table["strategy"].tolist() == ["async", "eager", "async", "eager", "async"]
    assert table["speedup_vs_eager"].iloc[2] == pytest.approx(4.5) and np.isnan(table["speedup_vs_eager"].iloc[0])
    assert missing_eager(table) == ["a2 w workload.batch_size=1"]
    # The table a sweep writes says why a speed-up is empty, not only the report's stderr.
    assert to_markdown(table).endswith("\n\nNo speed-up (nan) where no eager run has the same values: a2 w workload.batch_size=1.")


def test_comparison_shows_request_latencies_where_some_run_has_them():
    """A serving or prefill sweep's table had throughput and step time but no TTFT or TPOT (MLflow's runs
    table showed them): the columns come after the step time when a run has them, empty for a run without
    one (not "nan"), and stay out of a table whose runs have none."""
    from harness.results.comparison import comparison, to_markdown

    runs = pd.DataFrame(
        {
            "hardware": ["a2"] * 2,
            "workload": ["w"] * 2,
            "strategy": ["eager", "eager"],
            "throughput_tok_s": [10.0, 20.0],
            "step_ms_mean": [5.0, 6.0],
            "median_ttft_ms": [53.25, np.nan],
            "median_tpot_ms": [np.nan, np.nan],
            "overrides": ["workload.batch_size=1", "workload.batch_size=8"],
        }
    )
    table = comparison(runs)
    columns = table.columns.tolist()
    assert columns.index("median_ttft_ms") == columns.index("step_ms_mean") + 1
    assert "median_tpot_ms" not in columns  # no run has one
    lines = to_markdown(table).splitlines()
    assert "53.250 |" in lines[2] and "nan" not in lines[3]
    cells = [c.strip() for c in lines[3].split("|")]
    assert cells[columns.index("median_ttft_ms") + 1] == ""
    assert "median_ttft_ms" not in comparison(runs.drop(columns=["median_ttft_ms"])).columns


def test_runs_of_one_setting_are_one_row_or_named_apart():
    """Two sweeps read together gave two rows of each setting that nothing told apart. The same
    configuration with the same numbers: one row that says how many; where they differ, each row names
    its run (folder or MLflow run id); the eager mean still sets the speed-up."""
    from harness.results.comparison import comparison

    runs = pd.DataFrame(
        {
            "hardware": ["a2"] * 4,
            "workload": ["w"] * 4,
            "strategy": ["eager", "eager", "async", "async"],
            "throughput_tok_s": [10.0, 10.0, 30.0, 40.0],
            "config_hash": ["e", "e", "a1", "a2"],
            "overrides": ["strategy=eager", "strategy=eager", "strategy=async", "strategy=async"],
            "run_dir": ["/x/sweep1/0_w_eager", "/x/sweep2/0_w_eager", "/x/sweep1/1_w_async", None],
            "run_id": [None, None, None, "abc123"],
        }
    )
    table = comparison(runs)
    assert table["strategy"].tolist() == ["eager", "async", "async"]
    assert table["notes"].iloc[0] == "2 runs of this configuration, the same numbers"
    assert table["notes"].iloc[1] == "one of 2 runs of this setting that differ (sweep1/1_w_async)"
    assert table["notes"].iloc[2] == "one of 2 runs of this setting that differ (run abc123)"
    assert table["speedup_vs_eager"].tolist() == pytest.approx([1.0, 3.0, 4.0])
    # The same numbers under two configurations (an edited preset) are two runs, not one.
    runs.loc[1, "config_hash"] = "e2"
    assert comparison(runs)["strategy"].tolist() == ["eager", "eager", "async", "async"]


def test_a_speed_up_is_over_the_eager_run_of_the_same_setting_however_written(tmp_path):
    """`-m experiment=a2_deepseek_eager,a2_deepseek_acl_graph` (the calibration's own pair) gave the graph no
    speed-up: their overrides differ beyond the strategy. What ran is compared (setting_hash: everything
    but the strategy and where files go), and a default written out is the default."""
    import dataclasses

    from harness.config.schema import flatten
    from harness.results.comparison import comparison
    from harness.results.resume import config_hash, setting_hash

    def params(*overrides):
        return flatten(dataclasses.asdict(compose_run(*overrides)))

    eager, graph = params("experiment=a2_deepseek_eager"), params("experiment=a2_deepseek_acl_graph")
    assert setting_hash(eager) == setting_hash(graph) and config_hash(eager) != config_hash(graph)
    assert setting_hash(params("strategy=eager")) == setting_hash(params("strategy=eager", "workload.batch_size=1", "tracking.enabled=false"))
    assert setting_hash(eager) != setting_hash(params("experiment=a2_deepseek_eager", "workload.batch_size=4"))
    runs = pd.DataFrame({
        "hardware": ["a2"] * 3, "workload": ["w"] * 3, "strategy": ["eager", "acl_graph", "acl_graph"],
        "throughput_tok_s": [10.0, 50.0, 70.0], "setting_hash": ["s", "s", "t"],
        "overrides": ["+experiment=x_eager", "+experiment=x_graph", "+experiment=y_graph"],
    })
    table = comparison(runs).set_index("swept")
    assert table.loc["+experiment=x_graph", "speedup_vs_eager"] == pytest.approx(5.0)
    assert np.isnan(table.loc["+experiment=y_graph", "speedup_vs_eager"])  # no eager run of its setting
    # A sweep over a strategy key compares each run with the eager run of its own value (setting_hash
    # leaves strategy.* out: the two eager runs were averaged, an eager row's speed-up 0.67).
    swept = [(s, f) for f in ("false", "true") for s in ("eager", "acl_graph")]
    runs = pd.DataFrame({
        "hardware": ["a2"] * 4, "workload": ["w"] * 4, "strategy": [s for s, _ in swept], "throughput_tok_s": [10.0, 30.0, 20.0, 40.0],
        "setting_hash": [setting_hash(params(f"strategy={s}", f"strategy.fusion={f}")) for s, f in swept],
        "overrides": [f"strategy={s} strategy.fusion={f}" for s, f in swept],
    })
    table = comparison(runs).set_index(["strategy", "swept"])["speedup_vs_eager"]
    assert table.to_dict() == pytest.approx({("eager", "strategy.fusion=false"): 1.0, ("acl_graph", "strategy.fusion=false"): 3.0,
                                             ("eager", "strategy.fusion=true"): 1.0, ("acl_graph", "strategy.fusion=true"): 2.0})
    # A run from before setting_hash is matched by its overrides, the others by what ran.
    runs.loc[3, "setting_hash"] = np.nan
    assert comparison(runs).set_index(["strategy", "swept"])["speedup_vs_eager"][("eager", "strategy.fusion=false")] == 1.0


def test_timeline_draws_host_ops_not_stripes_and_leaves_idle_lanes_out(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from conftest import compose_run
    from harness.results import timeline
    from harness.sim.simulate import simulate_run

    outcome = simulate_run(compose_run("strategy=eager", "workload.steps=2"))
    graph = outcome.result.graph
    tasks, start, end = graph.tasks, outcome.result.start_us, outcome.result.end_us
    host = (graph.lane_kinds[tasks["lane"]] == 0) & (tasks["step"] == 0)
    # At 1 µs per pixel every op's stages stay; at a whole step per pixel each op is one bar.
    kept, (bar_starts, _) = timeline._merge_narrow_host_ops(tasks, start, end, host, 0.0)
    assert np.array_equal(kept, host) and bar_starts.size == 0
    kept, (bar_starts, bar_ends) = timeline._merge_narrow_host_ops(tasks, start, end, host, 1e9)
    # One bar per op, and the step's own host work (op -1: the input copy before, the sync after).
    own = np.count_nonzero(host & (tasks["op"] < 0))
    assert not kept.any() and bar_starts.size == outcome.summary["ops_per_step"] + own
    assert np.all(bar_ends[:-1] <= bar_starts[1:] + 1e-9)  # one lane: the merged ops do not overlap

    drawn = {}
    real_savefig = plt.Figure.savefig
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: (drawn.setdefault("fig", fig), real_savefig(fig, *a, **k)))
    timeline.draw_timeline(outcome, tmp_path / "t.png", 1)
    ax = drawn["fig"].axes[0]
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert lanes == ["host.main", "device.stream0", "device idle"]  # the copy engines moved only a few tokens
    assert "not drawn (under 0.1% busy): copy.h2d, copy.d2h" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["host op (stages\ntoo short to draw)", "compute", "device idle"]
    # The title says how much of the idle time is the front end's gaps: the summary's share, rounded.
    s = outcome.summary
    assert ax.get_title(loc="left") == f"step 0: device idle {s['bubble_ratio']:.0%} (red; front-end gaps {s['bubble_front_end']:.0%}), bound: host"


def test_a_sweeps_jobs_compose_exactly_as_hydra_would(monkeypatch):
    """The compose cache (harness.sweep.compose_cache) gives every job the config Hydra's own load_sweep_config
    gives it, the hydra node included: preset choices, values, `+`/`~`, hydra and experiment overrides,
    in any order, and the same errors. So does it for one configuration (a run, and Hydra reading
    hydra.mode), whatever job name the composing process has (the config's own name wins in both)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import JobRuntime
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from harness.sweep import compose_cache
    from harness.config.paths import CONF_DIR

    cases = [
        ["strategy=async", "workload.batch_size=4"],
        ["workload.batch_size=8", "strategy=async"],  # the same choice as above, another value: from the cache
        ["hardware=h100", "strategy=cuda_graph", "+workload.card_overrides.head_dim=64"],
        ["+experiment=a2_qwen3_eager", "seed=3"],
        ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "workload.steps=3"],
        ["~engine", "strategy=eager"],
        ["hydra.job.config.override_dirname.kv_sep=:", "seed=1", "workload=qwen3_30b_decode"],
        ["workload.nosuch=1"],
        ["strategy=nosuch"],
        ["workload.steps=abc"],
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = compose(config_name="config", overrides=["hydra.sweep.dir=x"], return_hydra_config=True)

        def either(load, *args, **kwargs):
            try:
                return OmegaConf.to_yaml(load(loader, *args, **kwargs))
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"

        def hydras_own(load, *args, **kwargs):  # with Hydra's load_configuration, whatever install() put there
            with monkeypatch.context() as patch:
                patch.setattr(ConfigLoaderImpl, "load_configuration", compose_cache._hydra_load_configuration)
                return either(load, *args, **kwargs)

        cached_before = len(compose_cache._compositions)
        for overrides in cases:
            ours = either(compose_cache.load_sweep_config, master, overrides)
            assert ours == hydras_own(compose_cache._hydra_load_sweep_config, master, overrides), overrides
            assert ours == either(compose_cache.load_sweep_config, master, overrides), overrides  # again, from the cache
        assert "strategy=async,workload.batch_size=8" in either(compose_cache.load_sweep_config, master, cases[1])
        assert len(compose_cache._compositions) > cached_before
        for name in ("app", "__main__"):
            JobRuntime.instance().set("name", name)
            for overrides in [*cases, ["hydra.run.dir=somewhere", "hydra.mode=RUN"]]:
                for mode, validate in ((RunMode.RUN, True), (RunMode.MULTIRUN, False)):
                    args = dict(config_name="config", overrides=overrides, run_mode=mode, validate_sweep_overrides=validate)
                    ours = either(compose_cache.load_configuration, **args)
                    assert ours == hydras_own(compose_cache._hydra_load_configuration, **args), (name, overrides, mode)
                    # conf/config.yaml names the job: one log file name (hostbound.log) whoever composes
                    assert "name: hostbound" in ours or "Exception" in ours or "Error" in ours


def test_a_sweeps_jobs_draw_no_timeline_unless_asked(tmp_path):
    """A single run draws timeline.png; a sweep's jobs do not (it cost more than the simulation), unless
    output.timeline_steps says so; the value logged is what was drawn."""
    common = ["workload.steps=3", "output.print_summary=false", "output.trace_steps=0"]
    single = run_cli(*common, "hydra.run.dir=single", cwd=tmp_path)
    plain = run_cli("-m", "strategy=eager,async", *common, "hydra.sweep.dir=plain", cwd=tmp_path, timeout=300)
    asked = run_cli("-m", "strategy=eager,async", *common, "output.timeline_steps=1", "hydra.sweep.dir=asked", cwd=tmp_path, timeout=300)
    assert single.returncode == plain.returncode == asked.returncode == 0, (single.stderr + plain.stderr + asked.stderr)[-2000:]
    assert (tmp_path / "single" / "timeline.png").is_file()
    plain_jobs = sorted(p for p in (tmp_path / "plain").iterdir() if p.is_dir())
    asked_jobs = sorted(p for p in (tmp_path / "asked").iterdir() if p.is_dir())
    assert len(plain_jobs) == len(asked_jobs) == 2
    assert not any((job / "timeline.png").exists() for job in plain_jobs)
    assert all((job / "timeline.png").is_file() for job in asked_jobs)
    with sqlite3.connect(tmp_path / "outputs" / "mlflow.db") as con:
        mode = con.execute("pragma journal_mode").fetchone()[0]
    resolved = [OmegaConf.load(p) for p in (tmp_path / "outputs" / "mlartifacts").rglob("resolved_config.yaml")]
    assert sorted(config.output.timeline_steps for config in resolved) == [0, 0, 1, 1, 1]  # what was drawn, never None
    assert mode == "wal"  # the store logs in write-ahead mode (harness.tracking._write_ahead_log)


def test_a_launcher_that_fails_leaves_the_sweeps_parent_run_failed_not_running(tmp_path):
    """An error inside Hydra or a launcher (here joblib refusing n_jobs=0) skips the sweep's end: the
    parent run it had opened is ended FAILED."""
    proc = run_cli("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0", "strategy=eager,async", "workload.steps=2",
                   "output.print_summary=false", "hydra.sweep.dir=sw", cwd=tmp_path, timeout=300)
    assert proc.returncode != 0
    with sqlite3.connect(tmp_path / "outputs" / "mlflow.db") as con:
        statuses = con.execute("select status from runs").fetchall()
    assert statuses == [("FAILED",)]


@pytest.mark.parametrize("strategy,builds", [("eager", 2), ("acl_graph", 2), ("ge_sink", 3)])
def test_a_run_composes_once_and_builds_once(tmp_path, monkeypatch, strategy, builds):
    """`python -m harness` composes once: the checks before Hydra, Hydra's look at hydra.mode and the run
    share one composition (each made its own before: four). It builds its workload once, after a one-step
    build that sizes it (five builds before): the checks before Hydra build the run Hydra then
    simulates. A strategy that pads shapes (graph sink with shape buckets) builds the padded workload too."""
    import harness.__main__ as entry
    import harness.sim.policies
    import harness.sim.simulate
    from harness.cli.command import preflight
    from harness.model import workload
    from harness.sweep import compose_cache

    built = []
    for module in (harness.sim.policies, harness.sim.simulate):
        monkeypatch.setattr(module, "build_workload", lambda *a, **k: built.append(k.get("batch")) or workload.build_workload(*a, **k))

    monkeypatch.setattr(compose_cache, "_compositions", type(compose_cache._compositions)())
    made = []
    hydras = compose_cache._hydra_load_configuration
    monkeypatch.setattr(compose_cache, "_hydra_load_configuration", lambda *a, **k: made.append(k["overrides"]) or hydras(*a, **k))
    monkeypatch.chdir(tmp_path)
    argv = ["tracking.enabled=false", "workload.steps=4", "output.timeline_steps=0", "output.print_summary=false", "hydra.run.dir=run",
            f"strategy={strategy}", *(["strategy.shape_buckets=true"] if strategy == "ge_sink" else [])]
    monkeypatch.setattr(sys, "argv", ["harness", *argv])
    preflight(argv)
    entry.main()
    assert (tmp_path / "run" / "summary.json").exists()
    assert len(made) == 1 and all(o.startswith("strategy=") for o in made[0])  # presets merged once; values applied to copies
    assert len(built) == builds and built[0] is None  # the first: one step, to size the run


def test_a_sweeps_checks_build_each_distinct_workload_once(tmp_path, monkeypatch):
    """Before a sweep starts, every combination is composed and value-checked, but the workload is built
    (and sized) once per distinct workload, hardware, engine and padding: seeds and dispatch modes do not
    change it (a graph strategy would: its padding and its graphs' memory)."""
    import harness.sim.policies
    import harness.sim.simulate
    from harness.cli.command import preflight
    from harness.model import workload

    built = []
    for module in (harness.sim.policies, harness.sim.simulate):
        monkeypatch.setattr(module, "build_workload", lambda *a, **k: built.append(a[0].batch_size) or workload.build_workload(*a, **k))
    monkeypatch.chdir(tmp_path)
    preflight(["-m", "seed=0,1,2", "strategy=eager,async", "workload.batch_size=1,4", "workload.steps=2", "hydra.sweep.dir=sw"])
    assert sorted(built) == [1, 1, 4, 4]  # per batch size: the one-step probe and the build, not 6 times each


def test_a_sweep_ends_with_its_comparison_table_and_where_results_md_is(tmp_path):
    """The sweep's answer is its last words: the table results.md holds (one row per job) and its path;
    with output.print_summary=false the sweep prints nothing of it."""
    proc = run_cli("-m", "strategy=eager,async", "workload.steps=2", "tracking.enabled=false", "hydra.sweep.dir=sw", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results_md = tmp_path / "sw" / "results.md"
    head, _, tail = proc.stdout.rpartition("\nhostbound sweep: 2 jobs\n")
    assert head, proc.stdout[-2000:]
    table, results_line = tail.rstrip("\n").rsplit("\n", 1)
    assert table + "\n" == results_md.read_text()
    assert [line.split("|")[3].strip() for line in table.splitlines()[2:] if line.startswith("|")] == ["eager", "async"]
    assert results_line == f"  results      {results_md} (every summary key: results.csv; plots: speedup.png bubble.png)"
    assert (tmp_path / "sw" / "speedup.png").stat().st_size > 1000 and (tmp_path / "sw" / "bubble.png").stat().st_size > 1000
    quiet = run_cli("-m", "strategy=eager,async", "workload.steps=2", "tracking.enabled=false", "output.print_summary=false",
                    "hydra.sweep.dir=quiet", cwd=tmp_path, timeout=300)
    assert quiet.returncode == 0 and "hostbound sweep:" not in quiet.stdout


def test_bar_groups_are_labelled_by_what_differs_and_titled_by_what_they_share():
    """The tick under each bar group was its whole (workload, hardware, swept) tuple, and neighbours ran
    into each other: now the values that differ, one a line, short keys; the shared ones are the title."""
    from harness.results.comparison import _bar_labels

    sweep = [("llama2_7b_decode", "atlas_a2", "workload.batch_size=1"), ("llama2_7b_decode", "atlas_a2", "workload.batch_size=8")]
    assert _bar_labels(sweep) == ("llama2_7b_decode atlas_a2", ["batch_size=1", "batch_size=8"])
    assert _bar_labels([("w", "a2", ""), ("v", "h100", "")]) == ("", ["w\na2", "v\nh100"])
    assert _bar_labels([("w", "a2")]) == ("w a2", ["w a2"])
    # Only the key is shortened: a value's dots are its own (both groups of a host.speed sweep read "5").
    speeds = [("w", "h100", "hardware.host.speed=0.5 workload.path=a.csv"), ("w", "h100", "hardware.host.speed=1.5 workload.path=a.csv")]
    assert _bar_labels(speeds) == ("w h100", ["speed=0.5 path=a.csv", "speed=1.5 path=a.csv"])
    # A switch its last part cannot name (enabled=true) reads as run names and headers read it.
    serving = [("w", "h100", "workload.serving.enabled=false"), ("w", "h100", "+workload.serving.enabled=true")]
    assert _bar_labels(serving) == ("w h100", ["no serving", "serving"])


def test_a_sweep_refuses_before_it_starts_a_combination_whose_graphs_overflow_hbm(tmp_path):
    """The sweep's up-front check counts what the run's own check counts, the captured graphs' memory
    included, for each strategy: an HBM between the run's need without its graph and with it refuses
    the sweep in one line naming the value, before Hydra makes a folder (it had made both jobs' folders
    and failed one at run time)."""
    from conftest import compose_run
    from harness.sim.policies import prepare

    run = compose_run("strategy=acl_graph", "workload.steps=4")
    memory = prepare(run, np.full(4, run.workload.batch_size), None)[0].memory
    assert memory.graphs_gb > 0
    hbm = f"{memory.total_gb - memory.graphs_gb / 2:.6f}"
    proc = run_cli("-m", "strategy=acl_graph", "workload.steps=4", f"hardware.device.hbm_gb={hbm},80", "tracking.enabled=false",
                   "hydra.sweep.dir=sw", cwd=tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "sw").exists(), proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hostbound: error: ")]
    assert len(errors) == 1 and f"hardware.device.hbm_gb={float(hbm):g}" in errors[0], proc.stderr[-2000:]


def test_a_jobs_recorded_overrides_are_a_single_runs():
    """Hydra's sweeper writes a job's booleans as True/False and a resumed job gains resume=True: the
    summary records them as a single run's command line does, so the same job is the same bytes."""
    from harness.cli.job import recorded_overrides

    assert recorded_overrides(("tracking.enabled=False", "workload.serving.enabled=True", "resume=True", "strategy=acl_graph")) == (
        "tracking.enabled=false workload.serving.enabled=true strategy=acl_graph")


@pytest.mark.parametrize("written", ["1", "on", "yes", "true", "True"])
def test_a_switch_is_recorded_as_the_run_read_it(written):
    """`serving.enabled=1`, `=on`, `=yes` and `=true` are one setting: summary.json records each as
    `=true`, so a sweep's comparison groups them together (the report split `=1` from `=true`)."""
    from harness.cli.job import recorded_overrides

    overrides = (f"workload.serving.enabled={written}", "workload.batch_size=08", "strategy=eager")
    run = compose_run(*overrides)
    assert recorded_overrides(overrides, run) == "workload.serving.enabled=true workload.batch_size=08 strategy=eager"


def test_a_job_failed_then_fixed_and_resumed_counts_once_and_only_its_own_numbers(tmp_path):
    """A job refused on resume (its CSV edited: its folder holds the earlier file's run) is failed, and its
    folder's summary.json, another configuration's, stays out of results.csv (it went in, and the job was
    counted both failed and finished: "1 of 3 jobs"). Resumed once the file is restored, the job is no
    longer failed (its JOB_FAILED.txt stayed and failed the finished sweep)."""
    rows = "step,name,kind,device_us\n" + "".join(f"{s},mm,cube,{{us}}\n{s},add,vector,10\n" for s in range(4))
    (tmp_path / "a.csv").write_text(rows.format(us=100))
    (tmp_path / "b.csv").write_text(rows.format(us=200))
    sweep = ["-m", "workload=trace", "workload.path=a.csv,b.csv", "tracking.enabled=false", "output.print_summary=false", "hydra.sweep.dir=sw"]
    assert run_cli(*sweep, cwd=tmp_path, timeout=300).returncode == 0
    job_a = next((tmp_path / "sw").glob("0_*"))
    kept = (job_a / "summary.json").read_bytes()

    (tmp_path / "a.csv").write_text(rows.format(us=1000))
    edited = run_cli(*sweep, "resume=true", cwd=tmp_path, timeout=300)
    assert edited.returncode == 2, edited.stderr[-2000:]
    final = [line for line in edited.stderr.splitlines() if "jobs failed" in line]
    assert len(final) == 1 and final[0].startswith("hostbound: error: 1 of 2 jobs failed, results.csv holds the 1 that finished"), final
    results = pd.read_csv(tmp_path / "sw" / "results.csv")
    assert [os.path.basename(d) for d in results["run_dir"]] == [next((tmp_path / "sw").glob("1_*")).name]
    assert (job_a / "JOB_FAILED.txt").is_file() and (job_a / "summary.json").read_bytes() == kept  # nothing lost

    (tmp_path / "a.csv").write_text(rows.format(us=100))
    fixed = run_cli(*sweep, "resume=true", cwd=tmp_path, timeout=300)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert not list((tmp_path / "sw").rglob("JOB_FAILED.txt"))
    assert len(pd.read_csv(tmp_path / "sw" / "results.csv")) == 2 and "Failed" not in (tmp_path / "sw" / "results.md").read_text()


def test_a_speed_up_plot_needs_a_run_compared_with_eager():
    """A lone eager run, or eager runs alone, drew speedup.png as bars of 1.0 over themselves; an eager run
    with task fusion (1.06x over plain eager) or any other strategy is a comparison."""
    from harness.results.comparison import unplotted

    def table(strategies, speedups):
        return pd.DataFrame({"strategy": strategies, "speedup_vs_eager": speedups, "bubble_ratio": [0.5] * len(strategies)})

    assert unplotted(table(["eager"], [1.0])) == ["no throughput / eager to plot (no run but eager ones with an eager run to compare with)"]
    assert unplotted(table(["eager", "eager"], [1.0, 1.061])) == []
    assert unplotted(table(["eager", "acl_graph"], [1.0, 2.0])) == []
