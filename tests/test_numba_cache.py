"""The sweep warm-up compiles every kernel into the Numba cache, so parallel jobs only load it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.config.paths import REPO_ROOT

JOBS = r"""
import json, sys
from numba.core.registry import CPUDispatcher
import harness.sim.kernel, harness.sim.lowering, harness.sim.metrics
sys.path.insert(0, "tests")
from conftest import compose_run
from harness.sim.simulate import simulate_run
for overrides in (["strategy=pipeline"], ["workload=qwen3_30b_decode", "strategy=acl_graph"],
                  ["strategy=async", "workload.serving.enabled=true", "workload.steps=6"], ["strategy=mindspore"],
                  ["strategy=tiling_cache", "strategy.shape_buckets=true"]):
    simulate_run(compose_run(*overrides, "workload.steps=3" if "workload.steps=6" not in overrides else "seed=1"), chunk_tasks=2000)
kernels = {f"{m.__name__}.{name}": f for m in (harness.sim.kernel, harness.sim.lowering, harness.sim.metrics)
           for name, f in vars(m).items() if isinstance(f, CPUDispatcher)}
print(json.dumps({name: [sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values())] for name, f in kernels.items()}))
"""


def test_warm_up_leaves_nothing_for_jobs_to_compile(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    warm = subprocess.run([sys.executable, "-c", "from harness.sweep.callbacks import warm_numba_cache; warm_numba_cache()"],
                          env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr[-2000:]
    # A job: several strategies, serving, chunked runs; every kernel it calls must come from the cache.
    job = subprocess.run([sys.executable, "-c", JOBS], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    stats = json.loads(job.stdout.strip().splitlines()[-1])
    assert len(stats) >= 10
    compiled = {name: misses for name, (hits, misses) in stats.items() if misses}
    assert compiled == {}
    loaded = [name for name, (hits, _) in stats.items() if hits]
    assert "harness.sim.kernel._simulate" in loaded and "harness.sim.lowering._fill_records" in loaded


def test_the_first_run_says_it_compiles_and_later_runs_do_not(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "MLFLOW_DISABLE_TELEMETRY": "true"}
    args = [sys.executable, "-m", "harness", "tracking.enabled=false", "output.timeline_steps=0"]

    def run():
        done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    first, second = run(), run()
    # The summary alone on stdout, the logs on stderr.
    for done in (first, second):
        assert done.stdout.startswith("hostbound: llama2_7b_decode on atlas_a2 with eager")
        assert "[harness" not in done.stdout and "simulated 217088 tasks" in done.stderr
    tasks_line = next(line for line in first.stdout.splitlines() if "tasks in" in line)
    compiled_s = float(tasks_line.split("of which ")[1].split(" s compiling kernels (first run only)")[0])
    total_s = float(tasks_line.split("tasks in ")[1].split(" s")[0])
    assert 0 < compiled_s < total_s
    assert "compiling the simulation kernels" in first.stderr
    assert "compiling" not in second.stdout + second.stderr
