"""The default sweep launcher (harness/sweep/launcher.py, issue 15 items 1 and 2): jobs in warm worker processes
forked from the sweep give what Hydra's basic launcher gives, and a sweep whose worker is killed, or
that is stopped by Ctrl-C, leaves no run RUNNING, says so in one line, and resumes to the same results."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from conftest import comparable_results, run_cli
from harness.sweep import callbacks as sweep
from harness.base.forking import cores_usable
from harness.base.stopping import stop_with, store_call
from harness.base.stopping import SweepStopped
from harness.tracking.store import PARENT_FILE

ENV = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
# Slow enough jobs (~1 s each) that a worker can be caught in the middle of one.
SLOW_SWEEP = ["-m", "strategy=eager,async,pipeline,acl_graph", "workload.batch_size=1,8", "workload.steps=300",
              "output.timeline_steps=0", "output.print_summary=false"]


def runs_in(database: Path) -> list[tuple[str, str, str | None]]:
    """(name, status, parent run id) of every run in a sqlite store."""
    with sqlite3.connect(database) as con:
        return con.execute(
            "SELECT r.name, r.status, t.value FROM runs r LEFT JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'mlflow.parentRunId'"
        ).fetchall()


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def alive(pids: list[int]) -> list[int]:
    """Those of `pids` still running (a zombie has ended)."""
    left = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                left.append(pid)
        except OSError:
            pass
    return left


def start(tmp_path: Path, folder: str, *extra: str, new_session: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *SLOW_SWEEP, f"hydra.sweep.dir={folder}",
                             f"tracking.uri=sqlite:///{tmp_path / (folder + '.db')}", *extra],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session)


def wait_for_jobs(tmp_path: Path, folder: str, proc: subprocess.Popen, finished: int) -> None:
    deadline = time.monotonic() + 240
    while len(list((tmp_path / folder).glob("*/summary.json"))) < finished:
        assert time.monotonic() < deadline and proc.poll() is None, "the sweep ended before it could be interrupted"
        time.sleep(0.05)


@pytest.mark.slow
def test_the_default_launcher_runs_every_job_once_in_workers_as_the_basic_launcher_does(tmp_path):
    common = ["-m", "strategy=eager,async,pipeline,acl_graph", "workload.batch_size=1,8", "workload.steps=4", "output.print_summary=false"]
    warm = run_cli(*common, "hydra.sweep.dir=warm", cwd=tmp_path, timeout=300)
    basic = run_cli(*common, "hydra/launcher=basic", "hydra.sweep.dir=basic", cwd=tmp_path, timeout=300)
    assert warm.returncode == basic.returncode == 0, (warm.stderr + basic.stderr)[-3000:]
    workers = min(8, cores_usable())
    assert f"Launching 8 jobs on {workers} worker process{'es' if workers > 1 else ''}" in warm.stderr
    jobs = sorted(p.name for p in (tmp_path / "warm").iterdir() if p.is_dir())
    assert len(jobs) == 8 and jobs == sorted(p.name for p in (tmp_path / "basic").iterdir() if p.is_dir())
    for job in jobs:  # Hydra's record of each job: the same composed config and overrides
        for name in ("config.yaml", "overrides.yaml"):
            assert (tmp_path / "warm" / job / ".hydra" / name).read_text() == (tmp_path / "basic" / job / ".hydra" / name).read_text()
    assert comparable_results(pd.read_csv(tmp_path / "warm" / "results.csv")).equals(comparable_results(pd.read_csv(tmp_path / "basic" / "results.csv")))

    runs = runs_in(tmp_path / "outputs" / "mlflow.db")
    parents = [name for name, status, parent in runs if name.startswith("sweep ")]
    assert len(parents) == 2 and {status for _, status, _ in runs} == {"FINISHED"}
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    warm_parent = (tmp_path / "warm" / PARENT_FILE).read_text().strip()
    logged = [r.data.tags["run_dir"] for r in client.search_runs(["1"], f"tags.`mlflow.parentRunId` = '{warm_parent}'")]
    assert sorted(Path(d).name for d in logged) == jobs  # every job once, under its own sweep


@pytest.mark.slow
def test_a_killed_worker_ends_the_sweep_in_one_line_leaving_no_run_open_and_resume_finishes_it(tmp_path):
    whole = start(tmp_path, "whole")
    cut = start(tmp_path, "cut")
    wait_for_jobs(tmp_path, "cut", cut, finished=1)
    workers = children(cut.pid)
    assert workers, "the sweep has no worker processes"
    os.kill(workers[0], signal.SIGKILL)  # as the out-of-memory killer would
    _, err = cut.communicate(timeout=120)
    assert cut.returncode == 5, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("hostbound: error: a sweep worker process died"), err[-2000:]
    assert "Traceback" not in err
    time.sleep(1)
    assert alive(workers) == [], "workers left running"
    runs = runs_in(tmp_path / "cut.db")
    assert "RUNNING" not in {status for _, status, _ in runs}, runs
    assert [status for name, status, _ in runs if name.startswith("sweep ")] == ["FAILED"]
    assert whole.wait(timeout=400) == 0, whole.stderr.read()[-2000:]

    resumed = start(tmp_path, "cut", "resume=true")
    _, err = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, err[-3000:]
    assert comparable_results(pd.read_csv(tmp_path / "cut" / "results.csv")).equals(comparable_results(pd.read_csv(tmp_path / "whole" / "results.csv")))
    jobs = [(name, status) for name, status, _ in runs_in(tmp_path / "cut.db") if not name.startswith("sweep ")]
    finished = [name for name, status in jobs if status == "FINISHED"]
    assert len(finished) == 8 and len(set(finished)) == 8  # each configuration logged once
    assert "RUNNING" not in {status for _, status in jobs}


@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_and_its_workers_in_one_line(tmp_path):
    proc = start(tmp_path, "sw", new_session=True)  # its own process group, as a terminal's foreground job
    wait_for_jobs(tmp_path, "sw", proc, finished=1)
    workers = children(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGINT, err[-3000:]
    assert err.strip().splitlines()[-1] == ("hostbound: error: stopped by SIGINT (Ctrl-C); finished jobs keep their folders"
                                            " (resume=true finishes the rest)")
    assert "Traceback" not in err
    time.sleep(1)
    assert workers and alive(workers) == [], "workers left running"
    runs = runs_in(tmp_path / "sw.db")
    assert "RUNNING" not in {status for _, status, _ in runs}, runs
    assert [status for name, status, _ in runs if name.startswith("sweep ")] == ["KILLED"]


def test_a_stop_inside_a_store_call_is_raised_when_the_call_ends():
    steps = []
    with pytest.raises(SweepStopped):
        with store_call():
            with store_call():  # nested: the outer block's end raises it
                stop_with(SweepStopped(signal.SIGTERM))
                steps.append("inner")
            steps.append("outer")
    assert steps == ["inner", "outer"]
    with pytest.raises(SweepStopped):  # outside a store call: at once
        stop_with(SweepStopped(signal.SIGTERM))
    with store_call():  # nothing pending is left over
        pass


def test_a_failed_sweep_ends_its_parent_run_and_marks_job_runs_left_open_killed(tmp_path, monkeypatch):
    from harness.config.schema import TrackingConfig

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("hostbound")
    parent = client.create_run(experiment).info.run_id
    open_job = client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id  # its worker was killed
    done_job = client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
    client.set_terminated(done_job, "FINISHED")
    other = client.create_run(experiment).info.run_id  # not this sweep's
    (tmp_path / PARENT_FILE).write_text(parent)
    monkeypatch.setattr(sweep, "_STOPPABLE", {"sweep_dir": tmp_path, "tracking": TrackingConfig(uri=uri)})
    sweep.fail_unfinished_sweep()
    status = {run: client.get_run(run).info.status for run in (parent, open_job, done_job, other)}
    assert status == {parent: "FAILED", open_job: "KILLED", done_job: "FINISHED", other: "RUNNING"}


def test_n_jobs_below_one_is_refused_before_anything_is_made(tmp_path):
    proc = run_cli("-m", "strategy=eager,async", "hydra.launcher.n_jobs=0", "workload.steps=2", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "hostbound: error: hydra.launcher.n_jobs=0: must be a whole number >= 1, or null for one per core"
    assert not (tmp_path / "outputs").exists()


def test_the_launchers_job_runner_does_what_hydras_run_job_does(tmp_path, monkeypatch):
    """harness.sweep.launcher.run_sweep_job is Hydra's run_job with cheaper copies: same .hydra files, same
    JobReturn, the Hydra config of the job while it runs and the previous one after."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobStatus, run_job, setup_globals
    from hydra.types import HydraContext, RunMode
    from hydra._internal.callbacks import Callbacks
    from omegaconf import open_dict

    from harness.config.paths import CONF_DIR
    from harness.sweep.launcher import run_sweep_job

    monkeypatch.chdir(tmp_path)
    setup_globals()
    seen = []

    def task(cfg):
        seen.append((HydraConfig.get().runtime.output_dir, HydraConfig.get().job.num))
        if cfg.workload.batch_size == 3:
            raise ValueError("bad batch")
        return cfg.workload.batch_size * 2

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", ["hydra.sweep.dir=sw"], run_mode=RunMode.MULTIRUN)
        context = HydraContext(config_loader=loader, callbacks=Callbacks())
        for batch in ("4", "3"):
            outcomes = []
            for runner in ("hydra", "ours"):
                config = loader.load_sweep_config(master, [f"workload.batch_size={batch}", "strategy=async"])
                with open_dict(config):
                    config.hydra.job.id = config.hydra.job.num = 5
                before = HydraConfig.instance().cfg
                if runner == "hydra":
                    ret = run_job(task_function=task, config=config, job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir",
                                  hydra_context=context)
                else:
                    ret = run_sweep_job(context, task, config)
                assert HydraConfig.instance().cfg is before
                files = {p.name: p.read_text() for p in Path(seen[-1][0]).glob(".hydra/*.yaml")}
                value = ret.return_value if ret.status == JobStatus.COMPLETED else repr(ret._return_value)
                outcomes.append((files, ret.cfg, ret.hydra_cfg, ret.overrides, ret.status, value, ret.working_dir, ret.task_name, seen[-1]))
            assert outcomes[0] == outcomes[1]
            assert set(outcomes[0][0]) == {"config.yaml", "hydra.yaml", "overrides.yaml"}
    assert Path(seen[0][0]).parent == tmp_path / "sw" and Path(seen[0][0]).name.startswith("5_") and seen[0][1] == 5
    assert outcomes[0][4] == JobStatus.FAILED


def test_a_stop_raised_where_python_cannot_raise_it_prints_no_traceback(monkeypatch, capsys):
    """SIGINT while a weakref callback runs (garbage collection): Python cannot raise the stop there and
    printed "Exception ignored in …" with a traceback before the command's one line; the stop is already
    requested (raise_if_stopped ends the command by it), so the hook says nothing. Other errors still go
    to Python's hook."""
    import weakref

    from harness.base import stopping

    class Thing:
        pass

    monkeypatch.setattr(signal, "signal", lambda *args: None)  # this process keeps its handlers
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # and its hook, after the test
    stopping.stop_on_signals()  # what every command does first
    assert sys.unraisablehook is stopping._quiet_unraisable

    stop = stopping.Stopped(signal.SIGINT)
    passed_on = []
    monkeypatch.setattr(stopping, "_requested", stop)
    monkeypatch.setattr(stopping, "_python_unraisable_hook", lambda unraisable: passed_on.append(type(unraisable.exc_value)))

    for error in (stop, ValueError("not a stop")):
        def callback(_ref, error=error):
            raise error

        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing  # the callback runs here and its exception is unraisable
        assert ref() is None
    assert passed_on == [ValueError]
    assert "Traceback" not in capsys.readouterr().err


def test_an_error_leaving_a_held_block_after_a_stop_gives_way_to_the_stop():
    """Ctrl-C while a held block (composing a config) runs, then the block fails (a value check, or
    OmegaConf left broken): the command ends by the stop, not with a "bad input" line. Without a stop
    the error is the error."""
    from harness.base.errors import ConfigError
    from harness.base.stopping import Stopped, forget, held

    try:
        with pytest.raises(Stopped):
            with held():
                stop_with(Stopped(signal.SIGINT))  # deferred: the block goes on
                raise ConfigError("workload.batch_size=0: must be in 1..1048576 sequences")
    finally:
        forget()
    with pytest.raises(ConfigError):
        with held():
            raise ConfigError("workload.batch_size=0: must be in 1..1048576 sequences")
