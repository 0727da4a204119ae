"""The task function: a validated RunConfig → simulation → metrics → files → MLflow.

Everything here is callable without Hydra (tests do), given a RunConfig and a run directory.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from harness.config import RunConfig
from harness.core import SimulationResult, simulate
from harness.lowering import lower
from harness.metrics import compute_metrics
from harness.outputs import write_outputs
from harness.serving import plan_serving, serving_summary
from harness.policies import prepare
from harness.progress import Progress
from harness.workload import Workload, check_memory

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    summary: dict
    steps: pd.DataFrame
    result: SimulationResult
    workload: Workload


def simulate_run(run: RunConfig) -> RunResult:
    """Build the workload, lower it under the strategy, run the engine, compute the metrics."""
    began = time.perf_counter()
    progress = Progress("hostbound")
    progress.update("planning serving batches" if run.workload.serving.enabled else "building the workload", force=True)
    serving = plan_serving(run, progress) if run.workload.serving.enabled else None
    batch = serving.batch if serving else np.full(run.workload.steps, run.workload.batch_size, dtype=np.int64)
    workload, plan = prepare(run, batch, serving.kv_len if serving else None)
    check_memory(workload, run.hardware.device.hbm_gb)
    progress.update(f"lowering {workload.steps} steps × {workload.n_ops} ops", force=True)
    graph = lower(workload, run.hardware, run.strategy, run.seed, plan, step_release_us=serving.release_us if serving else None)
    progress.update(f"simulating {graph.n_tasks:,} tasks", force=True)
    result = simulate(graph)
    progress.update("computing metrics", force=True)
    summary, steps = compute_metrics(result, workload, plan)
    progress.done()
    summary.update(plan.info)
    if workload.memory.weights_gb > 0:  # cards know their memory; explicit op lists and traces do not
        m = workload.memory
        # Resident weights, KV cache and graphs, plus the activations live at the worst moment of the run.
        summary["peak_mem_gb"] = m.weights_gb + m.kv_cache_gb + m.graphs_gb + summary["peak_activation_gb"]
    summary["devices"] = run.workload.devices
    if serving is not None:
        summary.update(serving_summary(serving))
    summary["sim_wall_s"] = time.perf_counter() - began
    log.info("simulated %d tasks in %.3f s", graph.n_tasks, summary["sim_wall_s"])
    return RunResult(summary=summary, steps=steps, result=result, workload=workload)


def execute(run: RunConfig, run_dir: Path, params: dict) -> RunResult:
    """Simulate, write the run directory, log to MLflow when enabled. `params` = flattened resolved config."""
    outcome = simulate_run(run)
    names = {"hardware": run.hardware.name, "workload": run.workload.name, "strategy": run.strategy.name}
    write_outputs(run_dir, outcome, names, trace_steps=run.output.trace_steps, timeline_steps=run.output.timeline_steps)
    if run.tracking.enabled:
        from harness.tracking import log_run  # mlflow takes ~1 s to import: only when tracking

        log_run(run.tracking, run_dir, outcome.summary, outcome.steps, params, names)
    return outcome
