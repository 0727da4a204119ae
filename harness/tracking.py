"""MLflow tracking: one MLflow run per harness run, as an index over the run directory's files.

Default store: an sqlite database outputs/mlflow.db under the launch directory, artifacts in
outputs/mlartifacts — no server needed; `mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db`
opens it. Params are the flattened resolved config, metrics the summary's numbers, artifacts the
run directory (summary.json, steps.parquet, trace.json, .hydra/), tags the preset names.
"""
from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import pandas as pd

from harness.config import TrackingConfig

log = logging.getLogger(__name__)

# MLflow would otherwise phone home; the harness runs without network.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

MAX_PARAM_CHARS = 6000  # MLflow 3 rejects longer param values


def launch_dir() -> Path:
    """Where the user started the command (Hydra may have changed into the run directory)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.cwd)
    except Exception:  # no Hydra context (tests, library use)
        pass
    return Path.cwd()


def default_uri() -> str:
    return f"sqlite:///{launch_dir() / 'outputs' / 'mlflow.db'}"


def resolve_uri(tracking: TrackingConfig) -> str:
    return tracking.uri or default_uri()


def ensure_experiment(tracking: TrackingConfig) -> str:
    """Create the store and the experiment if needed (do this once before parallel jobs start)."""
    import mlflow

    uri = resolve_uri(tracking)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if experiment is not None:
        return experiment.experiment_id
    artifact_location = None
    if tracking.uri is None:
        artifact_location = (launch_dir() / "outputs" / "mlartifacts").as_uri()
    return mlflow.create_experiment(tracking.experiment, artifact_location=artifact_location)


def log_run(
    tracking: TrackingConfig, run_dir: Path, summary: dict, steps: pd.DataFrame, params: dict, names: dict, overrides: str = ""
) -> str:
    """Log one run; returns its MLflow run id."""
    import mlflow
    from mlflow.entities import Metric

    experiment_id = ensure_experiment(tracking)
    metrics = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
    tags = {**names, "bound": summary["bound"], "run_dir": str(run_dir)}
    if overrides:  # the same record of what was swept that a run folder keeps (.hydra/overrides.yaml)
        tags["overrides"] = overrides
    from harness.sweep import parent_run_id

    parent = parent_run_id()
    if parent:
        tags["mlflow.parentRunId"] = parent  # shows the job nested under its sweep in the UI
    run_name = "·".join(names[k] for k in ("workload", "strategy", "hardware")) + (f"·{names['engine']}" if names.get("engine", "none") != "none" else "")
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags) as active:
        mlflow.log_params({k: _param_value(v) for k, v in params.items()})
        mlflow.log_metrics(metrics)
        client = mlflow.MlflowClient()
        now_ms = int(time.time() * 1000)
        series = [
            Metric("step_ms", float(latency), now_ms, int(step))
            for step, latency in zip(steps["step"], steps["latency_ms"])
        ]
        client.log_batch(active.info.run_id, metrics=series)
        mlflow.log_artifacts(str(run_dir))
        log.info("logged MLflow run %s to %s", active.info.run_id, resolve_uri(tracking))
        return active.info.run_id


def _param_value(value: object) -> str:
    text = str(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."
