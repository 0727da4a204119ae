"""Sweeps: a Hydra callback that gives every multirun one MLflow parent run and its jobs child runs.

Before any job starts (in the launching process) it creates the tracking store and the experiment,
so parallel jobs never race a first-time database migration, warms the Numba cache, and starts the
parent run (tags: sweep directory, overrides), whose id it leaves in the sweep directory for the
jobs. Each job's run is tagged as its child (`mlflow.parentRunId`). When the sweep ends, the parent
gets the combined results table (CSV and Markdown) of all jobs as artifacts.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness.files import atomic_write, write_text
from harness.progress import Progress
from harness.tracking import PARENT_FILE

log = logging.getLogger(__name__)

RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"


def _tracking(config: DictConfig):
    from harness.config import TrackingConfig

    plain = OmegaConf.to_container(config.get("tracking", {}), resolve=True) or {}
    return TrackingConfig(**plain)


def warm_numba_cache() -> None:
    """Compile (or load) every kernel once, so parallel jobs only read the cache: a two-step run of
    the built-in defaults goes through lowering, the engine and the metrics."""
    from harness.config import RunConfig
    from harness.core import lru_hits
    from harness.run import simulate_run

    run = RunConfig()
    run.workload.steps = 2
    outcome = simulate_run(run)
    outcome.result.critical_path()
    lru_hits(np.arange(3), 2)


class SweepTracking(Callback):
    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        # Runs in whichever process ran the job (the launcher's for the basic launcher, a worker's for joblib).
        overrides = " ".join(getattr(job_return, "overrides", None) or [])
        Progress("hostbound sweep").update(f"done: {overrides}", force=True)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        warm_numba_cache()
        tracking = _tracking(config)
        if not tracking.enabled:
            return
        import mlflow

        from harness.tracking import FAILED_ENV, bound_requests, ensure_experiment, resolve_uri, short_reason

        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        bound_requests(tracking)
        try:
            experiment_id = ensure_experiment(tracking)
            overrides = " ".join(config.hydra.overrides.task)
            client = mlflow.MlflowClient(tracking_uri=resolve_uri(tracking))
            parent = client.create_run(
                experiment_id,
                run_name=sweep_name(list(config.hydra.overrides.task), sweep_dir.name),
                tags={"sweep_dir": str(sweep_dir), "overrides": overrides, "kind": "sweep"},
            )
        except Exception as exc:  # the store is down: the jobs run (their files are what matters) without it
            reason = f"tracking.uri={resolve_uri(tracking)}: {short_reason(exc)}"
            os.environ[FAILED_ENV] = reason  # this process's jobs and the workers it starts skip the store
            log.warning("tracking failed, the sweep runs without it (%s)", reason)
            return
        write_text(sweep_dir / PARENT_FILE, parent.info.run_id)
        log.info("sweep parent run %s in %s", parent.info.run_id, resolve_uri(tracking))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        Progress("hostbound sweep").done()
        from harness.report import comparison, load_run_dirs, to_markdown

        table = load_run_dirs([sweep_dir])
        if not table.empty:
            atomic_write(sweep_dir / RESULTS_CSV, lambda tmp: table.to_csv(tmp, index=False))  # every summary key of every job
            write_text(sweep_dir / RESULTS_MD, to_markdown(comparison(table)) + "\n")
        parent_file = sweep_dir / PARENT_FILE
        tracking = _tracking(config)
        if not tracking.enabled:
            return
        from harness.tracking import EXIT_TRACKING_FAILED, FAILED_FILE, later_command, resolve_uri

        if parent_file.exists():
            import mlflow

            client = mlflow.MlflowClient(tracking_uri=resolve_uri(tracking))
            run_id = parent_file.read_text().strip()
            try:
                for name in (RESULTS_CSV, RESULTS_MD):
                    if (sweep_dir / name).exists():
                        client.log_artifact(run_id, str(sweep_dir / name))
                client.log_metric(run_id, "jobs", float(len(table)))
                client.set_terminated(run_id)
            except Exception as exc:  # the store went away during the sweep; the jobs' markers say which
                log.warning("tracking: could not finish the sweep's parent run %s: %s", run_id, exc)
        missed = sorted(p.parent for p in sweep_dir.glob(f"*/{FAILED_FILE}"))
        if missed:
            print(
                f"hostbound: error: tracking failed for {len(missed)} job(s) of the sweep, their files are kept"
                f" ({(missed[0] / FAILED_FILE).read_text().splitlines()[0]}); log them later: {later_command(missed, tracking)}",
                file=sys.stderr,
            )
            raise SystemExit(EXIT_TRACKING_FAILED)


def sweep_name(overrides: list[str], folder: str) -> str:
    """A parent run's name: what the sweep varies, e.g. `sweep strategy=eager,async × batch_size=1,8
    · 03-10-00_1234` (the folder tells apart two sweeps of the same values)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    swept = [
        f"{o.get_key_element().lstrip('+~').rsplit('.', 1)[-1]}={o.input_line.split('=', 1)[1]}"
        for o in OverridesParser.create().parse_overrides(overrides)
        if o.is_sweep_override() and not o.is_hydra_override()
    ]
    return f"sweep {' × '.join(swept) or 'of one job'} · {folder}"[:250]
