"""Sweeps: a Hydra callback that gives every multirun one MLflow parent run and its jobs child runs.

Before any job starts (in the launching process) it creates the tracking store and the experiment,
so parallel jobs never race a first-time database migration, warms the Numba cache, and starts the
parent run (tags: sweep directory, overrides), whose id it leaves in the sweep directory for the
jobs. Each job's run is tagged as its child (`mlflow.parentRunId`). When the sweep ends, the parent
gets the comparison of its jobs: the table as its description and, with the plots, as artifacts.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness.sweep import compose_cache
from harness.base.errors import EXIT_BAD_INPUT, EXIT_TRACKING_FAILED
from harness.base.files import write_text
from harness.base.progress import Progress
from harness.base.stopping import SweepStopped, say_stopped, stop_with, store_call
from harness.results.outputs import JOB_FAILED_FILE, RESULTS_CSV, RESULTS_MD, failed_job_dirs
from harness.tracking.store import PARENT_FILE, SWEPT_FILE
from harness.tracking.sweep_runs import parent_description, sweep_name, swept_keys_of

log = logging.getLogger(__name__)


def clear_failed_job(job_dir: Path) -> None:
    """A job starting again (resume=true after the input was fixed) is not the job that failed: its old
    JOB_FAILED.txt kept it out of results.csv, counted it failed beside its new summary.json and failed
    the sweep that had just finished it."""
    try:
        (job_dir / JOB_FAILED_FILE).unlink(missing_ok=True)
    except OSError:  # not ours to remove (a folder we cannot write): the job's own write says so
        pass


def _first_line(path: Path) -> str:
    try:
        lines = path.read_text().strip().splitlines()
    except OSError:  # removed meanwhile
        return "failed"
    return lines[0] if lines else "failed"


def mark_failed_job(job_dir: Path, reason: str) -> None:
    """A job of a sweep stopped on bad input: say so in its folder and on stderr, and let the sweep go on
    (its end writes results.csv for the jobs that finished, marks the parent run FAILED, exits 2)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    write_text(job_dir / JOB_FAILED_FILE, reason + "\n")
    print(f"hostbound: error: job {job_dir.name}: {reason}", file=sys.stderr)


def _tracking(config: DictConfig):
    from harness.config.schema import TrackingConfig

    plain = OmegaConf.to_container(config.get("tracking", {}), resolve=True) or {}
    return TrackingConfig(**plain)


def warm_numba_cache() -> None:
    """Compile (or load) every kernel once, so parallel jobs only read the cache: a two-step run of
    the built-in defaults goes through lowering, the engine and the metrics."""
    from harness.config.schema import RunConfig
    from harness.sim.kernel import lru_hits
    from harness.sim.simulate import simulate_run

    run = RunConfig()
    run.workload.steps = 2
    outcome = simulate_run(run)
    outcome.result.critical_path()
    lru_hits(np.arange(3), 2)


class SweepTracking(Callback):
    """The sweep's callback (conf/config.yaml). Made in the launching process and unpickled in joblib's and
    Ray's workers: either way it puts the compose cache behind Hydra's config loader there, through
    which every launcher composes each job."""

    def __init__(self) -> None:
        compose_cache.install()
        self.compose_cache_installed = True  # a non-empty state: unpickling then calls __setstate__

    def __setstate__(self, state: dict) -> None:
        compose_cache.install()
        self.__dict__.update(state)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        # Runs in whichever process ran the job (the launcher's for the basic launcher, a worker's for joblib).
        overrides = " ".join(getattr(job_return, "overrides", None) or [])
        Progress("hostbound sweep").update(f"done: {overrides}", force=True)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        end_workers_with_the_sweep(Path(config.hydra.sweep.dir), _tracking(config))
        warm_numba_cache()
        tracking = _tracking(config)
        if not tracking.enabled:
            return
        from harness.tracking.store import FAILED_ENV, bound_requests, resolve_uri, short_reason
        from harness.tracking.sweep_runs import reopen_parent_run, start_parent_run

        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        bound_requests(tracking)
        try:
            with store_call():
                overrides = list(config.hydra.overrides.task)
                write_text(sweep_dir / SWEPT_FILE, "\n".join(sorted(swept_keys_of(overrides))) + "\n")
                name = sweep_name(overrides, sweep_dir.name, dict(config.hydra.runtime.choices))
                parent_id = None
                if OmegaConf.select(config, "resume", default=False) and (sweep_dir / PARENT_FILE).is_file():
                    # Finishing an interrupted sweep: its jobs so far are the earlier parent's children.
                    parent_id = reopen_parent_run(tracking, (sweep_dir / PARENT_FILE).read_text().strip(), sweep_dir)
                if parent_id is None:
                    parent_id = start_parent_run(tracking, name, sweep_dir, " ".join(config.hydra.overrides.task))
                    write_text(sweep_dir / PARENT_FILE, parent_id)  # with the run: a stop between them would leave it RUNNING unseen
        except Exception as exc:  # the store is down: the jobs run (their files are what matters) without it
            reason = f"tracking.uri={resolve_uri(tracking)}: {short_reason(exc)}"
            os.environ[FAILED_ENV] = reason  # this process's jobs and the workers it starts skip the store
            log.warning("tracking failed, the sweep runs without it (%s)", reason)
            return
        log.info("sweep parent run %s in %s", parent_id, resolve_uri(tracking))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        Progress("hostbound sweep").done()
        from harness.results.comparison import comparison, load_run_dirs, plot, to_markdown, write_csv

        failed_jobs = failed_job_dirs(sweep_dir)
        table = load_run_dirs([sweep_dir])
        if failed_jobs and not table.empty:
            # A failed job's folder may hold a summary.json all the same: another configuration's, that
            # resume=true refused to overwrite. It is not this job's result: out of the table, and each
            # job counted once (failed), not once failed and once finished.
            table = table[~table["run_dir"].isin({str(job) for job in failed_jobs})].reset_index(drop=True)
        description, plots = "", []
        failures = "; ".join(f"{job.name}: {_first_line(job / JOB_FAILED_FILE)}" for job in failed_jobs)
        if table.empty and failed_jobs:
            # No job finished: results.md says so (its table of before would read as this launch's);
            # an earlier launch's results.csv is left as it was.
            write_text(sweep_dir / RESULTS_MD, f"No job finished. Failed ({len(failed_jobs)} of {len(failed_jobs)} jobs): {failures}.\n")
        if not table.empty:
            write_csv(sweep_dir / RESULTS_CSV, table)  # every summary key of every job
            compared_table = comparison(table)
            compared = to_markdown(compared_table)
            if failed_jobs:  # the table would read as the whole sweep
                compared += f"\n\nFailed, not in this table ({len(failed_jobs)} of {len(failed_jobs) + len(table)} jobs): {failures}."
            write_text(sweep_dir / RESULTS_MD, compared + "\n")
            plots = plot(compared_table, sweep_dir)
            description = parent_description(len(table), list(config.hydra.overrides.task), compared, plots)
            if OmegaConf.select(config, "output.print_summary", default=True):  # the sweep's answer, after its jobs'
                drawn = " ".join(p.name for p in plots) or "none (no eager run, no bubble figures)"
                print(
                    f"\nhostbound sweep: {len(table)} jobs\n{compared}\n"
                    f"  results      {sweep_dir.absolute() / RESULTS_MD} (every summary key: {RESULTS_CSV}; plots: {drawn})",
                    flush=True,
                )
        tracking = _tracking(config)
        if tracking.enabled:
            written = [sweep_dir / name for name in (RESULTS_CSV, RESULTS_MD) if (sweep_dir / name).exists()] + plots
            self._finish_tracking(sweep_dir, tracking, len(table), failed=bool(failed_jobs), description=description, artifacts=written)
        if failed_jobs:
            first = _first_line(failed_jobs[0] / JOB_FAILED_FILE)
            held = f"results.csv holds the {len(table)} that finished" if len(table) else "none finished"
            print(
                f"hostbound: error: {len(failed_jobs)} of {len(failed_jobs) + len(table)} jobs failed, {held}"
                f" (first: {failed_jobs[0].name}: {first})",
                file=sys.stderr,
            )
            raise SystemExit(EXIT_BAD_INPUT)

    def _finish_tracking(self, sweep_dir: Path, tracking, jobs: int, failed: bool, description: str, artifacts: list[Path]) -> None:
        from harness.tracking.store import FAILED_FILE, later_command
        from harness.tracking.sweep_runs import finish_parent_run

        parent_file = sweep_dir / PARENT_FILE
        if parent_file.exists():
            run_id = parent_file.read_text().strip()
            try:
                with store_call():
                    finish_parent_run(tracking, run_id, artifacts, jobs, failed, description)
            except Exception as exc:  # the store went away during the sweep; the jobs' markers say which
                log.warning("tracking: could not finish the sweep's parent run %s: %s", run_id, exc)
        missed = sorted(p.parent for p in sweep_dir.glob(f"*/{FAILED_FILE}"))
        if missed and not failed:  # a failed job's line comes first; the markers stay for the log command
            print(
                f"hostbound: error: tracking failed for {len(missed)} job(s) of the sweep, their files are kept"
                f" ({(missed[0] / FAILED_FILE).read_text().splitlines()[0]}); log them later: {later_command(sweep_dir.absolute(), tracking)}",
                file=sys.stderr,
            )
            raise SystemExit(EXIT_TRACKING_FAILED)


def _descendants(pid: int) -> list[int]:
    """Processes started by `pid`, and theirs (Linux /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, [])]
        found += frontier
    return found


_STOPPABLE: dict[str, Any] = {}  # the running sweep's folder and tracking settings, for finish_stopped_sweep


def end_workers_with_the_sweep(sweep_dir: Path, tracking) -> None:
    """SIGTERM or Ctrl-C to a sweep ends its workers too (a joblib sweep used to leave them running; the
    default launcher's workers ignore Ctrl-C and wait for this) and marks its parent MLflow run KILLED
    instead of RUNNING forever."""

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for pid in _descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        stop_with(SweepStopped(signum))  # now, or once the store call under way has ended

    if threading.current_thread() is threading.main_thread():
        _STOPPABLE.update(sweep_dir=sweep_dir, tracking=tracking)
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def _end_parent_run(status: str, only_if_running: bool = False) -> None:
    """End the running sweep's MLflow parent run with `status`, if it has one, and its jobs' runs still
    RUNNING as KILLED (harness.tracking.sweep_runs.end_parent_run). Best effort: the store is not the
    point when a sweep is failing or stopping."""
    sweep_dir, tracking = _STOPPABLE.get("sweep_dir"), _STOPPABLE.get("tracking")
    parent_file = sweep_dir / PARENT_FILE if sweep_dir else None
    if tracking is None or not tracking.enabled or parent_file is None or not parent_file.exists():
        return
    try:
        from harness.tracking.sweep_runs import end_parent_run

        end_parent_run(tracking, parent_file.read_text().strip(), status, only_if_running)
    except Exception:
        pass


def fail_unfinished_sweep() -> None:
    """A sweep that ended in an error of Hydra's or a launcher's (a Ray cluster refusing the client, say)
    never reached on_multirun_end: its parent run ends FAILED instead of RUNNING forever."""
    _end_parent_run("FAILED", only_if_running=True)


def finish_stopped_sweep(stopped: SweepStopped) -> None:
    """After the stack unwound: the parent run KILLED and one line; the process then ends by the same
    signal (harness.base.stopping.exit_now)."""
    _end_parent_run("KILLED")
    say_stopped("finished jobs keep their folders (resume=true finishes the rest)")
