"""Command-line glue: check the overrides before Hydra starts, run the job, print the summary.

Hydra reports a bad override with a multi-line message and exit status 1; the harness promises one
line naming the key and the value, and exit status 2. So `preflight` composes the configuration
itself first (each value of a sweep in turn) and validates it; only then does Hydra take over.
"""
from __future__ import annotations

import importlib.util
import itertools
import logging
import math
import os
import re
import signal
import sys
import threading
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.sweep.compose_cache import compose_job
from harness.config.compose import to_run_config, with_optional_groups_added
from harness.config.messages import not_a_run_key, not_a_switch, one_line
from harness.config.paths import CONF_DIR
from harness.config.schema import RunConfig, flatten
from harness.base.files import check_folder
from harness.results.resume import what_a_sweep_simulates
from harness.base.errors import EXIT_TRACKING_FAILED, EXIT_WRITE_FAILED, ConfigError, HarnessError, fail, one_line_text
from harness.model.ops import check_memory
from harness.base.stopping import Stopped, leaves, stop_with
from harness.base.overrides import override_key, split_override

log = logging.getLogger(__name__)

# Hydra flags that take a value, and flags after which there is nothing to check.
# `--cfg job` prints the composed config: its overrides are checked as a run's are (a bad value printed the
# config and exited 0, an unknown preset took Hydra's many lines).
_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun", "--cfg", "-c", "--package", "-p"}
_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--version"}


def _is_multirun(argv: list[str]) -> bool:
    return any(arg in ("-m", "--multirun") or arg.replace(" ", "") == "hydra.mode=MULTIRUN" for arg in argv)


def _split_argv(argv: list[str]) -> tuple[list[str], str, bool]:
    """(overrides, config name, whether to check at all) from a Hydra command line."""
    overrides: list[str] = []
    config_name = "config"
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in _INFO_FLAGS:
            return [], config_name, False
        if name in _FLAGS_WITH_VALUE:
            if name in {"--config-name", "-cn"}:
                config_name = arg.split("=", 1)[1] if "=" in arg else argv[i + 1] if i + 1 < len(argv) else config_name
            if name in {"--config-path", "-cp", "--config-dir", "-cd", "--experimental-rerun"}:
                return [], config_name, False  # another config tree: Hydra's own checks apply
            i += 1 if "=" in arg else 2
            continue
        if not arg.startswith("-"):
            overrides.append(arg)
        i += 1
    return overrides, config_name, True


def normalize_argv(argv: list[str]) -> list[str]:
    """`experiment=x` → `+experiment=x`, so the README's and the templates' spelling both work; on Ray, a
    relative `hydra.sweep.dir` is anchored at the launch folder."""
    argv = with_optional_groups_added(argv)
    if "hydra/launcher=ray" in argv:
        argv = [_anchored_at_launch(arg) for arg in argv]
    return argv


def _anchored_at_launch(arg: str) -> str:
    """`hydra.sweep.dir=sw` → `hydra.sweep.dir=${hydra.runtime.cwd}/sw`: Hydra makes a job's folder absolute
    in the process that runs it, and a Ray worker runs in its node's folder (where `ray start` ran), so
    the jobs' files would land there while the sweep's results.csv looks for them here. conf/config.yaml's
    default folder is anchored the same way."""
    key, _, value = arg.partition("=")
    if override_key(key) != "hydra.sweep.dir" or not value.strip("'\"") or value.lstrip("'\"").startswith(("/", "~", "$")):
        return arg
    quote = value[0] if value[0] in "'\"" else ""
    return f"{key}={quote}${{hydra.runtime.cwd}}/{value[len(quote):]}"


def _sweep_axes(overrides: list[str]) -> tuple[list[str], list[tuple[int, str, list[str]]]]:
    """The command line as single values (each sweep at its first value; hydra.* blanked: Hydra's to
    check) and the sweeps: (position, key with its +/++/~, values)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    base: list[str] = []
    sweeps: list[tuple[int, str, list[str]]] = []
    for position, override in enumerate(parsed):
        if override.is_sweep_override() and not override.is_hydra_override():
            key = override.get_key_element()  # with its +, ++ or ~
            try:
                values = list(override.sweep_string_iterator())
            except Exception:  # interval sweeps (for optimisers) have no finite value list
                values = []
            base.append(f"{key}={values[0]}" if values else "")
            sweeps.append((position, key, values))
        elif override.is_hydra_override():
            base.append("")
        else:
            base.append(override.input_line)
    return base, sweeps


def override_variants(overrides: list[str]) -> list[list[str]]:
    """Single-valued override lists that together cover every value of every sweep."""
    base, sweeps = _sweep_axes(overrides)
    variants = [base]
    for position, key, values in sweeps:
        for value in values[1:]:
            variant = list(base)
            variant[position] = f"{key}={value}"
            variants.append(variant)
    return [[o for o in v if o] for v in variants]


# Combinations of a sweep checked one by one before the first job starts (~0.1 s each); beyond this,
# each value of each axis is checked, and a combination that fails stops only its own job.
MAX_CHECKED_COMBINATIONS = int(os.environ.get("HOSTBOUND_CHECK_COMBINATIONS", "64"))


def sweep_combinations(overrides: list[str]) -> tuple[list[list[str]], int]:
    """Every job's single-valued override list (as Hydra's basic sweeper makes them), and how many there
    are; when over MAX_CHECKED_COMBINATIONS, the per-axis variants instead."""
    _, sweeps = _sweep_axes(overrides)
    total = math.prod(max(1, len(values)) for _, _, values in sweeps)
    if total > MAX_CHECKED_COMBINATIONS:
        return override_variants(overrides), total
    return [job for job, _ in all_combinations(overrides)], total


def _unparsed(overrides: list[str], exc: Exception) -> str:
    """The line for overrides Hydra cannot parse, naming the one that fails (not the whole command line)."""
    message = one_line(exc)
    for override in overrides:
        try:
            sweep_combinations([override])
        except Exception as own:
            own_message = one_line(own)
            return own_message if own_message.startswith(override) else f"{override}: {own_message}"
    return f"cannot parse overrides {' '.join(overrides)!r}: {message}"


def preflight(argv: list[str]) -> None:
    """Compose and validate every configuration the command line asks for; exit 2 on the first bad one."""
    modes = sorted({arg.split("=", 1)[0] for arg in argv} & {"-m", "--multirun", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"})
    if len(modes) > 1:  # Hydra says so with a traceback
        fail(f"{' and '.join(modes)}: give one of -m/--multirun, --cfg, --info, --shell-completion")
    overrides, config_name, check = _split_argv(argv)
    if not check:
        return
    refused = not_a_run_key(overrides)
    if refused:
        fail(refused)
    try:
        variants, total = sweep_combinations(overrides)
        _, sweeps = _sweep_axes(overrides)
    except Exception as exc:
        fail(_unparsed(overrides, exc))
    for override in overrides:  # a group takes one preset a run (Hydra would merge a list's presets, the last winning)
        key, _, value = split_override(override)
        if key in ("hardware", "workload", "strategy", "engine", "experiment") and value.strip().startswith("["):
            fail(f"{override}: one {key} preset a run; for a sweep over them write {key}={value.strip()[1:-1]} with -m")
    if sweeps and not _is_multirun(argv):  # Hydra's own message takes six lines and names --multirun last
        position, key, _ = sweeps[0]
        group = override_key(key) in ("hardware", "workload", "strategy", "engine", "experiment")  # one preset a run: no list
        fail(
            f"{overrides[position]}: several values make a sweep: add -m (python -m harness -m {' '.join(overrides)})"
            + ("" if group else f"; for a list write {key}=[...]")
        )
    for position, key, _ in sweeps:
        if override_key(key).split(".")[0] == "tracking":
            # One parent run holds a sweep's jobs, in the experiment and store the sweep itself was composed
            # with (the first value): the others' jobs were logged under a parent of another experiment.
            fail(f"{overrides[position]}: tracking.* says where a sweep's runs go, one place for the whole sweep:"
                 " give one value (run one sweep per value)")
    if total > len(variants):
        print(f"hostbound: note: {total} combinations: each value of each axis is checked before the sweep;"
              " a combination that fails stops only its own job", file=sys.stderr)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        single = not _is_multirun(argv) and len(variants) == 1
        checked: set[str] = set()  # combinations that differ only in what check_run does not read (seed, dispatch, tracking, ...)
        for variant in variants:
            refused = not_a_switch(variant)
            if refused:
                fail(refused)
            try:
                cfg = compose_job(loader, config_name, variant)  # as compose() would, from the cache
                with open_dict(cfg):
                    del cfg["hydra"]
                run = to_run_config(cfg)  # every value checked, in every combination
                # of the strategy, what sets padding and graphs (their memory): not its dispatch
                padding = (run.strategy.graph, run.strategy.shape_buckets, run.strategy.kv_block)
                sizes = repr((run.workload, run.hardware, run.engine, padding))
                if not single and sizes not in checked:
                    check_run(run)
                    checked.add(sizes)
            except HarnessError as exc:
                fail(str(exc))
            except Exception as exc:
                # the job's single values: a bad item of a sweep is named, not the whole list (`=1,abc`)
                fail(one_line(exc, variant))
        hydra_overrides = [o for o in overrides if override_key(o).startswith(("hydra.", "hydra/"))]
        key = "hydra.sweep.dir" if _is_multirun(argv) else "hydra.run.dir"
        try:
            cfg = compose(config_name=config_name, overrides=variants[0] + hydra_overrides, return_hydra_config=True)
            folder = OmegaConf.select(cfg, key)
            resuming = bool(OmegaConf.select(cfg, "resume"))
        except Exception as exc:
            fail(one_line(exc, overrides))
        if _is_multirun(argv):
            check_launcher(cfg)
            try:
                check_intervals(overrides, cfg)
                check_job_folders(loader, config_name, overrides, hydra_overrides, cfg)
            except HarnessError as exc:
                fail(str(exc))
    try:
        # The run first: refused there, nothing is written, not even the dated folders its folder goes in
        # (check_output_folder's probe keeps those: runs started together share them). A run resumed from
        # an earlier one is checked, not built.
        if single:
            check_run(run, prepare=not resuming)
        if not any(arg.split("=", 1)[0] in ("--cfg", "-c") for arg in argv):  # printing the config writes nothing
            check_output_folder(key, folder, resuming)
        if resuming and _is_multirun(argv):
            check_same_sweep(folder, overrides)
    except HarnessError as exc:
        fail(str(exc))
    except Exception as exc:
        fail(one_line(exc, overrides))


_BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def check_intervals(overrides: list[str], cfg: DictConfig) -> None:
    """`interval(a,b)` is a range an optimising sweeper draws from: the basic sweeper has no list of values
    for it, and Hydra said so in a 16-line traceback, after the sweep's folder and a FAILED parent run."""
    from hydra.core.override_parser.types import ValueType

    sweeper = str(OmegaConf.select(cfg, "hydra.sweeper._target_", default="") or "")
    if sweeper and sweeper != _BASIC_SWEEPER:
        return
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.value_type == ValueType.INTERVAL_SWEEP and not override.is_hydra_override():
            raise ConfigError(f"{override.input_line}: an interval needs an optimising sweeper (hydra/sweeper=optuna); list the values")


def all_combinations(overrides: list[str]):
    """(every job's single-valued override list, its swept values), in the basic sweeper's order (its job numbers)."""
    base, sweeps = _sweep_axes(overrides)
    for chosen in itertools.product(*[[f"{key}={value}" for value in values] or [""] for _, key, values in sweeps]):
        job = list(base)
        for (position, _, _), override in zip(sweeps, chosen):
            job[position] = override
        yield [o for o in job if o], [o for o in chosen if o]


def check_job_folders(loader, config_name: str, overrides: list[str], hydra_overrides: list[str], cfg: DictConfig) -> None:
    """Each job of a sweep has a folder of its own: a hydra.sweep.subdir that resolves to the same folder
    for two jobs (`${hydra.runtime.choices.strategy}` over batch sizes) made them overwrite each other's
    files, and results.csv held one row of the two. A subdir that names the job's number is unique as is;
    any other is resolved for every combination (~3-6 ms each, composed from the cache: seconds for a
    sweep of a thousand jobs, once, before the first)."""
    node = cfg.hydra.sweep._get_node("subdir")
    raw = str(node._value()) if node is not None else ""
    if re.search(r"hydra[.:]job\.(num|id)\b", raw):
        return
    if str(OmegaConf.select(cfg, "hydra.sweeper._target_", default="") or "") not in ("", _BASIC_SWEEPER):
        return  # an optimiser's jobs are its trials, not the product of the axes
    pattern = raw.replace("${hydra:", "${hydra.")  # the same node: the composed config holds hydra's (no HydraConfig here)
    seen: dict[str, tuple[int, list[str]]] = {}
    for num, (job, swept) in enumerate(all_combinations(overrides)):
        job_cfg = compose_job(loader, config_name, job + hydra_overrides)
        with open_dict(job_cfg.hydra):
            job_cfg.hydra.job.num = num
            job_cfg.hydra.job.id = num
            job_cfg.hydra.sweep.subdir = pattern
        subdir = os.path.normpath(str(OmegaConf.select(job_cfg, "hydra.sweep.subdir")))
        if subdir in seen:
            first, earlier = seen[subdir]
            raise ConfigError(
                f"hydra.sweep.subdir={raw}: jobs {first} ({' '.join(earlier)}) and {num} ({' '.join(swept)}) both resolve to"
                f" {subdir}, where one would overwrite the other: give each job its own folder (e.g. add ${{hydra.job.num}})"
            )
        seen[subdir] = (num, swept)


# Launchers whose plugin comes with an extra (pyproject.toml), by the module their config's _target_ names.
_LAUNCHER_EXTRAS = {"hydra_plugins.hydra_ray_launcher": "cluster", "hydra_plugins.hydra_submitit_launcher": "cluster"}


def check_launcher(cfg: DictConfig) -> None:
    """The chosen launcher's plugin is installed (otherwise Hydra fails with a traceback after the sweep's
    folder and parent run exist)."""
    target = str(OmegaConf.select(cfg, "hydra.launcher._target_", default="") or "")
    if target == "hydra_plugins.hostbound_launcher.HostboundLauncher":
        from harness.sweep.launcher import check_n_jobs

        try:
            check_n_jobs(OmegaConf.select(cfg, "hydra.launcher.n_jobs"))
        except HarnessError as exc:
            fail(str(exc))
    module = target.rpartition(".")[0]
    if not module or module.startswith("hydra._internal"):
        return
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:  # its package is missing, or broken
        found = False
    if not found:
        choice = OmegaConf.select(cfg, "hydra.runtime.choices", default={}).get("hydra/launcher", "?")
        extra = next((e for prefix, e in _LAUNCHER_EXTRAS.items() if module.startswith(prefix)), None)
        hint = f": pip install -e '.[{extra}]'" if extra else ""
        fail(f"hydra/launcher={choice}: its plugin ({module}) is not installed{hint}")


def check_output_folder(key: str, folder: object, resuming: bool = False) -> None:
    """The run's (or sweep's) folder can be made and written, and holds nothing yet, before Hydra makes
    it (Hydra's own failure there is a traceback, after it may have written part of the folder). With
    `resume=true` a folder that holds files is the point: an interrupted sweep is finished in it."""
    check_folder(
        key, folder, empty=not resuming,
        why_empty="a run never writes into another's folder: pick a new one, empty it, or add resume=true to finish an interrupted sweep there",
    )


def check_same_sweep(folder: object, overrides: list[str]) -> None:
    """`resume=true` finishes the sweep a folder holds: a sweep of other overrides there would overwrite
    its jobs' folders and its multirun.yaml, and its results.md would mix the two."""
    recorded = Path(str(folder)) / "multirun.yaml"
    if not recorded.is_file():
        return
    try:
        earlier = list(OmegaConf.select(OmegaConf.load(recorded), "hydra.overrides.task", default=[]) or [])
    except Exception:  # not Hydra's file: nothing to compare with
        return
    before, now = _sweep_identity([str(o) for o in earlier]), _sweep_identity(overrides)
    if before != now:
        raise ConfigError(
            f"hydra.sweep.dir={folder}: holds a sweep of other overrides ({' '.join(before) or 'none'}); resume=true finishes"
            f" that sweep: run this one ({' '.join(now) or 'none'}) in a new folder"
        )


def _sweep_identity(overrides: list[str]) -> list[str]:
    """What decides a sweep's jobs and their numbers: its single values in any order (sorted), then its
    axes in their order (the order numbers the jobs and names their folders: the same axes swapped put
    other jobs in those folders)."""
    kept = what_a_sweep_simulates(overrides)
    try:
        _, sweeps = _sweep_axes(kept)
    except Exception:  # not parseable as overrides: compared as written
        return kept
    axes = {position for position, _, _ in sweeps}
    return sorted(o for i, o in enumerate(kept) if i not in axes) + [kept[i] for i in sorted(axes)]


def check_run(run: RunConfig, prepare: bool = False) -> None:
    """What can fail before simulating: the model card or trace file, whether the run's arrays fit in
    this machine's memory (checked first, from a one-step build) and whether the rank fits in HBM (for
    serving: at max_batch sequences of mean prompt + output length, whatever batches the requests make).
    `prepare`: build the run itself to check it, and hand it to this process's simulation of it (a single
    run: built once); otherwise a sweep's combinations are checked from the strategy's workload and plan
    (its graphs' memory included, as the run's own check counts it), without simulating."""
    from harness.sim.policies import prepare as plan_steps
    from harness.sim.simulate import check_size, hand_over, is_op_list, prepare_run

    serving = run.workload.serving
    if prepare and not serving.enabled:
        hand_over(run, prepare_run(run))
        return
    if not is_op_list(run):
        check_size(run)
    batch, kv = np.full(run.workload.steps, run.workload.batch_size, dtype=np.int64), None
    if serving.enabled:
        batch = np.full(run.workload.steps, serving.max_batch, dtype=np.int64)
        kv = np.full(run.workload.steps, float(serving.prompt_len_mean + serving.output_len_mean))
    workload, _ = plan_steps(run, batch, kv)
    if is_op_list(run):
        check_size(run, workload)
    check_memory(workload, run.hardware.device.hbm_gb, run.workload)
    if prepare:
        hand_over(run, prepare_run(run))


def _end_runs_on_sigterm() -> None:
    """SIGTERM to a job in a process of its own (a joblib or Ray launcher's worker) unwinds instead of dying on the spot: an open
    MLflow run ends FAILED, not RUNNING forever (between store calls: harness.base.stopping). A handler
    already there (the command's, harness.base.stopping; a worker's of ours) stays."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def stop(signum: int, frame: object) -> None:
            stop_with(SystemExit(128 + signum))

        signal.signal(signal.SIGTERM, stop)


def run_from_hydra(cfg: DictConfig) -> float:
    """The body of the @hydra.main task: validate, run, print; returns throughput (for optimisers)."""
    _end_runs_on_sigterm()
    try:
        throughput = _run_job(cfg)
        if HydraConfig.get().mode != RunMode.MULTIRUN:  # a sweep's stop line speaks for all its jobs
            leaves(f"{HydraConfig.get().runtime.output_dir} holds the finished run")
        return throughput
    except Stopped as stopped:  # the stop's line says what the run's folder holds
        from harness.results.outputs import SUMMARY_FILE

        run_dir = Path(HydraConfig.get().runtime.output_dir)
        if not stopped.where and (run_dir / SUMMARY_FILE).exists():
            stopped.where = f"{run_dir} holds the finished run"
        elif not stopped.where and run_dir.exists():
            stopped.where = f"{run_dir} holds an unfinished run (no {SUMMARY_FILE}: reports and resume=true skip it)"
        raise


def _run_job(cfg: DictConfig) -> float:
    from harness.results.outputs import format_summary
    from harness.cli.job import execute
    from harness.base.files import WriteError

    if HydraConfig.get().mode == RunMode.MULTIRUN:  # a job run again: its failure of before is not this run's
        from harness.sweep.callbacks import clear_failed_job

        clear_failed_job(Path(HydraConfig.get().runtime.output_dir))
    try:
        run = to_run_config(cfg)
        run.output.timeline_steps = run.output.steps_drawn(in_sweep=HydraConfig.get().mode == RunMode.MULTIRUN)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        params = flatten(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
        params["output.timeline_steps"] = run.output.timeline_steps  # what was drawn, not null
        from harness.tracking.store import launch_dir

        outputs_dir = launch_dir() / "outputs"
        outcome = execute(run, run_dir, params, tuple(HydraConfig.get().overrides.task), outputs_dir=outputs_dir)
    except HarnessError as exc:
        if HydraConfig.get().mode == RunMode.MULTIRUN:  # the other jobs go on; the sweep reports it at its end
            from harness.sweep.callbacks import mark_failed_job

            mark_failed_job(Path(HydraConfig.get().runtime.output_dir), one_line_text(str(exc)))
            return math.nan
        fail(str(exc))
    except WriteError as exc:
        fail(str(exc.strerror), EXIT_WRITE_FAILED)
    if run.output.print_summary:
        names = run.names
        print(format_summary(outcome.summary, names, run_dir))
        if outcome.resumed_from is not None:
            print(f"  resumed      already finished in {outcome.resumed_from} (resume=true): not simulated or logged again")
    if outcome.tracking_error:
        from harness.tracking.store import FAILED_ENV

        if HydraConfig.get().mode == RunMode.MULTIRUN:  # the sweep goes on without the store and says so at its end
            os.environ[FAILED_ENV] = outcome.tracking_error.reason
            log.warning("%s", outcome.tracking_error)
        else:
            fail(str(outcome.tracking_error), EXIT_TRACKING_FAILED)
    return float(outcome.summary["throughput_tok_s"])
