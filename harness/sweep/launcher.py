"""The default sweep launcher: every job in one of N warm worker processes forked from the sweep.

Hydra's basic launcher runs a sweep's jobs one after the other in this process (one core of many), and
joblib's or Ray's workers each start Python afresh: ~3 s of imports, their own tracking store connection
and compiled kernels loaded, and every job's context pickled to them. Forking after the sweep has started
(`SweepTracking.on_multirun_start` has made the store, the parent run and the kernels) gives workers that
have all of it already; a job sends them only its overrides. Each worker composes and runs its jobs as
Hydra's own `run_job` does (`run_sweep_job`, with cheaper copies), so a job's folder, `.hydra/` files,
log file and callbacks are what the basic launcher makes.

    hydra.launcher.n_jobs: null     # one worker per core this process may use; 1 runs the jobs in this process

Stopping: SIGTERM or Ctrl-C to the sweep reaches the workers as SIGTERM (harness.sweep.callbacks; they ignore
Ctrl-C itself, which a terminal sends the whole group); each ends the job it runs, between store calls
(its MLflow run ends FAILED, harness.base.stopping), and exits. A worker that dies (killed, out of memory) ends
the sweep in one line, exit status 5, and the runs it left open are marked KILLED; `resume=true`
finishes the rest.
Where processes cannot be forked (Windows) the jobs run one by one in this process, as with
hydra/launcher=basic.
"""
from __future__ import annotations

import copy
import gc
import logging
import multiprocessing
import os
import pickle
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import (JobReturn, JobRuntime, JobStatus, _flush_loggers, _save_config, configure_log, env_override,
                              filter_overrides, setup_globals)
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from harness.sweep.compose_cache import copy_config

from harness.base.errors import EXIT_WORKER_DIED, ConfigError, fail
from harness.base.forking import cores_usable
from harness.base.stopping import SweepStopped, stop_with

log = logging.getLogger(__name__)

_launching: Optional["WarmWorkerLauncher"] = None  # the sweep's launcher, as the forked workers inherit it
_in_job = False  # in a worker: a job is running (SIGTERM ends it) rather than the worker waiting for one
_stopping = False  # in a worker: SIGTERM came; the worker exits once its job has unwound


def check_n_jobs(n_jobs: object) -> None:
    if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 1):
        raise ConfigError(f"hydra.launcher.n_jobs={n_jobs!r}: must be a whole number >= 1, or null for one per core")


class WarmWorkerLauncher(Launcher):
    def __init__(self, n_jobs: Optional[int] = None) -> None:
        self.n_jobs = n_jobs
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def workers_for(self, jobs: int) -> int:
        check_n_jobs(self.n_jobs)
        return max(1, min(jobs, self.n_jobs or cores_usable()))

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        global _launching
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        workers = self.workers_for(len(job_overrides))
        log.info(f"Launching {len(job_overrides)} jobs on {workers} worker process{'es' if workers > 1 else ''}")
        jobs = list(enumerate(job_overrides, start=initial_job_idx))
        for idx, overrides in jobs:
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        _launching = self
        # What the sweep made before its first job (imports, compositions, the store's engine, kernels) lives
        # as long as it: left out of garbage collection, every job's collections are ~3x cheaper (~30 ms a job
        # here), and forked workers share those pages instead of copying them when a collection touches them.
        gc.freeze()
        try:
            if workers == 1:
                return [self.run_one(idx, overrides) for idx, overrides in jobs]
            if "fork" not in multiprocessing.get_all_start_methods():  # Windows
                log.warning("no fork on this platform: the jobs run one by one in this process")
                return [self.run_one(idx, overrides) for idx, overrides in jobs]
            return self._launch_forked(jobs, workers)
        finally:
            _launching = None

    def run_one(self, idx: int, overrides: Sequence[str]) -> JobReturn:
        """One job, as Hydra's basic launcher runs it."""
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = idx
            sweep_config.hydra.job.num = idx
        return run_sweep_job(self.hydra_context, self.task_function, sweep_config)

    def _launch_forked(self, jobs: list[tuple[int, Sequence[str]]], workers: int) -> list[JobReturn]:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"), initializer=_start_worker)
        futures: list[Future] = [pool.submit(_run_in_worker, idx, list(overrides)) for idx, overrides in jobs]
        try:
            results = [future.result() for future in futures]
        except BrokenProcessPool:
            pool.shutdown(wait=True, cancel_futures=True)
            finished = sum(f.done() and not f.cancelled() and f.exception() is None for f in futures)
            fail(f"a sweep worker process died (killed by a signal, or out of memory): {finished} of {len(jobs)} jobs"
                 " finished; run the same command with resume=true to finish the rest", EXIT_WORKER_DIED)
        except BaseException:  # a stop (SweepStopped: the sweep's handler has sent the workers SIGTERM already)
            pool.shutdown(wait=True, cancel_futures=True)  # or an error here: the running jobs end, no new one starts
            raise
        pool.shutdown(wait=True)
        return results


def run_sweep_job(hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> JobReturn:
    """hydra.core.utils.run_job(job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir"), step for
    step, but cheaper: the job's copy of its config is pickled rather than deep-copied, and the Hydra config
    is copied once and given the job's folder instead of being copied twice (~20 ms of a ~120 ms job).
    tests/test_launcher.py checks that both make the same files and the same JobReturn."""
    callbacks = hydra_context.callbacks
    old_cwd = os.getcwd()
    hydra = HydraConfig.instance()
    orig_hydra_cfg = hydra.cfg
    hydra.set_config(config)  # the folder's interpolations may read it (${hydra:job.num})
    output_dir = os.path.join(str(OmegaConf.select(config, "hydra.sweep.dir")), str(OmegaConf.select(config, "hydra.sweep.subdir")))
    for node in (config.hydra.runtime, hydra.cfg.hydra.runtime):  # the job's config and Hydra's copy of it
        with read_write(node), open_dict(node):
            node.output_dir = os.path.abspath(output_dir)
    _chdir = None
    try:
        ret = JobReturn()
        task_cfg = copy_config(config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        ret.cfg = task_cfg
        hydra_cfg = copy.deepcopy(hydra.cfg)  # pickling it would take its parent, the whole config, along
        ret.hydra_cfg = hydra_cfg
        ret.overrides = OmegaConf.to_container(config.hydra.overrides.task)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        _chdir = bool(hydra_cfg.hydra.job.chdir)  # None is False from version_base 1.2 on (conf: 1.3)
        if _chdir:
            os.chdir(output_dir)
            ret.working_dir = output_dir
        else:
            ret.working_dir = os.getcwd()
        configure_log(config.hydra.job_logging, config.hydra.verbose)
        if config.hydra.output_subdir is not None:
            hydra_output = Path(config.hydra.runtime.output_dir) / Path(config.hydra.output_subdir)
            _save_config(task_cfg, "config.yaml", hydra_output)
            _save_config(hydra_cfg, "hydra.yaml", hydra_output)
            _save_config(config.hydra.overrides.task, "overrides.yaml", hydra_output)
        with env_override(hydra_cfg.hydra.job.env_set):
            callbacks.on_job_start(config=config, task_function=task_function)
            try:
                ret.return_value = task_function(task_cfg)
                ret.status = JobStatus.COMPLETED
            except Exception as e:
                ret.return_value = e
                ret.status = JobStatus.FAILED
        ret.task_name = JobRuntime.instance().get("name")
        _flush_loggers()
        callbacks.on_job_end(config=config, job_return=ret)
        return ret
    finally:
        hydra.cfg = orig_hydra_cfg
        if _chdir:
            os.chdir(old_cwd)


def _start_worker() -> None:
    """In a forked worker, before its first job: its own store connections, and signals that end a job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the launching process stops the workers by SIGTERM
    signal.signal(signal.SIGTERM, _stop_worker)
    from harness.tracking.sweep_runs import forget_inherited_connections

    forget_inherited_connections()


def _stop_worker(signum: int, frame: Any) -> None:
    global _stopping

    signal.signal(signum, signal.SIG_IGN)
    _stopping = True
    if not _in_job:  # waiting for a job: nothing to end
        os._exit(128 + signum)
    # Unwinds the job (its MLflow run ends FAILED, a write leaves no half file), between store calls.
    stop_with(SweepStopped(signum))


def _run_in_worker(idx: int, overrides: list[str]) -> JobReturn:
    global _in_job
    assert _launching is not None, "a worker must be forked from WarmWorkerLauncher.launch"
    _in_job = True
    try:
        ret = _launching.run_one(idx, overrides)
    finally:
        _in_job = False
        if _stopping:
            logging.shutdown()
            os._exit(128 + signal.SIGTERM)
    try:
        pickle.dumps(ret._return_value)
    except Exception:  # a job's exception that cannot travel back: its text does
        ret._return_value = RuntimeError(f"{type(ret._return_value).__name__}: {ret._return_value}")
    return ret
