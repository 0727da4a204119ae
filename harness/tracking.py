"""MLflow tracking: one MLflow run per harness run, as an index over the run directory's files.

Default store: an sqlite database outputs/mlflow.db under the launch directory, artifacts in
outputs/mlartifacts — no server needed; `mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db`
opens it. Params are the flattened resolved config, metrics the summary's numbers and the per-step
series, tags the preset names and the overrides, artifacts the run directory's files (by default all
but trace.json, which stays in the folder the run_dir tag names: `tracking.artifacts`).
"""
from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import pandas as pd

from harness.config import ArtifactPolicy, TrackingConfig
from harness.outputs import TRACE_FILE, run_notes

log = logging.getLogger(__name__)

# MLflow would otherwise phone home; the harness runs without network.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

MAX_PARAM_CHARS = 6000  # MLflow 3 rejects longer param values
# A sweep's parent run id, in the sweep directory (harness.sweep writes it before the jobs start): a
# job's run is logged as its child.
PARENT_FILE = "mlflow_parent_run_id"


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


# MLflow 3's UI opens an experiment without this tag in its GenAI view (traces, an assistant); with it,
# in the runs table and the compare view that a sweep needs.
EXPERIMENT_KIND_TAG = ("mlflow.experimentKind", "custom_model_development")
# Group choices are in a run's name already; the other keys only say where files and runs go.
_GROUP_CHOICES = {"hardware", "workload", "strategy", "engine"}
_WHERE_THINGS_GO = ("tracking.", "output.", "hydra")


def ensure_experiment(tracking: TrackingConfig) -> str:
    """Create the store and the experiment if needed (do this once before parallel jobs start)."""
    import mlflow

    uri = resolve_uri(tracking)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if experiment is not None:
        if experiment.tags.get(EXPERIMENT_KIND_TAG[0]) is None:  # made by an older harness
            mlflow.MlflowClient().set_experiment_tag(experiment.experiment_id, *EXPERIMENT_KIND_TAG)
        return experiment.experiment_id
    artifact_location = None
    if tracking.uri is None:
        artifact_location = (launch_dir() / "outputs" / "mlartifacts").as_uri()
    return mlflow.create_experiment(tracking.experiment, artifact_location=artifact_location, tags=dict([EXPERIMENT_KIND_TAG]))


def run_name(names: dict, overrides: str = "") -> str:
    """`workload·strategy·hardware[·engine]` and the values set on top, e.g. `llama2_7b_decode·pipeline·
    atlas_a2·batch_size=8`: the runs of a sweep tell apart by name in the UI's table."""
    base = [names[k] for k in ("workload", "strategy", "hardware")]
    if names.get("engine", "none") != "none":
        base.append(names["engine"])
    values = []
    for override in overrides.split():
        key, _, value = override.lstrip("+~").partition("=")
        if key in _GROUP_CHOICES or key.startswith(_WHERE_THINGS_GO):
            continue
        values.append(f"{key.rsplit('.', 1)[-1]}={value}")
    return "·".join(base + values)[:250]


def artifact_files(run_dir: Path, policy: ArtifactPolicy) -> list[Path]:
    """The run directory's top-level entries MLflow stores under `policy`."""
    if policy == ArtifactPolicy.none:
        return []
    entries = sorted(run_dir.iterdir())
    if policy == ArtifactPolicy.all:
        return entries
    return [entry for entry in entries if entry.name != TRACE_FILE]


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
    notes = run_notes(summary)
    if notes:  # the summary's words (captures, fallbacks, warnings) are not metrics
        tags["notes"] = notes
    logged = artifact_files(run_dir, tracking.artifacts)
    left = sorted({entry.name for entry in run_dir.iterdir()} - {entry.name for entry in logged})
    if left:
        tags["files_only_in_run_dir"] = " ".join(left)
    parent = parent_run_id()
    if parent:
        tags["mlflow.parentRunId"] = parent  # shows the job nested under its sweep in the UI
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name(names, overrides), tags=tags) as active:
        mlflow.log_params({k: _param_value(v) for k, v in params.items()})
        mlflow.log_metrics(metrics)
        client = mlflow.MlflowClient()
        now_ms = int(time.time() * 1000)
        # Measured steps and the rest (warm-up, graph builds) apart: a 3 s build step at step 0 would
        # squash the measured series into a flat line.
        series = [
            Metric("step_ms" if measured else "warmup_step_ms", float(latency), now_ms, int(step))
            for step, latency, measured in zip(steps["step"], steps["latency_ms"], steps["measured"])
        ]
        client.log_batch(active.info.run_id, metrics=series)
        for entry in logged:
            if entry.is_dir():
                mlflow.log_artifacts(str(entry), artifact_path=entry.name)
            else:
                mlflow.log_artifact(str(entry))
        log.info("logged MLflow run %s to %s", active.info.run_id, resolve_uri(tracking))
        return active.info.run_id


def _param_value(value: object) -> str:
    text = str(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."


def parent_run_id() -> str | None:
    """The sweep's parent run, when this process runs a job of a multirun with tracking."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
            return None
        path = Path(HydraConfig.get().sweep.dir) / PARENT_FILE
        return path.read_text().strip() if path.exists() else None
    except Exception:  # no Hydra context
        return None
