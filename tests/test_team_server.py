"""A team's tracking server (issue 15 item 4): MLflow on PostgreSQL with served artifacts, on loopback.

The test starts PostgreSQL (as an unprivileged user: it refuses to run as root) and `mlflow server` in a
temporary folder, runs a parallel sweep against it over HTTP, reads every run back through the REST API
and stops both. docs/team-server.md is the same set-up for a real team.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port, run_cli, wait_until_up

INITDB = shutil.which("initdb")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(INITDB is None, reason="PostgreSQL (initdb, pg_ctl) is not installed: .ci/run installs it where it can"),
]


def _as_postgres_user() -> list[str]:
    """PostgreSQL refuses to run as root: as root, run its commands as the `postgres` user."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no `postgres` user to run PostgreSQL as")
    return ["runuser", "-u", "postgres", "--"]


@pytest.fixture
def postgres():
    """A PostgreSQL 15 cluster on 127.0.0.1 in a fresh folder; yields its URI; stopped and removed after."""
    prefix = _as_postgres_user()
    root = Path(tempfile.mkdtemp(prefix="hostbound-pg-"))  # not under pytest's 0700 folders: the postgres user must enter it
    if prefix:
        shutil.chown(root, user="postgres")
    data, port = root / "data", free_port()
    subprocess.run([*prefix, INITDB, "-D", str(data), "--auth=trust", "-U", "postgres"], check=True, capture_output=True, timeout=120)
    pg_ctl = str(Path(INITDB).with_name("pg_ctl"))
    subprocess.run([*prefix, pg_ctl, "-D", str(data), "-o", f"-p {port} -k {root} -h 127.0.0.1", "-l", str(root / "log"), "-w", "start"],
                   check=True, capture_output=True, timeout=120)
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"  # SQLAlchemy 2.1 defaults to psycopg 3
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def mlflow_server(postgres, tmp_path):
    """`mlflow server` on the PostgreSQL store, serving artifacts from a folder; yields its URL."""
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", postgres, "--artifacts-destination",
         str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "2"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{url}/health", server)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def _rest(url: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{url}{path}", data=data, headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=30))


@pytest.mark.parametrize("launcher", [["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], []], ids=["joblib", "default"])
def test_a_parallel_sweep_logs_every_run_to_a_postgresql_backed_server(mlflow_server, tmp_path, launcher):
    # the default launcher's workers are forked from the sweep: each must use an HTTP session of its own
    proc = run_cli("-m", *launcher, "strategy=eager,async", "workload.batch_size=1,8",
                   f"tracking.uri={mlflow_server}", "tracking.artifacts=all", "workload.steps=3", "output.timeline_steps=0",
                   "output.print_summary=false", "hydra.sweep.dir=sw", cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]

    experiment = _rest(mlflow_server, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=hostbound")["experiment"]["experiment_id"]
    runs = _rest(mlflow_server, "/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment], "max_results": 100})["runs"]
    tags = [{t["key"]: t["value"] for t in run["data"].get("tags", [])} for run in runs]
    parents = [run for run, tag in zip(runs, tags) if tag.get("kind") == "sweep"]
    children = [run for run, tag in zip(runs, tags) if tag.get("kind") != "sweep"]
    assert len(parents) == 1 and len(children) == 4
    parent_id = parents[0]["info"]["run_id"]
    assert all(run["info"]["status"] == "FINISHED" for run in runs)
    combos = set()
    for run in children:
        data = run["data"]
        tag = {t["key"]: t["value"] for t in data["tags"]}
        params = {p["key"]: p["value"] for p in data["params"]}
        metrics = {m["key"]: m["value"] for m in data["metrics"]}
        assert tag["mlflow.parentRunId"] == parent_id
        assert metrics["headline/throughput_tok_s"] > 0 and 0 <= metrics["headline/bubble_ratio"] <= 1
        combos.add((params["strategy"], params["workload.batch_size"]))
        files = {f["path"] for f in _rest(mlflow_server, f"/api/2.0/mlflow/artifacts/list?run_id={run['info']['run_id']}").get("files", [])}
        assert {"summary.json", "steps.parquet", "trace.json"} <= files  # served by the server, stored in its folder
    assert combos == {("eager", "1"), ("eager", "8"), ("async", "1"), ("async", "8")}
    parent_files = {f["path"] for f in _rest(mlflow_server, f"/api/2.0/mlflow/artifacts/list?run_id={parent_id}").get("files", [])}
    assert {"results.csv", "results.md", "speedup.png", "bubble.png"} <= parent_files
    assert len(list((tmp_path / "artifacts").rglob("summary.json"))) == 4
