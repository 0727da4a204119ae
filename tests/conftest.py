"""Shared helpers: compose a run from conf/ exactly as `python -m harness` would."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from harness.config import CONF_DIR, REPO_ROOT, RunConfig, register_configs, to_run_config  # noqa: E402

register_configs()


def compose_run(*overrides: str) -> RunConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return to_run_config(cfg)


def run_cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT
