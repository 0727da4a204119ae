"""An advice's MLflow side: one parent run that holds the answer (its description is the "why" and the ranked
table; its artifacts advice.md, candidates.csv, pareto.png and the winner's preset; its params the question;
its headline metrics the winner's), and the leaders as its child runs, named by what they set, with the
same metric names as any run so that the runs table's headline columns show them side by side.

The candidates were simulated in memory (no run folder each): a child holds its figures and its
overrides, not files. Written in one store call: a stop waits for it, and a store that fails leaves no run
RUNNING (it is ended FAILED) and the advice's files as they are.
"""
from __future__ import annotations

import contextlib
import math
import time

from harness.advisor.answer import AdviceRecord, param_key
from harness.base.errors import TrackingError
from harness.base.stopping import store_call
from harness.config.schema import TrackingConfig
from harness.tracking.store import bound_requests, ensure_experiment, metric_name, mlflow_module, param_value, resolve_uri, short_reason


def log_advice(tracking: TrackingConfig, record: AdviceRecord) -> str:
    """Log the parent run and its children; returns the parent's id. A failing store is TrackingError."""
    bound_requests(tracking)
    try:
        mlflow_module()
        with store_call():
            return _log(tracking, record)
    except TrackingError:
        raise
    except Exception as exc:  # anything the store or the network raises: the advice's files are what matters
        reason = f"tracking.uri={resolve_uri(tracking)}: {short_reason(exc)}"
        raise TrackingError(f"tracking failed, the advice's files are kept ({reason})", reason) from exc


def _summary_metrics(summary: dict) -> dict[str, float]:
    """A summary's numbers under the names any run's have (headline/…, path_share/…, other/…)."""
    return {metric_name(k): v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _log(tracking: TrackingConfig, record: AdviceRecord) -> str:
    mlflow = mlflow_module()
    from mlflow.entities import Metric, Param

    experiment_id = ensure_experiment(tracking)
    client = mlflow.MlflowClient(tracking_uri=resolve_uri(tracking))
    now_ms = int(time.time() * 1000)
    tags = {**record.tags, "kind": "advice", "mlflow.note.content": record.description}
    # Started when the search started (its Duration is the search's, not the logging's).
    started_ms = now_ms - int(1000 * float(record.metrics.get("advice/seconds", 0.0)))
    parent = client.create_run(experiment_id, run_name=record.name, tags=tags, start_time=started_ms).info.run_id
    made = [parent]
    try:
        metrics = {**(_summary_metrics(record.winner_summary) if record.winner_summary else {}), **record.metrics}
        client.log_batch(parent, metrics=[Metric(k, v, now_ms, 0) for k, v in _finite(metrics).items()],
                         params=[Param(k, param_value(v)) for k, v in record.params.items()])
        for path in record.artifacts:
            client.log_artifact(parent, str(path))
        for leader in reversed(record.leaders):  # MLflow lists the newest first: the winner, made last, on top
            tags = {**leader.tags, "kind": "advice_candidate", "mlflow.parentRunId": parent, "overrides": " ".join(leader.overrides)}
            child = client.create_run(experiment_id, run_name=leader.name, tags=tags).info.run_id
            made.append(child)
            metrics = {**_summary_metrics(leader.summary), "advice/rank": leader.rank}
            params = {param_key(k): v for k, _, v in (o.partition("=") for o in leader.overrides)}  # MLflow refuses `+` in a key
            client.log_batch(child, metrics=[Metric(k, v, now_ms, 0) for k, v in _finite(metrics).items()],
                             params=[Param(k, param_value(v)) for k, v in params.items()])
            client.set_terminated(child, status="FINISHED")
    except BaseException:  # a failed store, or a stop: no run stays RUNNING
        for run_id in made:
            with contextlib.suppress(Exception):
                if client.get_run(run_id).info.status == "RUNNING":
                    client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(parent, status="FINISHED")
    return parent


def _finite(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
