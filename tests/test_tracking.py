"""harness.tracking in-process: run names, what is logged (every number, params cut to MLflow's limit,
tags, the step series apart from warm-up), artifact policies, store URIs and the line a failed store
leaves. The whole path from `python -m harness` is tested in test_cli, test_views and test_reliability."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from omegaconf import OmegaConf

from conftest import read_local_artifact
from harness.config.compose import compose_config
from harness.config.schema import ArtifactPolicy, TrackingConfig, flatten
from harness.base.errors import HarnessError, TrackingError
from harness.tracking.store import (
    FAILED_ENV,
    FAILED_FILE,
    MAX_PARAM_CHARS,
    HEADLINE_METRICS,
    artifact_files,
    bound_requests,
    chosen_params,
    later_command,
    log_run,
    log_run_or_mark,
    metric_name,
    read_run_dir,
    run_folders,
    run_name,
    short_reason,
    sqlite_path,
    sqlite_uri,
    summary_key,
)

NAMES = {"hardware": "atlas_a2", "workload": "llama2_7b_decode", "strategy": "eager", "engine": "none"}


@pytest.mark.parametrize(
    "names, overrides, expected",
    [
        (NAMES, "", "llama2_7b_decode·eager·atlas_a2"),
        ({**NAMES, "engine": "vllm_v1"}, "", "llama2_7b_decode·eager·atlas_a2·vllm_v1"),
        # Values set on top, by their last key part; group choices and where things go left out.
        (NAMES, "strategy=eager workload.batch_size=8 +workload.card_overrides.layer_overhead_us=5 tracking.uri=x output.trace_steps=0"
                " hydra.run.dir=y resume=true ~seed", "llama2_7b_decode·eager·atlas_a2·batch_size=8·layer_overhead_us=5·seed="),
        # A switch whose last key part says nothing by itself is named by what it turns on ('enabled=true' was).
        ({**NAMES, "engine": "vllm_v1"}, "workload.serving.enabled=true workload.steps=200",
         "llama2_7b_decode·eager·atlas_a2·vllm_v1·serving·steps=200"),
        # As the config reads the switch: on, yes and 1 turn serving on ("no serving" named a serving run).
        (NAMES, "workload.serving.enabled=on", "llama2_7b_decode·eager·atlas_a2·serving"),
        (NAMES, "workload.serving.enabled=1", "llama2_7b_decode·eager·atlas_a2·serving"),
        (NAMES, "workload.serving.enabled=off", "llama2_7b_decode·eager·atlas_a2·no serving"),
    ],
)
def test_a_run_is_named_by_its_presets_and_the_values_set_on_top(names, overrides, expected):
    assert run_name(names, overrides) == expected


@pytest.mark.parametrize(
    "overrides, swept, expected",
    [
        ("strategy=acl_graph workload=qwen3_30b_decode workload.steps=4", {"strategy", "workload"}, "acl_graph·qwen3_30b_decode·atlas_a2·steps=4"),
        ("workload.steps=4 workload.batch_size=8 seed=1", {"workload.batch_size", "seed"}, "batch_size=8·seed=1·llama2_7b_decode·eager·atlas_a2·steps=4"),
        ("workload.batch_size=8", set(), "llama2_7b_decode·eager·atlas_a2·batch_size=8"),  # a single run: presets first
    ],
)
def test_a_sweeps_job_is_named_by_what_its_sweep_varies_first(overrides, swept, expected):
    names = {**NAMES, "workload": "qwen3_30b_decode", "strategy": "acl_graph"} if "strategy=acl_graph" in overrides else NAMES
    assert run_name(names, overrides, frozenset(swept)) == expected


def test_a_run_name_fits_mlflows_limit():
    assert len(run_name(NAMES, " ".join(f"workload.k{i}={'9' * 20}" for i in range(40)))) == 250


def run_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    for name in ("summary.json", "steps.parquet", "trace.json", "timeline.png", FAILED_FILE):
        (folder / name).write_text("x")
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    return folder


@pytest.mark.parametrize(
    "policy, logged",
    [
        (ArtifactPolicy.small, [".hydra", "steps.parquet", "summary.json", "timeline.png"]),
        (ArtifactPolicy.all, [".hydra", "steps.parquet", "summary.json", "timeline.png", "trace.json"]),
        (ArtifactPolicy.none, []),
    ],
)
def test_artifact_policies(tmp_path, policy, logged):
    """The tracking-failure marker is never an artifact; `small` keeps the trace in the folder only."""
    assert [p.name for p in artifact_files(run_folder(tmp_path), policy)] == logged


def test_store_uris_keep_url_characters_of_a_folder(tmp_path):
    folder = tmp_path / "a#b?c%20d"
    uri = sqlite_uri(folder / "mlflow.db")
    assert uri == "sqlite:///" + str(folder).replace("%", "%25").replace("#", "%23").replace("?", "%3F") + "/mlflow.db"
    assert sqlite_path(uri) == folder / "mlflow.db"
    assert sqlite_path(uri + "?timeout=5") == folder / "mlflow.db"
    assert sqlite_path("http://127.0.0.1:5000") is None and sqlite_path("postgresql://h/db") is None


def test_requests_to_a_server_are_bounded_once_unless_set(monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    bound_requests(TrackingConfig(timeout_s=2.2))
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0" and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "3"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "9")
    bound_requests(TrackingConfig(timeout_s=0.1))
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "9"  # the user's setting wins
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    bound_requests(TrackingConfig(timeout_s=0.1))
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "1"  # at least a second


@pytest.mark.parametrize(
    "error, reason",
    [
        (ConnectionError("HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded (Caused by NewConnectionError("
                         "'<urllib3.connection.HTTPConnection object>: Failed to establish a new connection: [Errno 111] Connection refused'))"),
         "Connection refused"),
        (TimeoutError("Read timed out. (read timeout=5)"), "no answer in time (tracking.timeout_s)"),
        (RuntimeError("x" * 400), "x" * 300),
    ],
)
def test_a_failed_store_is_said_in_a_few_words(error, reason):
    assert short_reason(error) == reason


def test_the_command_that_logs_a_run_later_names_only_what_differs(tmp_path):
    folder = tmp_path / "my run"
    assert later_command(folder, TrackingConfig()) == f"python -m harness.tracking log '{folder}'"
    assert later_command(folder, TrackingConfig(uri="http://h:5000", experiment="team x")) == (
        f"python -m harness.tracking log '{folder}' --uri http://h:5000 --experiment 'team x'"
    )


def test_a_store_that_failed_before_is_not_asked_again(tmp_path, monkeypatch):
    """In a sweep, once the store failed, later jobs mark their folders without waiting on it."""
    monkeypatch.setenv(FAILED_ENV, "tracking.uri=http://h: Connection refused")
    folder = run_folder(tmp_path)
    with pytest.raises(TrackingError, match="tracking failed, the run's files are kept .tracking.uri=http://h: Connection refused."):
        log_run_or_mark(TrackingConfig(uri="http://h:5000"), folder, {}, pd.DataFrame(), {}, NAMES)
    assert (folder / FAILED_FILE).read_text() == (
        f"tracking.uri=http://h: Connection refused\nlog this run later with:\n  python -m harness.tracking log {folder} --uri http://h:5000\n"
    )


def test_a_run_is_logged_with_every_number_its_params_and_its_step_series(tmp_path):
    import mlflow

    store = f"sqlite:///{tmp_path / 'store.db'}"
    tracking = TrackingConfig(uri=store, experiment="units", artifacts=ArtifactPolicy.small)
    folder = run_folder(tmp_path)
    (folder / FAILED_FILE).unlink()
    summary = {"throughput_tok_s": 12.5, "tasks_simulated": 2**40, "graph_captures": 2, "bound": "host", "graph_note": "a note",
               "padding_waste": 0.25, "nan_value": float("nan"), "flag": True}
    steps = pd.DataFrame({"step": [0, 1, 2], "latency_ms": [3000.0, 2.0, 2.5], "measured": [False, True, True]})
    # MLflow's own limit, not ours: a value of exactly that length is logged whole, one more is cut.
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    assert MAX_PARAM_CHARS == MAX_PARAM_VAL_LENGTH
    params = {"workload.batch_size": 8, "workload.steps": 3, "seed": 0, "hardware.host.launch_us": 12.0, "strategy.tiling_cache": False,
              "long": "y" * (MAX_PARAM_VAL_LENGTH + 1), "exact": "z" * MAX_PARAM_VAL_LENGTH, "tracking.uri": "sqlite:///x.db"}
    os.utime(folder / ".hydra" / "config.yaml", (1_700_000_000.0, 1_700_000_000.0))  # Hydra writes it as the job starts
    os.utime(folder / "summary.json", (1_700_000_012.5, 1_700_000_012.5))  # the run writes it last
    run_id = log_run(tracking, folder, summary, steps, params, NAMES, "workload.batch_size=8 long=y exact=z tracking.uri=sqlite:///x.db")
    client = mlflow.MlflowClient(tracking_uri=store)
    run = client.get_run(run_id)
    # Numbers (integers too), not booleans, not text, not NaN (MLflow keeps no NaN), by group.
    assert run.data.metrics == {"headline/throughput_tok_s": 12.5, "other/tasks_simulated": float(2**40), "other/graph_captures": 2.0,
                                "other/padding_waste": 0.25, "series/step_ms": 2.5, "series/warmup_step_ms": 3000.0}
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "series/step_ms")] == [(1, 2.0), (2, 2.5)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "series/warmup_step_ms")] == [(0, 3000.0)]
    # Params: what was chosen (presets, what ran, the command line's keys), not where runs go nor the defaults.
    assert run.data.params == {**NAMES, "workload.batch_size": "8", "workload.steps": "3", "seed": "0",
                               "exact": "z" * MAX_PARAM_VAL_LENGTH, "long": "y" * (MAX_PARAM_VAL_LENGTH - 3) + "..."}
    # ... and the whole config in an artifact, every value as the run had it.
    resolved = yaml.safe_load(read_local_artifact(client, run_id, "resolved_config.yaml"))
    assert resolved == {"workload": {"batch_size": 8, "steps": 3}, "seed": 0, "hardware": {"host": {"launch_us": 12.0}},
                        "strategy": {"tiling_cache": False}, "long": params["long"], "exact": params["exact"], "tracking": {"uri": "sqlite:///x.db"}}
    tags = run.data.tags
    assert {k: tags[k] for k in ("hardware", "workload", "strategy", "bound", "run_dir", "overrides", "notes", "files_only_in_run_dir")} == {
        **{k: NAMES[k] for k in ("hardware", "workload", "strategy")}, "bound": "host", "run_dir": str(folder),
        "overrides": "workload.batch_size=8 long=y exact=z tracking.uri=sqlite:///x.db", "notes": "2 captures; padding waste 0.25; a note",
        "files_only_in_run_dir": "trace.json",
    }
    assert run.info.status == "FINISHED" and run.info.run_name == "llama2_7b_decode·eager·atlas_a2·batch_size=8·long=y·exact=z"
    # MLflow's Duration is the run's 12.5 s, not the time logging took.
    assert (run.info.start_time, run.info.end_time) == (1_700_000_000_000, 1_700_000_012_500)
    assert "mlflow.parentRunId" not in tags
    assert sorted(a.path for a in client.list_artifacts(run_id)) == [".hydra", "resolved_config.yaml", "steps.parquet", "summary.json", "timeline.png"]


def test_a_sweeps_jobs_are_read_back_from_its_folder(tmp_path):
    sweep = tmp_path / "sweep"
    for job in ("0_a", "1_b"):
        (sweep / job).mkdir(parents=True)
        (sweep / job / "summary.json").write_text('{"hardware": "h100", "workload": "w", "strategy": "eager", "batch_size": 2,'
                                                  ' "throughput_tok_s": 5.0, "overrides": "x=1"}')
        pd.DataFrame({"step": [0], "latency_ms": [1.0], "measured": [True]}).to_parquet(sweep / job / "steps.parquet")
    (sweep / "2_unfinished").mkdir()
    assert run_folders(sweep) == [sweep / "0_a", sweep / "1_b"]
    assert run_folders(sweep / "0_a") == [sweep / "0_a"]
    measured, steps, params, names, overrides = read_run_dir(sweep / "0_a")
    assert measured == {"throughput_tok_s": 5.0} and names == {"hardware": "h100", "workload": "w", "strategy": "eager", "engine": "none"}
    assert overrides == "x=1" and params == {} and steps["latency_ms"].tolist() == [1.0]


def test_logging_folders_later_checks_them_all_before_logging_any(tmp_path, capsys):
    """`python -m harness.tracking log good bad`: the second folder's summary is not JSON (a run killed while
    writing it), so the command refuses in one line with exit 2 before the first is logged (the store
    stays empty)."""
    import mlflow

    from harness.base.errors import EXIT_BAD_INPUT
    from harness.tracking.log_command import main

    for job, summary in (("good", '{"hardware": "h100", "workload": "w", "strategy": "eager", "throughput_tok_s": 5.0}'), ("bad", "{")):
        (tmp_path / job).mkdir()
        (tmp_path / job / "summary.json").write_text(summary)
        pd.DataFrame({"step": [0], "latency_ms": [1.0], "measured": [True]}).to_parquet(tmp_path / job / "steps.parquet")
    store = sqlite_uri(tmp_path / "mlflow.db")
    assert main(["log", str(tmp_path / "good"), str(tmp_path / "bad"), "--uri", store]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"hostbound tracking: error: {tmp_path / 'bad'}: not a finished run's folder (JSONDecodeError" in err
    client = mlflow.MlflowClient(tracking_uri=store)
    assert [run for experiment in client.search_experiments() for run in client.search_runs([experiment.experiment_id])] == []


def test_a_damaged_steps_table_is_refused_in_words(tmp_path):
    (tmp_path / "summary.json").write_text('{"hardware": "h100"}')
    (tmp_path / "steps.parquet").write_text("not parquet")
    with pytest.raises(HarnessError, match=r"not a finished run.s folder \(ArrowInvalid"):
        read_run_dir(tmp_path)


@pytest.mark.parametrize(
    "key, metric",
    [("throughput_tok_s", "headline/throughput_tok_s"), ("median_tpot_ms", "headline/median_tpot_ms"),
     ("breakdown_launch", "path_share/launch"), ("breakdown_infer_shape", "path_share/infer_shape"),
     ("time_share_launch", "time_share/launch"), ("device_busy", "other/device_busy"), ("capture_ms", "other/capture_ms")],
)
def test_a_summary_key_has_one_metric_name_and_comes_back_from_it(key, metric):
    assert metric_name(key) == metric and summary_key(metric) == key
    assert summary_key(key) == key  # an older store's name (no group) is the summary's own


def test_the_headline_metrics_sort_before_every_other_metric():
    """MLflow's compare page and column picker list metrics in text order (JavaScript's sort): the
    figures users compare must come first, whatever the other summary keys are."""
    keys = ["bubble_ratio", "breakdown_compute", "capture_ms", "device_busy", "throughput_tok_s", "time_share_sync", "ttft_ms",
            "median_tpot_ms", "a_future_key", "step_ms_p50", "zeta"]
    metrics = sorted([metric_name(k) for k in keys] + ["series/step_ms", "series/warmup_step_ms"])
    headline = [m for m in metrics if summary_key(m) in HEADLINE_METRICS]
    assert metrics[: len(headline)] == headline and len(headline) == 5


def test_params_are_what_was_chosen():
    params = {"workload.batch_size": 8, "workload.steps": 4, "seed": 1, "workload.serving.enabled": False, "strategy.graph.mode": "full",
              "strategy.graph.buckets": [1, 2], "workload.card_overrides.layers": 2, "workload.card_overrides.hidden": 64,
              "output.trace_steps": 0, "hydra_key": 1}
    chosen = chosen_params(params, NAMES, "strategy=acl_graph strategy.graph.mode=full +workload.card_overrides=x output.trace_steps=0 ~seed")
    assert chosen == {**NAMES, "workload.batch_size": 8, "workload.steps": 4, "seed": 1, "workload.serving.enabled": False,
                      "strategy.graph.mode": "full", "workload.card_overrides.layers": 2, "workload.card_overrides.hidden": 64}


def test_experiments_that_differ_in_what_their_presets_set_get_different_params():
    """Three saturated vLLM 0.5 experiments differ only in engine keys their presets set (the second and
    third build on the first): each run's params name its experiment and hold those keys, and a serving
    run's request stream (which sets its batches, not workload.batch_size)."""
    chosen = {}
    for name in ("h100_vllm05_saturated", "h100_vllm05_saturated_async_output", "h100_vllm05_saturated_multistep8"):
        params = flatten(OmegaConf.to_container(compose_config([f"+experiment={name}"]), resolve=True, enum_to_str=True))
        chosen[name] = chosen_params(params, NAMES, f"+experiment={name} tracking.enabled=false")
        assert chosen[name]["experiment"] == name
        assert chosen[name]["workload.serving.max_batch"] == params["workload.serving.max_batch"]
        assert {"engine.async_output", "engine.multi_step"} & set(chosen[name]) or name == "h100_vllm05_saturated"
    assert chosen["h100_vllm05_saturated_multistep8"]["engine.multi_step"] == 8
    assert len({tuple(sorted(c.items())) for c in chosen.values()}) == 3


def test_the_report_reads_an_older_stores_plain_metric_names_and_the_grouped_ones_alike(tmp_path):
    """Runs logged before the metrics were grouped (throughput_tok_s) and after (headline/throughput_tok_s)
    come back from the store under the summary's names, in one table; their step series (step_ms before,
    series/step_ms after), whose last value MLflow keeps, are no column of it."""
    import mlflow

    from harness.tracking.read import load_mlflow

    store = f"sqlite:///{tmp_path / 'store.db'}"
    client = mlflow.MlflowClient(tracking_uri=store)
    experiment = client.create_experiment("hostbound")
    for strategy, names in (("eager", lambda k: k), ("async", metric_name)):
        run = client.create_run(experiment, tags={**NAMES, "strategy": strategy, "bound": "host"}).info.run_id
        for key, value in (("throughput_tok_s", 10.0 if strategy == "eager" else 15.0), ("breakdown_launch", 0.5), ("device_busy", 0.25)):
            client.log_metric(run, names(key), value)
        client.log_param(run, "workload.batch_size", "8")
        client.log_metric(run, "series/step_ms" if strategy == "async" else "step_ms", 69.6)  # a step series' last value
        client.set_terminated(run)
    table = load_mlflow(store).set_index("strategy")
    assert not {"step_ms", "series/step_ms"} & set(table.columns)
    assert table.loc["eager", "throughput_tok_s"] == 10.0 and table.loc["async", "throughput_tok_s"] == 15.0
    assert (table["breakdown_launch"] == 0.5).all() and (table["device_busy"] == 0.25).all() and (table["batch_size"] == 8).all()
    assert not any("/" in column for column in table.columns)


def test_a_runs_duration_holds_its_simulation(tmp_path):
    """MLflow's Duration runs from the job's start (.hydra/config.yaml) to summary.json; a single run's
    checks before Hydra already build and simulate it, so the start is taken back to cover sim_wall_s
    (a run of 0.187 s of simulation had shown 0.161 s). Without the files, MLflow's own times."""
    from harness.tracking.store import run_times_ms

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("a: 1\n")
    (tmp_path / "summary.json").write_text(json.dumps({"sim_wall_s": 0.5}))
    os.utime(tmp_path / ".hydra" / "config.yaml", (1000.0, 1000.0))
    os.utime(tmp_path / "summary.json", (1000.2, 1000.2))
    assert run_times_ms(tmp_path, 0.5) == (int((1000.2 - 0.5) * 1000), 1000200)
    assert run_times_ms(tmp_path, 0.1) == (1000000, 1000200)  # the job's start, where it is the earlier
    assert run_times_ms(tmp_path / "nothing", 0.5) == (None, None)


def test_a_runs_metrics_are_logged_headline_first_throughput_leading():
    """MLflow's run page lists metrics as logged (a serving run's TTFT and TPOT sat 60th of 70, under every
    path_share/ and time_share/), and its compare page plots the first one logged."""
    from harness.tracking.store import _logging_order

    names = ["other/device_busy", "path_share/launch", "headline/median_tpot_ms", "time_share/compute", "headline/throughput_tok_s",
             "headline/step_ms_p50", "advice/rank"]
    assert [n for n, _ in sorted(((n, 0.0) for n in names), key=_logging_order)] == [
        "headline/throughput_tok_s", "headline/step_ms_p50", "headline/median_tpot_ms",
        "advice/rank", "other/device_busy", "path_share/launch", "time_share/compute"]



def finished_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text('{"hardware": "h100", "workload": "w", "strategy": "eager", "bound": "host", "throughput_tok_s": 5.0}')
    pd.DataFrame({"step": [0], "latency_ms": [1.0], "measured": [True]}).to_parquet(folder / "steps.parquet")
    return folder


@pytest.mark.parametrize("name", ["o'brien", 'say "hi"', "it's \"both\" a\\b", "plain"])
def test_a_folder_with_quotes_in_its_path_is_logged_once(tmp_path, capsys, name):
    """MLflow's filter has no escapes: `o\\'brien` matched nothing and the folder was logged again each time."""
    import mlflow

    from harness.tracking.log_command import main

    folder = finished_folder(tmp_path / name)
    finished_folder(tmp_path / (name + "x"))  # a longer path the broad search also finds
    store = sqlite_uri(tmp_path / "mlflow.db")
    assert main(["log", str(tmp_path / (name + "x")), "--uri", store]) == 0
    assert main(["log", str(folder), "--uri", store]) == 0
    assert main(["log", str(folder), "--uri", store]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{folder}: already in {store}"
    client = mlflow.MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("hostbound").experiment_id
    assert sorted(run.data.tags["run_dir"] for run in client.search_runs([experiment])) == sorted([str(folder), str(folder) + "x"])


@pytest.mark.parametrize(
    "uri, said",
    [
        # A driver's password in the query is as secret as user:password@, and every record would keep it.
        ("postgresql+psycopg2://mlflow@127.0.0.1:1/mlflow?password=s3cret", "holds a password (in its query)"),
        ("mysql://u@h/db?charset=utf8&PASSWD=s3cret", "holds a password (in its query)"),
        # In-memory stores said "logged" and kept nothing.
        ("sqlite://", "an in-memory sqlite database keeps nothing"),
        ("sqlite:///:memory:", "an in-memory sqlite database keeps nothing"),
        ("sqlite:///file::memory:?cache=shared&uri=true", "an in-memory sqlite database keeps nothing"),
    ],
)
def test_a_uri_with_a_password_in_its_query_or_an_in_memory_store_is_refused_in_one_line(uri, said):
    from harness.config.schema import ConfigError

    with pytest.raises(ConfigError) as refused:
        TrackingConfig(uri=uri)
    text = str(refused.value)
    assert text.startswith("tracking.uri=") and said in text and "\n" not in text and "s3cret" not in text


def test_the_log_command_refuses_a_password_in_the_uris_query_with_exit_2(tmp_path, capsys):
    from harness.base.errors import EXIT_BAD_INPUT
    from harness.tracking.log_command import main

    folder = finished_folder(tmp_path / "run")
    assert main(["log", str(folder), "--uri", "postgresql://u@127.0.0.1:1/db?password=s3cret"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tracking.uri=" in err and "s3cret" not in err


def test_the_report_reads_each_run_folder_once_its_newest_finished_run_and_no_parents(tmp_path):
    """A FAILED run, a folder logged twice and the parent runs of a sweep and an advice were rows of their own
    (an advice's parent as a run with speedup nan)."""
    import mlflow

    from harness.tracking.read import load_mlflow

    store = f"sqlite:///{tmp_path / 'store.db'}"
    client = mlflow.MlflowClient(tracking_uri=store)
    experiment = client.create_experiment("hostbound")
    made = [  # (run_dir, kind, status, throughput), oldest first
        ("/runs/a", None, "FINISHED", 1.0), ("/runs/a", None, "FINISHED", 2.0), ("/runs/b", None, "FAILED", 3.0),
        ("/runs/c", None, "FINISHED", 4.0), (None, "sweep", "FINISHED", 5.0), (None, "advice", "FINISHED", 6.0),
    ]
    for number, (run_dir, kind, status, throughput) in enumerate(made):
        tags = {**NAMES, "bound": "host", **({"run_dir": run_dir} if run_dir else {}), **({"kind": kind} if kind else {})}
        run = client.create_run(experiment, tags=tags, start_time=1_700_000_000_000 + number * 1000).info.run_id
        client.log_metric(run, "headline/throughput_tok_s", throughput)
        client.set_terminated(run, status=status)
    table = load_mlflow(store)
    assert sorted(zip(table["run_dir"], table["throughput_tok_s"])) == [("/runs/a", 2.0), ("/runs/c", 4.0)]


def test_a_database_store_that_is_down_costs_a_run_its_timeout_not_minutes(tmp_path):
    """MLflow made a database store's engine ~10 times with backoff: a run against a database that was down
    waited ~100 s per store call (3 min 24 s a run) whatever tracking.timeout_s said."""
    import socket
    import time

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tracking = TrackingConfig(uri=f"postgresql+psycopg2://mlflow@127.0.0.1:{port}/mlflow", timeout_s=1)
    folder = run_folder(tmp_path)
    started = time.monotonic()
    with pytest.raises(TrackingError, match="tracking failed, the run's files are kept"):
        log_run_or_mark(tracking, folder, {"bound": "host"}, pd.DataFrame({"step": [], "latency_ms": [], "measured": []}), {}, NAMES)
    assert time.monotonic() - started < 10 and (folder / FAILED_FILE).is_file()


def test_each_connection_to_a_database_store_waits_the_tracking_timeout():
    """A database host that drops packets held a run for the driver's own connect wait (psycopg2: the OS's)."""
    from types import SimpleNamespace

    from harness.tracking.store import _bounded_connect, mlflow_module

    mlflow_module()
    bound_requests(TrackingConfig(timeout_s=2.5))
    for driver, expected in (("psycopg2", {"connect_timeout": 3}), ("pysqlite", {})):
        params: dict = {}
        _bounded_connect(SimpleNamespace(driver=driver), None, [], params)
        assert params == expected
    params = {"connect_timeout": 30}  # the URI's own value wins
    _bounded_connect(SimpleNamespace(driver="psycopg2"), None, [], params)
    assert params == {"connect_timeout": 30}
    import mlflow.store.db.utils

    assert mlflow.store.db.utils.MAX_RETRY_COUNT == 1


def test_a_folder_given_through_a_symlink_is_the_folder_itself(tmp_path, capsys):
    import mlflow

    from harness.tracking.log_command import main

    folder = finished_folder(tmp_path / "run")
    (tmp_path / "link").symlink_to(folder)
    store = sqlite_uri(tmp_path / "mlflow.db")
    assert main(["log", str(folder), "--uri", store]) == 0
    assert main(["log", str(tmp_path / "link"), "--uri", store]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{folder}: already in {store}"
    client = mlflow.MlflowClient(tracking_uri=store)
    assert len(client.search_runs([client.get_experiment_by_name("hostbound").experiment_id])) == 1


def test_a_run_logged_through_a_symlink_is_found_by_its_real_folder(tmp_path, capsys):
    """The other way round: the run logged under a path through a link (as Hydra's output_dir keeps it,
    links and all) and `log` given the real folder: one run, its run_dir tag the real folder."""
    import mlflow

    from harness.tracking.log_command import main
    from harness.tracking.store import log_folder

    folder = finished_folder(tmp_path / "run")
    (tmp_path / "link").symlink_to(folder)
    store = sqlite_uri(tmp_path / "mlflow.db")
    assert log_folder(TrackingConfig(uri=store), tmp_path / "link") is not None  # as the run itself logs it
    assert main(["log", str(folder), "--uri", store]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{folder}: already in {store}"
    client = mlflow.MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("hostbound").experiment_id])
    assert [run.data.tags["run_dir"] for run in runs] == [str(folder.resolve())]


def test_a_sweep_logged_later_gets_its_parent_run_and_live_names_once(tmp_path, capsys):
    """A sweep run without a store, logged later: its jobs were runs of their own (no parent run, no
    results, named presets first), which `report --parent` could not find. Now as a live sweep logs
    them: one parent (kind sweep, FINISHED, results attached), the jobs its children named by what the
    sweep varies first; a second `log` adds nothing."""
    import mlflow

    from conftest import run_cli
    from harness.tracking.log_command import main
    from harness.tracking.store import PARENT_FILE

    made = run_cli("-m", "strategy=eager,async", "workload.steps=3", "tracking.enabled=false", "output.timeline_steps=0",
                   "output.print_summary=false", f"hydra.sweep.dir={tmp_path / 'sw'}", cwd=tmp_path, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    assert not (tmp_path / "sw" / PARENT_FILE).exists()
    store = sqlite_uri(tmp_path / "later.db")
    assert main(["log", str(tmp_path / "sw"), "--uri", store]) == 0
    assert capsys.readouterr().out.count("logged as run") == 2
    client = mlflow.MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("hostbound").experiment_id

    def runs():
        return client.search_runs([experiment])

    parents = [run for run in runs() if run.data.tags.get("kind") == "sweep"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep_dir"] == str(tmp_path / "sw")
    assert parent.info.run_name == "sweep llama2_7b_decode·atlas_a2·steps=3 · strategy=eager,async · sw"
    assert parent.data.params == {"strategy": "eager,async", "workload.steps": "3"}
    assert parent.data.metrics["jobs"] == 2.0
    assert {"results.csv", "results.md"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    jobs = [run for run in runs() if run.data.tags.get("kind") != "sweep"]
    assert sorted(run.info.run_name for run in jobs) == ["async·llama2_7b_decode·atlas_a2·steps=3", "eager·llama2_7b_decode·atlas_a2·steps=3"]
    assert all(run.data.tags.get("mlflow.parentRunId") == parent.info.run_id for run in jobs)
    # Again, the sweep's folder or one of its jobs (also with the folder's parent-run file gone): nothing new.
    assert main(["log", str(tmp_path / "sw"), "--uri", store]) == 0
    (tmp_path / "sw" / PARENT_FILE).unlink(missing_ok=True)
    assert main(["log", str(jobs[0].data.tags["run_dir"]), "--uri", store]) == 0
    assert "logged as run" not in capsys.readouterr().out
    assert sorted(run.info.run_id for run in runs()) == sorted([parent.info.run_id, *(run.info.run_id for run in jobs)])
