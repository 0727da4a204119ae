"""Sweeps on Ray (issue 15 item 3): `hydra/launcher=ray` on a Ray instance the sweep starts itself, and on
a running cluster (`ray start --head`, started here and stopped by its process group).

Each sweep logs to MLflow; every job must be in results.csv and in the store exactly once, as a FINISHED
child of the sweep's parent run. Needs the `cluster` extra (`pip install -e '.[test,cluster]'`, as .ci/run
does); without it the tests are skipped and say so.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import free_port, run_cli

pytestmark = pytest.mark.slow
pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="the `cluster` extra is not installed (pip install -e '.[test,cluster]')")

SWEEP = ["-m", "hydra/launcher=ray", "strategy=eager,async", "workload.batch_size=1,2", "workload.steps=3",
         "output.print_summary=false"]
JOBS = 4


@pytest.fixture
def ray_env(monkeypatch):
    """Ray's files in a short temporary folder (its socket paths must stay under ~107 characters, which
    pytest's folders exceed), and a token of this test's own: Ray 2.60's clusters require one, and the
    head binds every interface (it resolves 127.0.0.1 to the machine's address)."""
    temp = Path(tempfile.mkdtemp(prefix="hb-ray-"))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(16))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    yield temp
    shutil.rmtree(temp, ignore_errors=True)


def _ray_processes(temp: Path) -> list[str]:
    """Processes whose command line names the test's Ray folder (its head, raylet, workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(temp) in command:
                found.append(f"{entry.name}: {command[:120]}")
    return found


def _check_sweep(sweep_dir: Path, launch: Path) -> None:
    """results.csv and the MLflow store hold each job exactly once, FINISHED, under the sweep's parent."""
    import mlflow

    results = pd.read_csv(sweep_dir / "results.csv")
    assert len(results) == JOBS
    assert sorted(zip(results["strategy"], results["batch_size"])) == [("async", 1), ("async", 2), ("eager", 1), ("eager", 2)]
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert len(jobs) == JOBS and all((job / "summary.json").is_file() for job in jobs)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{launch / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("hostbound")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("kind") != "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(Path(r.data.tags["run_dir"]) for r in children) == jobs  # each job once, from its own folder
    assert {r.info.status for r in children} == {"FINISHED"}
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}


def test_a_sweep_on_a_ray_instance_it_starts(tmp_path, ray_env):
    proc = run_cli(*SWEEP, "hydra.sweep.dir=sw", f"+hydra.launcher.ray.init._temp_dir={ray_env}", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_sweep(tmp_path / "sw", tmp_path)
    deadline = time.monotonic() + 30  # the instance ends with the sweep's process (Ray's exit hook)
    while _ray_processes(ray_env) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ray_processes(ray_env)


@pytest.fixture
def ray_head(ray_env):
    """`ray start --head` in its own process group and folder; yields its address; the group is stopped
    after (SIGTERM, then SIGKILL for the parts that outlive it: Ray's GCS server does)."""
    port = free_port()
    ray = Path(sys.executable).with_name("ray")
    head_dir = ray_env / "head"  # where the head runs: its workers start there, not in the sweep's folder
    head_dir.mkdir()
    command = [str(ray), "start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
               f"--dashboard-port={free_port()}", f"--ray-client-server-port={free_port()}", f"--temp-dir={ray_env}"]
    head = subprocess.Popen(command, cwd=head_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline and head.poll() is None:
            status = subprocess.run([str(ray), "status", f"--address=127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
            if status.returncode == 0:
                break
            time.sleep(1)
        assert head.poll() is None and status is not None and status.returncode == 0, (status.stderr if status else "")[-2000:]
        yield f"127.0.0.1:{port}", head_dir
    finally:
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(head.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while _ray_processes(ray_env) and time.monotonic() < deadline:
                time.sleep(0.5)
            if not _ray_processes(ray_env):
                break
        head.wait(timeout=30)
    assert not _ray_processes(ray_env), "the head's processes outlived their process group"


def test_a_sweep_on_a_running_ray_cluster(tmp_path, ray_head):
    """The jobs run in the head's workers, whose folder is not the launch folder: a relative
    hydra.sweep.dir is anchored at the launch folder (the files used to land beside the head)."""
    address, head_dir = ray_head
    proc = run_cli(*SWEEP, "hydra.sweep.dir=sw", f"hydra.launcher.ray.init.address={address}", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Connected to Ray cluster" in proc.stderr  # joined the head, did not start an instance of its own
    _check_sweep(tmp_path / "sw", tmp_path)
    assert not (head_dir / "sw").exists()


def test_a_ray_sweep_without_the_extra_is_refused_in_one_line(tmp_path, monkeypatch):
    """Without hydra-ray-launcher (hidden here by a shadowing empty package), one line and nothing made."""
    shadow = tmp_path / "shadow" / "hydra_plugins" / "hydra_ray_launcher"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "shadow"))
    proc = run_cli(*SWEEP, "hydra.sweep.dir=sw", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("hostbound: error: hydra/launcher=ray: its plugin")
    assert "pip install -e '.[cluster]'" in proc.stderr
    assert not (tmp_path / "sw").exists() and not (tmp_path / "outputs").exists()


def test_an_advice_on_a_running_ray_cluster_is_the_advice_made_here(tmp_path, ray_head):
    """advise.ray_address: the candidates are simulated as Ray tasks on the cluster, and the answer is the one
    simulated in this process: the same candidates, figures and winner."""
    address, _ = ray_head
    question = ["hardware=h100", "workload=llama31_8b_decode", "advise.space={strategy:[eager,cuda_graph],workload.batch_size:[1,8,32]}",
                "advise.steps=[2,4]", "tracking.enabled=false"]
    here = run_cli(*question, "advise.workers=1", "advise.out=here", "advise.name=here", module="harness.advise", cwd=tmp_path, timeout=300)
    assert here.returncode == 0, here.stderr[-3000:]
    on_ray = run_cli(*question, f"advise.ray_address={address}", "advise.out=ray", "advise.name=ray", module="harness.advise", cwd=tmp_path,
                     timeout=300)
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    assert "simulating on 2 cores of Ray" in on_ray.stderr and "simulating on this process" in here.stderr
    assert (tmp_path / "ray" / "candidates.csv").read_text() == (tmp_path / "here" / "candidates.csv").read_text()


def test_an_advice_for_a_ray_cluster_that_is_not_there_is_one_line(tmp_path, ray_env):
    proc = run_cli("advise.space={strategy:[eager]}", f"advise.ray_address=127.0.0.1:{free_port()}", "advise.out=adv",
                   "tracking.enabled=false", module="harness.advise", cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("hostbound: error: advise.ray_address=127.0.0.1:"), proc.stderr[-2000:]
    assert not (tmp_path / "adv").exists()
