"""The task function: a validated RunConfig → simulation → metrics → files → MLflow.

Everything here is callable without Hydra (tests do), given a RunConfig and a run directory.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba.core import event

from harness.config.schema import Phase, RunConfig
from harness.sim.kernel import SimulationResult, load_numba_target, simulate
from harness.sim.lowering import Lowering, engine_costs, engine_in_effect
from harness.sim.metrics import StepMeasures, measured_steps, summarize
from harness.sim.task_graph import TaskGraph
from harness.sim.serving import ServingBatches, batch_requests, serving_summary
from harness.sim.policies import StepPlan, graphs_memory_gb, prepare
from harness.base.progress import Progress
from harness.base.stopping import held, raise_if_stopped
from harness.sim.outcome import RunResult, drawn_steps, shown_steps
from harness.base.errors import ConfigError
from harness.model.ops import Workload, check_memory
from harness.model.workload import build_workload, run_build_options

log = logging.getLogger(__name__)


# Tasks lowered and simulated at once. Steps end in a barrier, so a long run is simulated in chunks of
# steps, each starting when the previous one ended, with the same numbers: memory stays bounded.
CHUNK_TASKS = 2_000_000
TASKS_PER_OP_GUESS = 8  # sizes the first chunk (host stages + device task); later chunks use the count


# What a run costs this process, measured on a 2-core machine: peak RSS (`/usr/bin/time -f %M`) of
# llama2_7b_prefill and deepseek_v3 runs at 1000 and 40000 steps grows by 55–78 bytes per op and step
# (the per-step op arrays and their temporaries; the simulation itself works in bounded chunks) above
# ~0.6–0.8 GB of libraries and chunks in flight (a long run lowers one chunk ahead and measures one behind:
# deepseek_v3 at 1000 and 3000 steps peaked at 0.86 and 1.12 GB; 0.90 and 1.16 GB since a task record
# carries its front-end lead, 48 bytes instead of 40); end to end a run goes at 5.6–6.6 M tasks/s
# on one core, faster on two (benchmarks/bench_scaling.py). Measured again on 2026-12-05 (after MoE ops
# carried their experts hit per step): deepseek_v3 at 1000 and 5000 steps 0.98 and 1.66 GB, 99 bytes per op
# and step; qwen3_30b_decode 0.77 and 1.18 GB, 144. The estimate takes the high end, which refuses sooner.
BYTES_PER_OP_STEP = 150
BASE_MEMORY_BYTES = 0.8e9
TASKS_PER_S = 5e6
# Lowering builds one step's tasks op by op in Python before replicating them over the steps: ~40 µs an
# op of a step (a 100,000-op trace step: ~4.5 s; a 1,000,000-op one: ~40 s), nothing for a preset's few
# hundred ops, most of the time for a trace with huge steps.
LOWERING_S_PER_OP = 40e-6
# A chunk holds at least one whole step: a step of more than CHUNK_TASKS tasks costs its tasks' arrays on
# top (a 1,000,000-op trace step peaked at 2.9 GB where the per-op-step rule says 1.0: ~300 B a task).
BYTES_PER_CHUNK_TASK = 300
SLOW_RUN_S = 60.0  # beyond this a run says up front (stderr) how long it will take


@dataclass
class SizeEstimate:
    op_steps: int
    memory_bytes: float
    seconds: float


def available_memory_bytes() -> float | None:
    """Memory the kernel reports available now (Linux /proc/meminfo), else physical memory, else None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def one_step(run: RunConfig, kv_len: float | None = None) -> Workload:
    """One step of a card's run, built alone (what sizes a run before anything large is built); at
    `kv_len` tokens of KV a sequence, or the first step's."""
    return build_workload(
        dataclasses.replace(run.workload, steps=1, warmup_steps=0),
        devices_per_node=run.hardware.link.devices_per_node,
        kv_len=None if kv_len is None else np.array([float(kv_len)]),
        **run_build_options(run),
    )


def kv_grows(run: RunConfig) -> bool:
    """A card's decode run of a fixed batch: every sequence's KV cache grows a token a step (its last step
    holds the most: default_kv_len)."""
    cfg = run.workload
    return cfg.card is not None and not cfg.serving.enabled and cfg.phase == Phase.decode and cfg.steps > 1


def last_step(run: RunConfig) -> Workload:
    """The last step of a card's run, built alone: where the KV cache is largest."""
    return one_step(run, run.workload.context_len + run.workload.steps if kv_grows(run) else None)


def estimate_size(run: RunConfig, workload: Workload | None = None, step: Workload | None = None) -> SizeEstimate:
    """Ops per step × steps → memory and time, before anything large is built: from one step of a
    model card (`step`, else built here), or from `workload` when given (an op list read from a file:
    its size is the file's)."""
    if workload is None:
        workload = step or one_step(run)
        op_steps = workload.n_ops * run.workload.steps
    else:
        op_steps = workload.n_ops * workload.steps
    return SizeEstimate(
        op_steps=op_steps,
        memory_bytes=BASE_MEMORY_BYTES + BYTES_PER_OP_STEP * op_steps
        + BYTES_PER_CHUNK_TASK * max(0, workload.n_ops * TASKS_PER_OP_GUESS - CHUNK_TASKS),
        seconds=workload.n_ops * LOWERING_S_PER_OP + op_steps * TASKS_PER_OP_GUESS / TASKS_PER_S,
    )


def steps_the_kv_cache_allows(run: RunConfig, last: Workload | None = None) -> int | None:
    """How many steps of a run whose KV cache grows (kv_grows) fit in HBM, whatever its own steps: its
    memory is linear in the KV length between the first step and the last (`last`: the last step, built
    alone, if at hand). None where the KV cache does not grow or the first step alone does not fit
    (check_memory then names the batch and context)."""
    if not kv_grows(run):
        return None
    cfg, hbm_gb = run.workload, run.hardware.device.hbm_gb
    first_kv, last_kv = cfg.context_len + 1, cfg.context_len + cfg.steps  # default_kv_len's first and last
    last = last or last_step(run)
    graphs = graphs_memory_gb(run, last)
    first_gb = one_step(run).memory.total_gb + graphs
    if first_gb > hbm_gb:
        return None
    last_gb = last.memory.total_gb + graphs
    per_token_gb = (last_gb - first_gb) / (last_kv - first_kv)  # weights stay; the KV cache and workspace grow
    if per_token_gb <= 0:
        return None
    return int((hbm_gb - first_gb) / per_token_gb) + 1


def _refuse_kv_overflow(run: RunConfig, last: Workload) -> None:
    """Refuse, naming workload.steps, a run whose last step's memory outgrows HBM (the first fits)."""
    hbm_gb = run.hardware.device.hbm_gb
    if not kv_grows(run):
        return
    total_gb = last.memory.total_gb + graphs_memory_gb(run, last)
    if total_gb <= hbm_gb:
        return
    fitting = steps_the_kv_cache_allows(run, last)
    if fitting is None:  # the first step alone does not fit: check_memory says so, naming batch and context
        return
    cfg = run.workload
    raise ConfigError(
        f"workload.steps={cfg.steps}: the KV cache grows by a token a step, to {cfg.context_len + cfg.steps:,} tokens a sequence"
        f" at the last step: {total_gb:.3f} GB with hardware.device.hbm_gb={hbm_gb:g} (about {fitting:,} steps fit)"
    )


def check_size(run: RunConfig, workload: Workload | None = None) -> SizeEstimate:
    """Refuse, naming workload.steps (or the op-list file), a run whose arrays cannot fit in this
    machine's memory, or whose KV cache outgrows HBM by its last step. `workload`: an op list already
    read (see estimate_size)."""
    step = None
    if workload is None:
        step = last_step(run)  # sizes the run (ops per step) and holds the largest KV cache
        _refuse_kv_overflow(run, step)
    estimate = estimate_size(run, workload, step)
    available = available_memory_bytes()
    steps = workload.steps if workload is not None else run.workload.steps
    ops_per_step = max(1, estimate.op_steps // steps)
    if available is not None and estimate.memory_bytes > available:
        one_step_extra = estimate.memory_bytes - BASE_MEMORY_BYTES - BYTES_PER_OP_STEP * estimate.op_steps
        fitting = max(0, int((available - BASE_MEMORY_BYTES - one_step_extra) / BYTES_PER_OP_STEP / ops_per_step))
        what = f"workload.steps={steps}" if workload is None else f"workload.path={run.workload.path!r}" if run.workload.path else "workload.ops"
        raise ConfigError(
            f"{what}: needs about {estimate.memory_bytes / 1e9:.1f} GB of memory"
            f" ({ops_per_step} ops/step × {steps} steps), {available / 1e9:.1f} GB available (about {fitting:,} steps fit)"
        )
    return estimate


def is_op_list(run: RunConfig) -> bool:
    """An op list from a file or the config (no model card): its size is known only once it is read."""
    return run.workload.card is None


class CompileWatch(event.Listener):
    """Times Numba's compilations during a run and says when the first starts: the first run on a
    machine compiles the kernels (seconds), later ones load them from the cache."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._began = 0.0
        self._announced = False

    def on_start(self, event: event.Event) -> None:
        if self._depth == 0:
            self._began = time.perf_counter()
            if not self._announced:
                self._announced = True
                log.info("compiling the simulation kernels (first run only: later runs load them from the Numba cache)")
                Progress("hostbound").update("compiling kernels (first run only)", force=True)
        self._depth += 1

    def on_end(self, event: event.Event) -> None:
        self._depth -= 1
        if self._depth == 0:  # nested compilations (a kernel's callees) count once
            self.seconds += time.perf_counter() - self._began


def _say_if_slow(estimate: SizeEstimate, steps: int) -> None:
    if estimate.seconds > SLOW_RUN_S:
        log.warning(
            "%s ops/step × %d steps: about %.0f s to simulate (%.0f µs an op to lower one step, then %.0f M tasks/s)",
            f"{estimate.op_steps // steps:,}", steps, estimate.seconds, LOWERING_S_PER_OP * 1e6, TASKS_PER_S / 1e6,
        )


@dataclass
class PreparedRun:
    """A run made ready to simulate, and checked: the workload as its strategy runs it (padded, fused),
    the plan of every step, the serving batches (or None). Built once per run: the checks before Hydra
    starts make it, and the run then simulates it (`hand_over`)."""

    workload: Workload
    plan: StepPlan
    serving: ServingBatches | None
    seconds: float  # wall-clock time it took
    compile_s: float  # of which compiling kernels (the tiling cache's LRU, the serving loop's engine)


def prepare_run(run: RunConfig) -> PreparedRun:
    """Size check (a one-step build of a card, before anything large), serving batches, the strategy's
    workload and step plan, then the HBM check: everything that can fail before the simulation proper."""
    with held():  # a stop is taken after it, not inside Numba or the serving loop (see simulate_run)
        prepared = _prepare_run(run)
    raise_if_stopped()
    return prepared


def _prepare_run(run: RunConfig) -> PreparedRun:
    began = time.perf_counter()
    load_numba_target()
    watch = CompileWatch()
    with event.install_listener("numba:compile", watch):
        if not is_op_list(run):
            _say_if_slow(check_size(run), run.workload.steps)
        progress = Progress("hostbound")
        progress.update("planning serving batches" if run.workload.serving.enabled else "building the workload", force=True)
        serving = batch_requests(run, progress) if run.workload.serving.enabled else None
        batch = serving.batch if serving else np.full(run.workload.steps, run.workload.batch_size, dtype=np.int64)
        workload, plan = prepare(run, batch, serving.kv_len if serving else None)
        if serving:
            workload.generated = serving.generated
        if is_op_list(run):
            _say_if_slow(check_size(run, workload), workload.steps)
        check_memory(workload, run.hardware.device.hbm_gb, run.workload)
    return PreparedRun(workload, plan, serving, time.perf_counter() - began, watch.seconds)


def _simulated_part(run: RunConfig) -> str:
    """What decides a prepared run (not where its files go or whether it is tracked)."""
    return repr((run.hardware, run.workload, run.strategy, run.engine, run.seed))


_handed_over: dict[str, PreparedRun] = {}  # at most one: the run this process checked and is about to simulate


def hand_over(run: RunConfig, prepared: PreparedRun) -> None:
    """Keep `prepared` for the next `simulate_run` of this configuration in this process, which takes it
    (once): `python -m harness` checks a run before Hydra starts, then Hydra composes it again and runs it."""
    _handed_over.clear()
    _handed_over[_simulated_part(run)] = prepared


def simulate_run(run: RunConfig, chunk_tasks: int = CHUNK_TASKS) -> RunResult:
    """Prepare the run (or take the one `hand_over` kept), lower it under the strategy, run the engine,
    compute the metrics.

    `result` of the outcome holds the whole run's tasks when it fits in one chunk, otherwise the
    steps that trace.json and timeline.png show (simulated again from their start). `sim_wall_s` is
    the preparation and this call; `compile_s` the part of it spent compiling kernels (0 once they are
    cached).
    """
    began = time.perf_counter()
    # A stop (Ctrl-C, SIGTERM) is taken between chunks, not wherever Python happens to be: raised inside
    # Numba's dispatch or a helper thread's lowering it crashed the process (SIGSEGV) or left it broken.
    with held():
        handed = _handed_over.pop(_simulated_part(run), None)
        prepared = handed or _prepare_run(run)
        raise_if_stopped()
        watch = CompileWatch()
        with event.install_listener("numba:compile", watch):
            outcome = _simulate_prepared(run, prepared, chunk_tasks)
    raise_if_stopped()  # one that came during the last chunk: the run is not finished for its caller
    outcome.summary["compile_s"] = prepared.compile_s + watch.seconds
    outcome.summary["sim_wall_s"] = time.perf_counter() - began + (handed.seconds if handed else 0.0)
    log.info("simulated %d tasks in %.3f s", outcome.summary["tasks_simulated"], outcome.summary["sim_wall_s"])
    return outcome


def _simulate_prepared(run: RunConfig, prepared: PreparedRun, chunk_tasks: int) -> RunResult:
    run, engine_note = engine_in_effect(run)
    workload, plan, serving = prepared.workload, prepared.plan, prepared.serving
    progress = Progress("hostbound")
    release_us = serving.release_us if serving else np.zeros(workload.steps)

    # A serving run's engine costs follow its waits for requests, as when its steps were planned one by one.
    engine_us = engine_costs(workload.real_batch, workload.tokens, run.engine, 0, serving.idle_us, serving.scheduled_here) if serving else None
    lowering = Lowering(workload, run.hardware, run.strategy, run.seed, plan, run.engine, engine_us=engine_us)

    def lowered_chunks() -> Iterator[tuple[np.ndarray, TaskGraph]]:
        """Consecutive chunks of steps of about chunk_tasks tasks each (the first sized by a guess, the
        next by the tasks a step of the previous one had), lowered."""
        first, count = 0, max(1, chunk_tasks // (TASKS_PER_OP_GUESS * workload.n_ops))
        while first < workload.steps:
            steps = np.arange(first, min(first + count, workload.steps))
            graph = lowering.graph(steps, release_us)
            yield steps, graph
            count = max(1, chunk_tasks * steps.size // graph.n_tasks)
            first += steps.size

    def simulate_steps(steps: np.ndarray, start_after_us: float) -> SimulationResult:
        return _simulate_after(lowering.graph(steps, release_us), start_after_us)

    chunks = lowered_chunks()
    steps, graph = next(chunks)
    if steps.size == workload.steps:
        progress.update(f"simulating {workload.steps} steps ({workload.n_ops} ops each)", force=True)
        result = _simulate_after(graph, 0.0)
        parts = [StepMeasures.of(result, workload)]
    else:
        parts = _simulate_chunks(steps, graph, chunks, workload, progress)
    progress.update("computing metrics", force=True)
    measures = StepMeasures.concat(parts)
    summary, steps_table = summarize(measures, workload, plan)
    if len(parts) > 1:  # keep only what the outputs draw: a bounded window of steps
        measured = measured_steps(workload, plan)
        shown = shown_steps(measured, max(run.output.trace_steps, 1))
        drawn = drawn_steps(measured, run.output.steps_drawn())
        first, last = min(int(shown[0]), drawn[0]), max(int(shown[-1]), drawn[1])
        result = simulate_steps(np.arange(first, last + 1), float(measures.start_us[first]))
    progress.done()
    summary.update(plan.info)
    if workload.memory.weights_gb > 0:  # cards know their memory; explicit op lists and traces do not
        m = workload.memory
        # Resident weights, KV cache and graphs, plus the activations live at the worst moment of the run.
        summary["peak_mem_gb"] = m.weights_gb + m.kv_cache_gb + m.graphs_gb + summary["peak_activation_gb"]
    summary["devices"] = run.workload.devices
    summary["tp"] = run.workload.tp  # the devices of the DP group whose tokens throughput counts (also an identity key)
    if not workload.step_io:  # an imported profile: its steps' token count is whatever batch_size says
        summary["throughput_note"] = (
            f"tokens per step = workload.batch_size ({run.workload.batch_size}): a profile does not record its batch; set it for tok/s"
        )
    elif run.workload.card is None and run.workload.path is None:  # ops written out: no model says what a step makes
        summary["throughput_note"] = (
            f"tokens per step = workload.batch_size ({run.workload.batch_size}): an op list does not say what a step produces"
        )
    if serving is not None:
        summary.update(serving_summary(serving, run.workload.warmup_steps))
    if engine_note:
        summary["engine_note"] = engine_note
    return RunResult(summary=summary, step_columns=steps_table, result=result, workload=workload)


def _simulate_after(graph: TaskGraph, start_after_us: float) -> SimulationResult:
    """Simulate a chunk of steps that starts once the previous chunk ended (steps end in a barrier):
    its first task, its first step's, is released then at the earliest."""
    release = graph.tasks["release_us"]
    release[0] = max(release[0], start_after_us)
    return simulate(graph)


def _simulate_chunks(
    steps: np.ndarray, graph: TaskGraph, chunks: Iterator[tuple[np.ndarray, TaskGraph]], workload: Workload, progress: Progress
) -> list[StepMeasures]:
    """Simulate a run chunk after chunk, in order (each starts when the previous ended); a helper thread
    lowers the next chunk and measures the previous one meanwhile. The kernels release the GIL
    (`nogil`), so the two cores share the work: lowering and metrics took as long as the simulation
    itself. At most one chunk is lowered ahead and one waits to be measured."""
    helper = ThreadPoolExecutor(1, thread_name_prefix="hostbound-chunks")
    try:
        upcoming: Future | None = helper.submit(next, chunks, None)
        measured: list[Future] = []
        end_us = 0.0
        while True:
            raise_if_stopped()  # simulate_run holds stops until here
            progress.update(f"simulating steps {steps[0]}–{steps[-1]} of {workload.steps} ({workload.n_ops} ops each)", force=True)
            result = _simulate_after(graph, end_us)
            end_us = result.makespan_us  # the last step's end: the barriers make it the chunk's
            measured.append(helper.submit(StepMeasures.of, result, workload))
            del result, graph  # the helper holds the result until it is measured
            lowered = upcoming.result() if upcoming is not None else None
            if lowered is None:
                break
            steps, graph = lowered
            upcoming = helper.submit(next, chunks, None)
        return [part.result() for part in measured]
    finally:
        helper.shutdown(wait=True, cancel_futures=True)  # Ctrl-C or an error: what runs ends, nothing more starts
