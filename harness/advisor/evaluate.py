"""Where an advice's candidates are simulated: in this process, in worker processes forked from it (one per
core: `advise.workers`), or on Ray (`advise.ray_address`: a cluster's, or `local` for an instance of its
own). Each simulation is one candidate's RunConfig at one rung's step count; what comes back is its
summary, or the one-line reason the simulation refused it. Results come back in the order asked, and a
simulation does not depend on where it ran: the same question gives the same answer on 1, 2 or 16 cores.

Forked workers start with what this process has (compiled kernels, compositions), so they are warm from
their first candidate. They ignore Ctrl-C (the terminal sends it to the whole group; this process ends
them) and die at SIGTERM: they hold nothing that needs saving.
"""
from __future__ import annotations

import multiprocessing
import signal
import socket
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Iterator, Optional, Sequence, Union

from harness.base.errors import EXIT_WORKER_DIED, ConfigError, HarnessError, fail
from harness.base.forking import cores_usable
from harness.advisor.candidates import with_steps
from harness.config.schema import RunConfig
from harness.sim.simulate import simulate_run

Result = tuple[Optional[dict], str]  # (summary, "") or (None, why the simulation refused the candidate)


def simulate_one(run: RunConfig, steps: int) -> Result:
    """One candidate at `steps` steps (no warm-up: a rung compares runs of equal length)."""
    try:
        summary = simulate_run(with_steps(run, steps)).summary
    except HarnessError as exc:  # a limit only the simulation finds (e.g. the KV cache at its last step)
        return None, str(exc)
    # Whether requests were served, as summary.json says it: a serving run that finished none has no
    # request figures to tell it by (a bool: not logged as a metric).
    return {**summary, "serving": run.workload.serving.enabled}, ""


class InProcess:
    """Every simulation here, one after the other."""

    workers = 1

    def map(self, jobs: Sequence[tuple[RunConfig, int]]) -> Iterator[Result]:
        for run, steps in jobs:
            yield simulate_one(run, steps)

    def close(self) -> None:
        pass


def _start_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the advising process ends its workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _simulate_job(job: tuple[RunConfig, int]) -> Result:
    return simulate_one(*job)


class ForkedWorkers:
    """Simulations on `workers` processes forked from this one (made at the first map: forked as late as
    possible, they inherit the kernels compiled by then). A worker that dies (killed, out of memory) ends
    the advice in one line (exit status 5) instead of leaving it waiting for a result that never comes."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: Optional[ProcessPoolExecutor] = None

    def map(self, jobs: Sequence[tuple[RunConfig, int]]) -> Iterator[Result]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"), initializer=_start_worker)
        # One job a task: a simulation takes 10-100 ms, far more than sending its config.
        return self._results([self._pool.submit(_simulate_job, job) for job in jobs])

    def _results(self, futures: list[Future]) -> Iterator[Result]:
        for done, future in enumerate(futures):
            try:
                yield future.result()
            except BrokenProcessPool:
                self.close()
                fail(f"an advice's worker process died (killed by a signal, or out of memory) after {done} of {len(futures)}"
                     " simulations of this rung; advise.workers=1 simulates in the command's own process", EXIT_WORKER_DIED)

    def close(self) -> None:
        """End the workers now (a search that is done, stopped, or out of time waits for none of them)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):  # Python < 3.14 has no terminate_workers()
            if process.is_alive():
                process.kill()
        pool.shutdown(wait=True, cancel_futures=True)


class OnRay:
    """Simulations as Ray tasks, one core each, on the cluster at `address` (`auto`: the one `ray start`
    made on this machine) or on an instance started for the search (`local`). The cluster's machines need
    this checkout at the same path (workload cards and op lists are read where the task runs)."""

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError(f"advise.ray_address={address}: Ray is not installed (pip install -e '.[cluster]')") from exc
        self._ray = ray
        if ":" in address:  # Ray waits minutes for a cluster that is not there: a closed port is known at once
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=10).close()
            except (OSError, ValueError) as exc:
                raise ConfigError(f"advise.ray_address={address}: no Ray cluster there ({exc})") from exc
        if not ray.is_initialized():
            try:
                ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"advise.ray_address={address}: no Ray cluster there ({str(exc).splitlines()[0]})") from exc
            self._started = True
        else:
            self._started = False
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(num_cpus=1)(_simulate_job)

    def map(self, jobs: Sequence[tuple[RunConfig, int]]) -> Iterator[Result]:
        refs = [self._remote.remote(job) for job in jobs]
        for ref in refs:
            yield self._ray.get(ref)

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


Evaluator = Union[InProcess, ForkedWorkers, OnRay]


def evaluator(workers: Optional[int], ray_address: Optional[str]) -> Evaluator:
    """Where `advise.workers` and `advise.ray_address` say the simulations run."""
    if ray_address:
        return OnRay(ray_address)
    count = workers or cores_usable()
    if count <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return InProcess()
    return ForkedWorkers(count)
