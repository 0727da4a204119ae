"""The installed package is complete: a wheel carries every subpackage, conf/ and workloads/, and runs
from a folder that is not the source checkout (a missing subpackage or YAML file only shows there)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from harness.config.paths import REPO_ROOT


def _declared_packages() -> set[str]:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return set(pyproject["tool"]["setuptools"]["packages"])


def test_every_code_and_config_folder_is_declared():
    declared = _declared_packages()
    code = {
        ".".join(p.parent.relative_to(REPO_ROOT).parts) for p in (REPO_ROOT / "harness").rglob("__init__.py")
    }
    conf = {"harness.conf"} | {
        f"harness.conf.{d.name}" for d in (REPO_ROOT / "conf").iterdir() if d.is_dir() and any(d.glob("*.yaml"))
    }
    plugins = {".".join(p.parent.relative_to(REPO_ROOT).parts) for p in (REPO_ROOT / "hydra_plugins").rglob("__init__.py")}
    missing = (code | conf | plugins | {"harness.workloads"}) - declared
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {sorted(missing)}"


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    wheel_dir, site, elsewhere = tmp_path / "wheel", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Built from a copy of what a clean clone holds, so the checkout gets no build/ or egg-info.
    source = tmp_path / "source"
    for name in ("harness", "conf", "workloads", "hydra_plugins"):
        shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    # --no-build-isolation: build with the installed setuptools, no network.
    built = subprocess.run(
        [*pip, "wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(wheel_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = wheel_dir.glob("hostbound-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for yaml in (REPO_ROOT / "conf").rglob("*.yaml"):
        assert f"harness/conf/{yaml.relative_to(REPO_ROOT / 'conf').as_posix()}" in names
    for yaml in (REPO_ROOT / "workloads").glob("*.yaml"):
        assert f"harness/workloads/{yaml.name}" in names

    installed = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(site), "MLFLOW_DISABLE_TELEMETRY": "true"}
    ran = subprocess.run(
        [sys.executable, "-m", "harness", "workload=qwen25_7b_decode", "strategy=acl_graph"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    # A sweep: the default launcher is found in the wheel's hydra_plugins and runs the jobs in its workers.
    swept = subprocess.run(
        [sys.executable, "-m", "harness", "-m", "strategy=eager,async", "workload.steps=2", "tracking.enabled=false",
         "output.print_summary=false", "hydra.sweep.dir=sweep"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600,
    )
    assert swept.returncode == 0 and "worker process" in swept.stderr, swept.stderr[-2000:]
    assert len(pd.read_csv(elsewhere / "sweep" / "results.csv")) == 2
    # Every module must load from the wheel: the editable install of this checkout would otherwise
    # quietly serve a subpackage the wheel lacks.
    where = subprocess.run(
        [sys.executable, "-c",
         "import harness.config.paths as c, harness.profile, hydra_plugins.hostbound_launcher as h, importlib;"
         "print(c.CONF_DIR); print(c.WORKLOADS_DIR); print(h.__file__);"
         # a module of every layer, the entry points and the tracking command's package
         "[print(importlib.import_module(m).__file__) for m in ('harness.base.files', 'harness.config.compose', 'harness.model.workload',"
         " 'harness.sim.simulate', 'harness.importers.kineto', 'harness.results.outputs', 'harness.tracking.store',"
         " 'harness.tracking.__main__', 'harness.sweep.launcher', 'harness.cli.job', 'harness.report', 'harness.repro')]"],
        cwd=elsewhere, env=env, capture_output=True, text=True,
    )
    assert where.returncode == 0, where.stderr[-2000:]
    for path in where.stdout.split():
        assert Path(path).is_relative_to(site), f"{path} does not come from the installed wheel"
    # The profile importer is a subpackage of its own: its CLI must load from the wheel too.
    profile_help = subprocess.run(
        [sys.executable, "-m", "harness.profile", "--help"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert profile_help.returncode == 0 and "--what-if" in profile_help.stdout, profile_help.stderr[-2000:]
    # The `hostbound` console script: a user mistake is one line and exit status 2.
    refused = subprocess.run(
        [str(site / "bin" / "hostbound"), "workload.batch_size=0"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2 and refused.stderr.strip() == "hostbound: error: workload.batch_size=0: must be in 1..1048576 sequences"
    (summary,) = (elsewhere / "outputs" / "runs").rglob("summary.json")
    assert "qwen25_7b_decode" in str(summary.parent.name)
