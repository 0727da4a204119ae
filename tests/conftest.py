"""Shared helpers: compose a run from conf/ exactly as `python -m harness` would."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from harness.config.compose import register_configs  # noqa: E402
from harness.config.paths import REPO_ROOT  # noqa: E402
from harness.config.schema import RunConfig  # noqa: E402
from harness.config.compose import compose_run as compose_overrides  # noqa: E402

register_configs()


def compose_run(*overrides: str) -> RunConfig:
    return compose_overrides(overrides)


def free_port() -> int:
    """A TCP port nothing listens on, on 127.0.0.1 (for servers a test starts, or a store that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, seconds: float = 90) -> None:
    """Until `url` answers (a server a test started, e.g. MLflow's /health); fails if `process` ends first
    or the time is up."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise AssertionError(f"{url} did not come up (exit {process.poll()})")
            time.sleep(0.5)


def run_cli(*args: str, cwd: Path, timeout: float = 120, module: str = "harness") -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def comparable_results(results: pd.DataFrame) -> pd.DataFrame:
    """A sweep's results.csv without what differs between runs of the same configurations (wall-clock
    keys, folders, the overrides' order), in a fixed row order: two sweeps of one grid compare equal."""
    from harness.sim.outcome import WALL_CLOCK_KEYS

    dropped = [c for c in results.columns if c in WALL_CLOCK_KEYS or c in ("run_dir", "overrides")]
    kept = results.drop(columns=dropped)
    return kept.sort_values(list(kept.columns)).reset_index(drop=True)


def read_local_artifact(client, run_id: str, path: str) -> str:
    """The text of a run's artifact in a local artifact store, read from its file. MLflow's own
    download_artifacts would leave its artifact thread pool and tqdm's monitor thread running in the test
    worker, and a later test that forks (the timeline drawer, the tracking process) then rightly refuses
    to fork and skips."""
    from mlflow.utils.file_utils import local_file_uri_to_path

    return (Path(local_file_uri_to_path(client.get_run(run_id).info.artifact_uri)) / path).read_text()


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


# The suite leaves the checkout's outputs/ as it found it: a test that runs or checks a command does so
# from a scratch folder (preflight probes the run folder's parents, outputs/runs/<date>, under the launch
# folder). Checked once, in the process that ran the session (xdist workers skip it).
_CHECKOUT_OUTPUTS = REPO_ROOT / "outputs"


def _outputs_entries() -> set[str]:
    return {str(p.relative_to(_CHECKOUT_OUTPUTS)) for p in _CHECKOUT_OUTPUTS.rglob("*")} if _CHECKOUT_OUTPUTS.is_dir() else set()


def pytest_sessionstart(session) -> None:
    session.config._outputs_before = _outputs_entries()


def pytest_sessionfinish(session, exitstatus) -> None:
    if hasattr(session.config, "workerinput") or not hasattr(session.config, "_outputs_before"):
        return
    left = sorted(_outputs_entries() - session.config._outputs_before)
    if left:
        print(f"\nthe tests left {len(left)} entries in the checkout's outputs/: {', '.join(left[:5])}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_STORE_BOUNDS = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")


@pytest.fixture(autouse=True)
def _no_store_bounds_left_over():
    """Logging in this process sets MLflow's request bounds in its environment (tracking.store.bound_requests,
    where MLflow reads them), and a user's own values win there: a test that logged in-process left
    MLFLOW_HTTP_REQUEST_TIMEOUT=5 to every later command the worker started, whatever tracking.timeout_s those
    asked for (test_team_auth's login server then missed 5 s under load). Each test ends with the values it found."""
    before = {key: os.environ.get(key) for key in _STORE_BOUNDS}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def _no_stop_left_over():
    """A test that raises a stop in this process (harness.base.stopping) leaves it requested, and every
    later error line of the worker would turn into that stop: each test ends with none."""
    yield
    from harness.base import stopping

    stopping.forget()
