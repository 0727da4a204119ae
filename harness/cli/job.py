"""One `python -m harness` job: simulate a RunConfig, write its run folder, log it to MLflow.

Callable without Hydra (tests do), given a RunConfig and a run folder; `command.run_from_hydra` is
the Hydra side. With `resume=true` a finished run of the same configuration is reused instead.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
from pathlib import Path


from harness.base.errors import ConfigError, TrackingError
from harness.base.stopping import Stopped, raise_if_stopped
from harness.config.schema import RunConfig
from harness.results.outputs import STEPS_FILE, read_steps, write_outputs
from harness.results.resume import config_hash, find_finished, finished_hash, reuse, setting_hash, strategy_changes
from harness.results.drawer import BackgroundDrawer
from harness.sim.outcome import UNREAD_IN_SERVING, WHAT_RAN_WORKLOAD_KEYS, RunResult
from harness.sim.simulate import simulate_run
from harness.tracking import early as early_tracking
from harness.base.overrides import override_key

log = logging.getLogger(__name__)


def identity(run: RunConfig, overrides: tuple[str, ...] = ()) -> dict:
    """What ran, for summary.json: the deployment's sizes and the overrides on top of the presets."""
    w = run.workload
    sizes = {key: getattr(w, key) for key in WHAT_RAN_WORKLOAD_KEYS}
    if w.serving.enabled:  # its batches are the requests admitted, their KV the requests' own: null, not 1 and 1024
        sizes.update(dict.fromkeys(UNREAD_IN_SERVING, None))
    return {  # the keys of WHAT_RAN_KEYS but the hashes (added beside them)
        **{key: value.value if isinstance(value, enum.Enum) else value for key, value in sizes.items()},
        "serving": w.serving.enabled, "seed": run.seed, "overrides": recorded_overrides(overrides, run),
    }


def _config_value(run: RunConfig, dotted: str):
    """The run's value at a dotted key (dataclass fields, then mapping keys), or None."""
    node = run
    for part in dotted.split("."):
        if dataclasses.is_dataclass(node) and not isinstance(node, type) and part in {f.name for f in dataclasses.fields(node)}:
            node = getattr(node, part)
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def recorded_overrides(overrides: tuple[str, ...], run: RunConfig | None = None) -> str:
    """The overrides as a single run's command line writes them: Hydra's sweeper rewrites a job's booleans
    (`true` → `True`), and a resumed job gains `resume=True`, which says where it ran, not what; so the same
    job's summary.json is the same bytes from a run, a sweep and a resumed sweep. A switch is written as
    the run read it (`serving.enabled=1`, `=on`, `=yes` are `=true`): one setting, one spelling, so a
    comparison does not split runs that are the same."""
    written = []
    for override in overrides:
        key, equals, value = override.partition("=")
        if override_key(key) == "resume":
            continue
        read = _config_value(run, override_key(key)) if run is not None and equals else None
        if isinstance(read, bool):
            written.append(f"{key}={'true' if read else 'false'}")
        else:
            written.append(f"{key}{equals}{value.lower()}" if value in ("True", "False") else override)
    return " ".join(written)


def _say_first(summary: dict, key: str, note: str) -> None:
    """`note` ahead of what the summary's `key` already says."""
    summary[key] = note + (f"; {summary[key]}" if key in summary else "")


def _say_steps_set_by_the_trace(outcome: RunResult, run: RunConfig, overrides: tuple[str, ...]) -> None:
    """workload.steps written on the command line for a trace CSV with a step column, whose steps ran instead:
    the header and summary say steps=3 where 4 ran (documented; said here, beside the figures)."""
    written = any(override_key(o) == "workload.steps" for o in overrides)
    ran = outcome.workload.steps if outcome.workload is not None else run.workload.steps
    repeat = max(1, run.workload.repeat)
    if written and ran != run.workload.steps * repeat:  # workload.repeat plays the steps again: that is no surprise
        note = f"{ran} steps ran, not workload.steps={run.workload.steps}: the trace's step column sets them"
        note += f" ({ran // repeat}, played {repeat} times: workload.repeat)" if repeat > 1 else ""
        _say_first(outcome.summary, "steps_note", note)


def _say_unread_in_serving(outcome: RunResult, run: RunConfig, overrides: tuple[str, ...]) -> None:
    """workload.batch_size or context_len written for a serving run, which reads neither: its batches are
    the requests it admits and their KV lengths the requests' own. A sweep over batch_size gave rows with
    the same numbers and nothing said why."""
    if not run.workload.serving.enabled:
        return
    written = {override_key(o) for o in overrides}
    unread = [f"workload.{key}" for key in UNREAD_IN_SERVING if f"workload.{key}" in written]
    if unread:
        s = run.workload.serving
        note = (f"{' and '.join(unread)} not read by a serving run: its batches are the requests admitted (up to"
                f" workload.serving.max_batch={s.max_batch}), their KV lengths the requests' own (workload.serving.prompt_len_mean={s.prompt_len_mean:g})")
        _say_first(outcome.summary, "serving_note", note)


def execute(
    run: RunConfig, run_dir: Path, params: dict, overrides: tuple[str, ...] = (), outputs_dir: Path | None = None
) -> RunResult:
    """Simulate, write the run directory, log to MLflow when enabled. `params` = flattened resolved config,
    `overrides` the command line's (recorded in summary.json, so the file alone says what ran). With
    `run.resume`, a finished run of the same configuration (in `run_dir`, or under `outputs_dir`) is
    reused instead: its files, no simulation, no second MLflow run."""
    digest = config_hash(params)
    if run.resume:
        there = finished_hash(run_dir)
        if there is not None and there != digest:  # resuming finishes a run, never overwrites another one
            raise ConfigError(
                f"resume=true: {run_dir} holds a finished run of another configuration (config_hash {there}, this one"
                f" {digest}); its files are kept: run this one in a new folder"
            )
        found = find_finished(digest, run_dir, outputs_dir or run_dir.parent)
        if found is not None:
            log.info("resumed: %s already finished in %s", digest, found)
            summary = reuse(found, run_dir)
            outcome = RunResult(summary=summary, step_columns=read_steps(run_dir / STEPS_FILE), result=None, workload=None, resumed_from=found)
            if run.tracking.enabled:  # a run stopped while logging has its files but maybe no MLflow run yet
                from harness.tracking.store import log_folder

                try:
                    log_folder(run.tracking, run_dir, logged_as=found)
                except Exception as exc:  # the store is down: as for a simulated run, the files are what matters
                    outcome.tracking_error = TrackingError(f"tracking failed for the resumed run in {run_dir} ({exc})", str(exc)[:300])
            return outcome
    if run.tracking.enabled:
        early_tracking.open_store(run.tracking)  # by the logging process, if the command started one
    timeline_steps = run.output.steps_drawn()
    # The timeline's process imports matplotlib while this one simulates (results.drawer.BackgroundDrawer).
    raise_if_stopped()  # one swallowed on its way up: not a whole simulation more
    with BackgroundDrawer() if timeline_steps > 0 else contextlib.nullcontext() as drawer:
        outcome = simulate_run(run)
        what_ran = {**identity(run, overrides), "config_hash": digest, "setting_hash": setting_hash(params), "strategy_changes": strategy_changes(params)}
        outcome.summary.update(what_ran)
        _say_steps_set_by_the_trace(outcome, run, overrides)
        _say_unread_in_serving(outcome, run, overrides)
        names = run.names
        write_outputs(run_dir, outcome, names, trace_steps=run.output.trace_steps, timeline_steps=timeline_steps, drawer=drawer)
    if run.tracking.enabled:
        measured = {k: v for k, v in outcome.summary.items() if k not in what_ran}  # the config is logged as params
        try:
            early_tracking.log_run_or_mark(run.tracking, run_dir, measured, outcome.step_columns, params, names, what_ran["overrides"])
        except TrackingError as exc:  # the files are written: the caller says so and exits non-zero
            outcome.tracking_error = exc
        except Stopped as stopped:  # before the run was logged, or once it was (a stop waits for a store call)
            if str(run_dir) not in early_tracking.logged_run_dirs:
                from harness.tracking.store import later_command

                stopped.where = f"{run_dir} holds the finished run, not logged to MLflow: {later_command(run_dir, run.tracking)}"
            raise
    return outcome
