"""A team's tracking server behind a login (issue 28 item 4; docs/team-server.md, "Who may log").

MLflow's basic-auth app on 127.0.0.1, its admin password given by environment (never on a command
line, which every user of the host reads in the process list): a client without credentials is
refused in one line (status 3, the run's files kept), a client with MLFLOW_TRACKING_USERNAME /
MLFLOW_TRACKING_PASSWORD logs a sweep, and the password is in no file a run writes nor in the store.
"""
from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port, wait_until_up

pytestmark = pytest.mark.slow
pytest.importorskip("flask_wtf", reason="MLflow's basic-auth app needs Flask-WTF: pip install -e '.[team]'")


@pytest.fixture
def auth_server(tmp_path):
    port, password = free_port(), secrets.token_urlsafe(16)
    config = tmp_path / "basic_auth.ini"
    config.write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{tmp_path / 'users.db'}\nadmin_username = admin\n"
                      "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_PASSWORD": password,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16), "MLFLOW_DISABLE_TELEMETRY": "true"}
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
         "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "w"), start_new_session=True,
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}/health", server)
        assert password not in " ".join(Path(f"/proc/{server.pid}/cmdline").read_text().split("\0"))
        yield f"http://127.0.0.1:{port}", password
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


def _harness(*args: str, cwd: Path, credentials: tuple[str, str] | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    if credentials:
        env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"] = credentials
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_client_without_credentials_is_refused_and_one_with_them_logs_a_sweep(auth_server, tmp_path):
    uri, password = auth_server
    small = ["workload.steps=3", "output.timeline_steps=0", "output.trace_steps=0", f"tracking.uri={uri}"]
    refused = _harness(*small, f"hydra.run.dir={tmp_path / 'anonymous'}", cwd=tmp_path, credentials=None)
    assert refused.returncode == 3, refused.stderr[-2000:]
    errors = [line for line in refused.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "401" in errors[0] or "credentials" in errors[0].lower() or "unauthorized" in errors[0].lower(), errors[0]
    assert (tmp_path / "anonymous" / "summary.json").is_file()

    # The login server hashes the password on every request; with the MLflow UI test's Chromium busy on the
    # other core a request took longer than tracking.timeout_s's 5 s once (clean-clone CI, 2026-12-03).
    # This test is about who may log, not how fast: the logged sweep waits up to 30 s a request.
    logged = _harness("-m", "strategy=eager,async", *small, "tracking.timeout_s=30", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                      cwd=tmp_path, credentials=("admin", password))
    assert logged.returncode == 0, logged.stderr[-3000:]
    token = base64.b64encode(f"admin:{password}".encode()).decode()
    request = urllib.request.Request(f"{uri}/api/2.0/mlflow/runs/search", data=json.dumps({"experiment_ids": ["1"]}).encode(),
                                     headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"})
    runs = json.loads(urllib.request.urlopen(request, timeout=30).read())["runs"]
    assert sorted(run["info"]["status"] for run in runs) == ["FINISHED"] * 3, runs  # the parent and both jobs
    for run in runs:
        assert password not in json.dumps(run["data"]), "the password reached the store"
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name not in ("server.log", "users.db", "basic_auth.ini"):
            assert password.encode() not in path.read_bytes(), f"the password is in {path}"
