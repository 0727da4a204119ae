"""What a single run's start-up leaves out, and what the parts it replaced must still do.

A default run spends most of its time starting libraries (docs/benchmarks.md). Three of them are kept off
its path: pandas (the steps table is written from its columns), SciPy (Numba's BLAS probe), and the wait
for timeline.png (its process is forked before the run's imports). These tests hold the behaviour; the
seconds live in benchmarks/bench_startup.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.results.outputs import read_steps, write_steps

# Run `python -m harness` and write the modules it imported, as it exits (exit handlers run: harness.cli.command.exit_now).
_RECORD_MODULES = """
import atexit, json, runpy, sys
record = sys.argv[1]
atexit.register(lambda: open(record, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["harness"] + sys.argv[2:]
runpy.run_module("harness", run_name="__main__")
"""


def imported_by_run(tmp_path: Path, *overrides: str) -> set[str]:
    record = tmp_path / "modules.json"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    done = subprocess.run(
        [sys.executable, "-c", _RECORD_MODULES, str(record), *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "timeline.png").stat().st_size > 0
    return set(json.loads(record.read_text()))


@pytest.mark.slow
def test_a_run_without_tracking_imports_neither_pandas_scipy_nor_matplotlib(tmp_path):
    modules = imported_by_run(tmp_path, "tracking.enabled=false")
    assert "numba" in modules and "harness.sim.kernel" in modules  # it did simulate
    assert "pandas" not in modules
    assert "scipy.linalg" not in modules
    assert "matplotlib" not in modules  # drawn by the other process


def test_steps_parquet_reads_back_as_the_columns_and_as_pandas_wrote_it(tmp_path):
    columns = {
        "step": np.arange(4),
        "measured": np.array([False, True, True, True]),
        "mode": np.array(["build", "replay", "replay", "eager"], dtype=object),
        "latency_ms": np.array([1.5, 0.25, np.inf, np.nan]),
        "launches": np.array([3, 1, 1, 9], dtype=np.int32),
        "strided": np.arange(8.0)[::2],  # a view with a stride: written as its values
    }
    write_steps(tmp_path / "steps.parquet", columns)
    back = read_steps(tmp_path / "steps.parquet")
    assert list(back) == list(columns)
    for name, values in columns.items():
        assert back[name].dtype == (object if name == "mode" else values.dtype), name
        np.testing.assert_array_equal(back[name], values)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "steps.parquet"), pd.DataFrame(columns))


def test_numba_target_loaded_without_scipy_leaves_scipy_importable(tmp_path):
    code = (
        "import sys; from harness.sim.kernel import load_numba_target; load_numba_target();"
        "assert 'scipy.linalg' not in sys.modules, 'probed';"
        "import scipy.linalg; print(scipy.linalg.norm([3.0, 4.0]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "5.0"


@pytest.mark.parametrize(
    "module, allowed",
    [
        ("harness.results.timeline", ["harness.sim.busy", "harness.sim.outcome", "harness.sim.task_graph"]),  # the drawing process
        ("harness.tracking.store", ["harness.sim.outcome", "harness.sim.task_graph"]),  # the MLflow logging process
    ],
)
def test_the_helper_processes_need_no_numba(module, allowed):
    """The processes that draw timeline.png and log to MLflow import their code beside the run: without
    Numba and the simulation's modules (0.2 s of a core the run shares with them; the logging process's
    imports are most of a tracked run's wall time)."""
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith(('numba', 'harness.sim.'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == repr(allowed)
