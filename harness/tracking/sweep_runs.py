"""A sweep's MLflow side: its parent run (made at the start, given the results at the end, ended KILLED or
FAILED when the sweep is stopped or fails) and a forked worker's fresh database connections.

harness.sweep.callbacks decides when; these calls are the only ones a sweep makes to MLflow.
"""
from __future__ import annotations

import sys
from pathlib import Path

from harness.config.schema import TrackingConfig
from harness.results.outputs import WHERE_THINGS_GO
from harness.tracking.store import ensure_experiment, mlflow_module, param_value, resolve_uri


def _client(tracking: TrackingConfig):
    mlflow = mlflow_module()

    return mlflow.MlflowClient(tracking_uri=resolve_uri(tracking))


def start_parent_run(tracking: TrackingConfig, name: str, sweep_dir: Path, overrides: str) -> str:
    """Make the sweep's parent run (RUNNING) in the experiment; returns its id."""
    from mlflow.entities import Param

    experiment_id = ensure_experiment(tracking)
    client = _client(tracking)
    parent = client.create_run(experiment_id, run_name=name, tags={"sweep_dir": str(sweep_dir), "overrides": overrides, "kind": "sweep"})
    # Its params: what the command line set, swept values as written (strategy=eager,acl_graph).
    chosen = [override.lstrip("+~").partition("=") for override in overrides.split()]
    params = {key: value for key, _, value in chosen if key and not key.startswith(WHERE_THINGS_GO)}
    try:
        client.log_batch(parent.info.run_id, params=[Param(key, param_value(value)) for key, value in params.items()])
    except BaseException:  # the sweep never learns this run's id: it must not stay RUNNING
        client.set_terminated(parent.info.run_id, status="FAILED")
        raise
    return parent.info.run_id


def reopen_parent_run(tracking: TrackingConfig, run_id: str, sweep_dir: Path) -> str | None:
    """The parent run a sweep made before (`resume=true` in its folder), RUNNING again, so that its jobs,
    those that finished before and those that run now, stay the children of one run; None when the
    store does not hold it as this folder's sweep (then a new one is made)."""
    client = _client(tracking)
    try:
        run = client.get_run(run_id)
    except Exception:  # deleted, or another store
        return None
    if run.info.experiment_id != ensure_experiment(tracking) or run.data.tags.get("sweep_dir") != str(sweep_dir):
        return None
    client.update_run(run_id, status="RUNNING")
    return run_id


def finish_parent_run(tracking: TrackingConfig, run_id: str, artifacts: list[Path], jobs: int, failed: bool, description: str = "") -> None:
    """Describe the run (Markdown), attach the sweep's results files, count its finished jobs, end it FINISHED
    (FAILED if a job failed)."""
    client = _client(tracking)
    if description:
        client.set_tag(run_id, "mlflow.note.content", description)  # what the UI shows as the run's description
    for path in artifacts:
        client.log_artifact(run_id, str(path))
    client.log_metric(run_id, "jobs", float(jobs))
    client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")


def end_parent_run(tracking: TrackingConfig, run_id: str, status: str, only_if_running: bool = False) -> None:
    """End the parent run with `status` (only if still RUNNING, when asked), and its jobs' runs still RUNNING
    as KILLED: by then every process of the sweep has ended, so a job's open run belonged to a worker
    killed mid-job (SIGKILL, out of memory), which could not end it itself."""
    client = _client(tracking)
    parent = client.get_run(run_id)
    if not only_if_running or parent.info.status == "RUNNING":
        client.set_terminated(run_id, status=status)
    for job in client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}' and attributes.status = 'RUNNING'", max_results=10000
    ):
        client.set_terminated(job.info.run_id, status="KILLED")


def forget_inherited_connections() -> None:
    """A forked process must not use its parent's database connections (SQLAlchemy's `dispose(close=False)`
    recipe): MLflow keeps one engine per database URI for the process. (Its HTTP sessions are per process
    id already.)"""
    if "mlflow.store.tracking.sqlalchemy_store" not in sys.modules:  # never imported: nothing inherited
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for engine in list(SqlAlchemyStore._engine_map.values()):
        engine.dispose(close=False)
