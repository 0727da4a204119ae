"""A single run's MLflow logging done by a process forked as the command starts (harness.tracking.early):
it logs what the run's own process would, says a failed store the same way, and is never left behind."""
from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import free_port, run_cli
from harness.base.errors import TrackingError
from harness.config.schema import ArtifactPolicy, TrackingConfig
from harness.tracking import early
from harness.tracking.store import FAILED_FILE

NAMES = {"hardware": "atlas_a2", "workload": "llama2_7b_decode", "strategy": "eager", "engine": "none"}


@pytest.fixture
def logging_process(monkeypatch):
    """A logging process forked from this one, ended after the test."""
    if threading.active_count() != 1:
        pytest.skip("other threads run here: nothing is forked")
    monkeypatch.setattr(early, "_child", None)
    early.start_early([])
    child = early._child
    assert child is not None
    yield child
    early._end()


def finished_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "summary.json").write_text("{}")
    return folder


def logged(store: str, run_id: str):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=store).get_run(run_id)


def test_the_process_logs_the_run_and_says_its_id(logging_process, tmp_path):
    store = f"sqlite:///{tmp_path / 'store.db'}"
    tracking = TrackingConfig(uri=store, experiment="early", artifacts=ArtifactPolicy.small)
    early.open_store(tracking)
    steps = {"step": np.arange(3), "latency_ms": np.array([3.0, 2.0, 2.5]), "measured": np.array([False, True, True])}
    run_id = early.log_run_or_mark(tracking, finished_folder(tmp_path), {"throughput_tok_s": 7.5, "bound": "host"}, steps,
                                   {"workload.batch_size": 8}, NAMES, "workload.batch_size=8")
    run = logged(store, run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["headline/throughput_tok_s"] == 7.5
    assert run.data.params == {**NAMES, "workload.batch_size": "8"} and run.data.tags["overrides"] == "workload.batch_size=8"
    early._end()
    with pytest.raises(ChildProcessError):  # it ended on end of input and was reaped
        os.waitpid(logging_process.pid, os.WNOHANG)


def test_a_store_that_fails_is_a_tracking_error_with_its_mark(logging_process, tmp_path):
    tracking = TrackingConfig(uri=f"http://127.0.0.1:{free_port()}", experiment="early", timeout_s=2)  # nothing listens
    early.open_store(tracking)
    folder = finished_folder(tmp_path)
    with pytest.raises(TrackingError) as failed:
        early.log_run_or_mark(tracking, folder, {"throughput_tok_s": 1.0, "bound": "host"}, {"step": np.arange(1),
                              "latency_ms": np.ones(1), "measured": np.ones(1, dtype=bool)}, {}, NAMES, "")
    assert "log it later: python -m harness.tracking log" in str(failed.value)
    assert (folder / FAILED_FILE).is_file()
    assert early._child is logging_process  # said by the process, not by a fallback here


def test_a_dead_process_leaves_the_logging_to_the_run(logging_process, tmp_path):
    os.kill(logging_process.pid, signal.SIGKILL)
    store = f"sqlite:///{tmp_path / 'store.db'}"
    tracking = TrackingConfig(uri=store, experiment="early", artifacts=ArtifactPolicy.small)
    run_id = early.log_run_or_mark(tracking, finished_folder(tmp_path), {"throughput_tok_s": 2.0, "bound": "device"},
                                   {"step": np.arange(1), "latency_ms": np.ones(1), "measured": np.ones(1, dtype=bool)}, {}, NAMES, "")
    assert logged(store, run_id).info.status == "FINISHED" and early._child is None


def test_an_unused_process_is_killed_at_exit_without_waiting(logging_process):
    early._end()  # nothing was asked of it: it may be killed at once
    with pytest.raises(ChildProcessError):
        os.waitpid(logging_process.pid, os.WNOHANG)


@pytest.mark.parametrize("argv", [["-m", "seed=0,1"], ["seed=0,1"], ["tracking.enabled=false"], ["--cfg", "job"]])
def test_no_process_for_sweeps_flags_or_untracked_runs(monkeypatch, argv):
    monkeypatch.setattr(early, "_child", None)
    early.start_early(argv)
    assert early._child is None


@pytest.mark.slow
def test_a_tracked_command_is_logged_by_the_process_as_its_own_would(tmp_path):
    import mlflow

    done = run_cli("workload.steps=3", "hydra.run.dir=run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[harness.tracking.early][INFO] - logged MLflow run" in (tmp_path / "run" / "hostbound.log").read_text()
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    (run,) = [r for e in client.search_experiments() for r in client.search_runs(e.experiment_id)]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert run.info.status == "FINISHED"
    assert run.data.metrics["headline/throughput_tok_s"] == summary["throughput_tok_s"]
    assert run.data.params["workload.steps"] == "3" and run.data.tags["run_dir"] == str(tmp_path / "run")
    measured = pd.read_parquet(tmp_path / "run" / "steps.parquet")["measured"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "series/step_ms")] == list(np.flatnonzero(measured))


def test_the_logging_process_takes_sigterm_by_its_own_handler(logging_process):
    """It set its handlers and unblocked the stops it was forked with: SIGTERM ends it by them (128 + 15 while
    it imports MLflow, 1 once it unwinds its loop), where a process that never unblocked would sit on the
    signal until the command's grace ran out and killed it."""
    import time

    os.kill(logging_process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(logging_process.pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(logging_process.pid, signal.SIGKILL)
    assert done[0] == logging_process.pid and os.waitstatus_to_exitcode(done[1]) in (1, 128 + signal.SIGTERM)


def test_a_store_that_failed_to_open_is_not_asked_again_when_the_run_is_logged(logging_process, tmp_path):
    """A server that accepts and never answers cost a run twice tracking.timeout_s: the open, then the log."""
    import contextlib
    import socket
    import time

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # accepts connections (the kernel does), never answers
        tracking = TrackingConfig(uri=f"http://127.0.0.1:{server.getsockname()[1]}", experiment="early", timeout_s=2)
        started = time.monotonic()
        early.open_store(tracking)
        folder = finished_folder(tmp_path)
        with pytest.raises(TrackingError) as failed:
            early.log_run_or_mark(tracking, folder, {"throughput_tok_s": 1.0, "bound": "host"}, {"step": np.arange(1),
                                  "latency_ms": np.ones(1), "measured": np.ones(1, dtype=bool)}, {}, NAMES, "")
        took = time.monotonic() - started
        server.setblocking(False)
        asked = 0  # connections the store was asked on: the open's only (the log's made a second)
        with contextlib.suppress(BlockingIOError):
            while True:
                server.accept()[0].close()
                asked += 1
    assert "no answer in time" in str(failed.value) and (folder / FAILED_FILE).is_file()
    assert asked == 1 and took < 2 * tracking.timeout_s + 2, (asked, took)
