"""Runs and sweeps side by side never lose a run (issue 16): a fresh store made by several processes at
once, sweeps started in the same second, combinations that cannot run, a sweep stopped by SIGTERM, and
byte-identical outputs for the same config and seed wherever the job runs."""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import run_cli
from harness.cli.command import preflight, sweep_combinations
from harness.base.errors import EXIT_BAD_INPUT
from harness.sim.outcome import WALL_CLOCK_KEYS
from harness.sweep.callbacks import JOB_FAILED_FILE, _descendants

ENV = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}


def start(*args: str, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=cwd, env=env or ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def runs_in(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute("select run_uuid, status, name from runs").fetchall()


@pytest.mark.slow
def test_processes_started_together_on_a_new_store_all_log_their_runs(tmp_path):
    procs = [start(f"strategy={s}", "workload.steps=2", "output.timeline_steps=0", cwd=tmp_path) for s in ("eager", "async", "pipeline")]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-1500:] for _, err in outs]
    assert len(runs_in(tmp_path / "outputs" / "mlflow.db")) == 3
    assert (tmp_path / "outputs" / "mlflow.db.lock").exists()


@pytest.mark.slow
def test_sweeps_started_together_keep_their_own_folders_and_results(tmp_path):
    common = ["-m", "strategy=eager,async", "workload.steps=2", "output.timeline_steps=0", "output.print_summary=false"]
    procs = [start(*common, cwd=tmp_path), start(*common, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", cwd=tmp_path)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-1500:] for _, err in outs]
    sweeps = sorted(p for p in (tmp_path / "outputs" / "sweeps").glob("*/*") if p.is_dir())
    assert len(sweeps) == 2
    for sweep in sweeps:
        results = pd.read_csv(sweep / "results.csv")
        assert sorted(results["strategy"]) == ["async", "eager"]
        assert all(str(sweep.relative_to(tmp_path)) in d for d in results["run_dir"])
    runs = runs_in(tmp_path / "outputs" / "mlflow.db")
    assert len(runs) == 6 and sum(name.startswith("sweep ") for _, _, name in runs) == 2
    assert {status for _, status, _ in runs} == {"FINISHED"}


def test_every_combination_of_a_sweep_is_checked_before_the_first_job(tmp_path):
    jobs, total = sweep_combinations(["workload.steps=8,1", "workload.warmup_steps=0,3", "strategy=eager"])
    assert total == 4 and ["workload.steps=1", "workload.warmup_steps=3", "strategy=eager"] in jobs
    for combination, says in [
        (["workload.steps=8,1", "workload.warmup_steps=0,3"], "workload.warmup_steps=3: must be < workload.steps=1"),
        (["workload=qwen3_30b_decode,deepseek_v3", "hardware.device.hbm_gb=16,64"], "hbm"),
    ]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
            preflight(["-m", *combination, f"hydra.sweep.dir={tmp_path / 'sw'}"])
        assert exc.value.code == EXIT_BAD_INPUT
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and says in lines[0].lower(), lines
        assert not (tmp_path / "sw").exists()


@pytest.mark.slow
def test_a_job_that_fails_mid_sweep_leaves_the_others_results_and_a_failed_parent(tmp_path):
    """Over the combination bound (set to 1 here) only each value is checked up front: the bad combination
    fails its own job; the sweep writes results.csv for the rest, marks its parent FAILED, exits 2."""
    env = {**ENV, "HOSTBOUND_CHECK_COMBINATIONS": "1"}
    proc = start("-m", "workload.steps=8,1", "workload.warmup_steps=0,3", "output.timeline_steps=0", "output.print_summary=false",
                 "hydra.sweep.dir=sw", cwd=tmp_path, env=env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_BAD_INPUT, err[-2000:]
    assert "4 combinations" in err
    failed = list((tmp_path / "sw").glob(f"*/{JOB_FAILED_FILE}"))
    assert len(failed) == 1 and "workload.warmup_steps=3" in failed[0].read_text()
    assert len(pd.read_csv(tmp_path / "sw" / "results.csv")) == 3
    final = [line for line in err.splitlines() if line.startswith("hostbound: error: 1 of 4 jobs failed")]
    assert len(final) == 1
    # The comparison says it is not the whole sweep (it read as if it were), and which job failed and why.
    results_md = (tmp_path / "sw" / "results.md").read_text()
    assert f"Failed, not in this table (1 of 4 jobs): {failed[0].parent.name}: " in results_md and "workload.warmup_steps=3" in results_md
    runs = runs_in(tmp_path / "outputs" / "mlflow.db")
    parent = [status for _, status, name in runs if name.startswith("sweep ")]
    assert parent == ["FAILED"] and len(runs) == 4


@pytest.mark.slow
def test_sigterm_to_a_joblib_sweep_ends_its_workers_and_its_parent_run(tmp_path):
    proc = start("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "strategy=eager,async,pipeline,acl_graph",
                 "workload.steps=20000", "output.timeline_steps=0", "hydra.sweep.dir=sw", cwd=tmp_path)
    workers: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any((tmp_path / "sw").glob("*/.hydra")):
        time.sleep(0.5)  # a job has started: the workers exist
    workers = _descendants(proc.pid)
    assert workers, "the joblib sweep started no worker processes"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    time.sleep(2)
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]]
    assert alive == [], f"workers left running: {alive}"
    runs = runs_in(tmp_path / "outputs" / "mlflow.db")
    assert [status for _, status, name in runs if name.startswith("sweep ")] == ["KILLED"]


FILES = ("steps.parquet", "trace.json", "timeline.png")
PRESETS = "workload=llama2_7b_decode,qwen3_30b_decode,deepseek_v3,llama2_7b_prefill"


def _outputs(job: Path) -> dict:
    # overrides: the command line's record (a sweep's job lists them in another order), not a result
    summary = {k: v for k, v in json.loads((job / "summary.json").read_text()).items() if k not in WALL_CLOCK_KEYS | {"overrides"}}
    return {"summary": summary, **{name: (job / name).read_bytes() for name in FILES}}


@pytest.mark.slow
def test_same_config_and_seed_give_identical_files_alone_and_in_any_sweep(tmp_path):
    """Four presets with host jitter on: a plain run, a basic sweep, a sweep on the default launcher's forked
    workers and a joblib sweep write the same bytes (summary.json but for its wall-clock keys, sim_wall_s and compile_s, and the overrides' order)."""
    # output.timeline_steps=1: a sweep's jobs draw no timeline.png unless asked, and the picture is compared too.
    common = ["hardware.host.jitter_cv=0.2", "seed=7", "workload.steps=4", "tracking.enabled=false", "output.print_summary=false",
              "output.timeline_steps=1"]
    basic = run_cli("-m", PRESETS, *common, "hydra/launcher=basic", "hydra.sweep.dir=basic", cwd=tmp_path, timeout=400)
    warm = run_cli("-m", PRESETS, *common, "hydra.sweep.dir=warm", cwd=tmp_path, timeout=400)  # the default: forked workers
    joblib = run_cli("-m", PRESETS, *common, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=joblib", cwd=tmp_path, timeout=400)
    single = run_cli("workload=deepseek_v3", *common, "hydra.run.dir=single", cwd=tmp_path)
    procs = (basic, warm, joblib, single)
    assert {p.returncode for p in procs} == {0}, "".join(p.stderr for p in procs)[-3000:]
    jobs = sorted(p.name for p in (tmp_path / "basic").iterdir() if p.is_dir())
    assert len(jobs) == 4
    for other in ("warm", "joblib"):
        assert jobs == sorted(p.name for p in (tmp_path / other).iterdir() if p.is_dir())
        for job in jobs:
            assert _outputs(tmp_path / "basic" / job) == _outputs(tmp_path / other / job), (other, job)
    deepseek = next(job for job in jobs if "deepseek_v3_eager" in job)
    assert _outputs(tmp_path / "single") == _outputs(tmp_path / "basic" / deepseek)
