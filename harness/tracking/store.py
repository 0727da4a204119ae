"""MLflow tracking: one MLflow run per harness run, as an index over the run directory's files.

Default store: an sqlite database outputs/mlflow.db under the launch directory, artifacts in
outputs/mlartifacts — no server needed; `mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db`
opens it. Params are the values chosen (presets, sizes, seed, what the command line set: chosen_params),
metrics the summary's numbers under grouped names (metric_name) and the per-step series, tags the preset
names and the overrides, artifacts the run directory's files (by default all but trace.json, which stays
in the folder the run_dir tag names: `tracking.artifacts`) and the whole resolved config.

A store that is down or refuses the run never costs the simulation: the run keeps its files, says in one
line that tracking failed, leaves TRACKING_FAILED.txt in its folder and exits with status 3 (a sweep: once,
at its end). Each request waits at most `tracking.timeout_s`, without retries (MLflow's
MLFLOW_HTTP_REQUEST_MAX_RETRIES / MLFLOW_HTTP_REQUEST_TIMEOUT win when set). Logged later with

    python -m harness.tracking log RUN_DIR [RUN_DIR ...] [--uri URI] [--experiment NAME]

which skips runs the store already holds (same run_dir tag).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping

import numpy as np
from omegaconf import OmegaConf

from harness.config.messages import one_line
from harness.config.schema import ArtifactPolicy, TrackingConfig, flatten, sqlite_path, unflatten
from harness.base.errors import HarnessError, TrackingError
from harness.base.files import write_text
from harness.results.resume import setting_hash, strategy_changes
from harness.results.outputs import ARTIFACTS_FOLDER, LATENCY_SHOWN, STEPS_FILE, SUMMARY_FILE, TRACE_FILE, WHERE_THINGS_GO, read_steps, run_notes, short_setting
from harness.sim.outcome import UNREAD_IN_SERVING, WHAT_RAN_KEYS, WHAT_RAN_PARAMS
from harness.base.stopping import store_call
from harness.base.overrides import split_override

log = logging.getLogger(__name__)


def mlflow_module():
    """MLflow, imported on first use (about 1 s, so only when a run is tracked), with its telemetry off:
    it would otherwise phone home, and the harness runs without network."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    mlflow_logger = logging.getLogger("mlflow")
    if not any(isinstance(h, _MlflowLogRouter) for h in mlflow_logger.handlers):
        mlflow_logger.handlers[:] = [_MlflowLogRouter()]
        mlflow_logger.propagate = False
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.listen(Engine, "before_cursor_execute", _bounded_busy_wait, retval=True)
        event.listen(Engine, "do_connect", _bounded_connect)
        import mlflow.store.db.utils as db_utils

        # MLflow makes a database store's engine up to 10 times with backoff (~100 s against a database that
        # is down, twice a run: opening and logging): one try, each connection waiting tracking.timeout_s.
        db_utils.MAX_RETRY_COUNT = 1
    return mlflow


_MLFLOW_BUSY_WAIT = "PRAGMA busy_timeout = 20000;"  # MLflow 3.17's, for every session on a sqlite store
_busy_wait_ms = 5000  # tracking.timeout_s, set by bound_requests
# The connect-timeout argument (whole seconds) of the database drivers that take one: a database host that
# drops packets held a run for the driver's own wait (none for psycopg2: the OS's, minutes).
_CONNECT_TIMEOUT_ARG = {"psycopg2": "connect_timeout", "psycopg": "connect_timeout", "pymysql": "connect_timeout", "mysqldb": "connect_timeout"}


def _bounded_connect(dialect, conn_rec, cargs, cparams) -> None:
    """Each new connection to a database store waits at most tracking.timeout_s (a value in the URI wins)."""
    argument = _CONNECT_TIMEOUT_ARG.get(str(getattr(dialect, "driver", "")).lower())
    if argument:
        cparams.setdefault(argument, max(1, math.ceil(_busy_wait_ms / 1000)))


def _bounded_busy_wait(conn, cursor, statement: str, parameters, context, executemany):
    """A locked sqlite store (another process writing, or one that died holding the lock) made each write
    wait MLflow's 20 s busy timeout, past tracking.timeout_s: the wait is tracking.timeout_s instead."""
    if statement == _MLFLOW_BUSY_WAIT:
        statement = f"PRAGMA busy_timeout = {_busy_wait_ms};"
    return statement, parameters


RESOLVED_CONFIG_FILE = "resolved_config.yaml"  # an MLflow run's artifact: the whole config, interpolations resolved
RUN_LOG_FILE = "hostbound.log"  # the run folder's log (Hydra's job log: hydra.job.name in conf/config.yaml)


class _MlflowLogRouter(logging.Handler):
    """Where MLflow's own log records go. A store that refuses a write (read-only, locked) made MLflow
    log an ERROR with the SQL and a traceback, ~90 lines on the terminal above the harness's one line
    that says the same. While a run is logged (`mlflow_log_into`) they go, whole, to that run folder's
    hostbound.log; otherwise only warnings and errors reach the terminal, one line each."""

    target: Path | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.target is not None:
                text = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s").format(record)
                with open(self.target, "a") as log_file:
                    log_file.write(text + "\n")
            elif record.levelno >= logging.WARNING:
                sys.stderr.write(f"mlflow: {record.levelname.lower()}: {one_line(record.getMessage())[:300]}\n")
        except Exception:  # a log line must never fail the logging of a run
            pass


@contextlib.contextmanager
def mlflow_log_into(run_dir: Path):
    """MLflow's log records into `run_dir`'s hostbound.log while the block runs (see _MlflowLogRouter)."""
    routers = [h for h in logging.getLogger("mlflow").handlers if isinstance(h, _MlflowLogRouter)]
    before = [router.target for router in routers]
    for router in routers:
        router.target = Path(run_dir) / RUN_LOG_FILE
    try:
        yield
    finally:
        for router, target in zip(routers, before):
            router.target = target


MAX_PARAM_CHARS = 6000  # MLflow 3 rejects longer param values
# A sweep's parent run id, in the sweep directory (harness.sweep.callbacks writes it before the jobs start): a
# job's run is logged as its child.
PARENT_FILE = "mlflow_parent_run_id"
# The keys a sweep varies (one a line), in the sweep directory next to PARENT_FILE: a job's run name
# leads with their values.
SWEPT_FILE = "swept_keys"


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
    """sqlite:/// and the store's path, percent-encoded: a folder named `a#b`, `a?b` or `a%20b` would
    otherwise be read as a fragment, a query or an escape, and the store land elsewhere."""
    return sqlite_uri(launch_dir() / "outputs" / "mlflow.db")


def sqlite_uri(path: Path) -> str:
    """Only the characters a URL parser would take for something else are escaped: MLflow makes the
    database's folder from the URI as written, so every escape there makes a stray empty folder too
    (`ensure_experiment` removes it)."""
    text = str(Path(path).absolute())
    return "sqlite:///" + text.replace("%", "%25").replace("#", "%23").replace("?", "%3F")


FAILED_FILE = "TRACKING_FAILED.txt"
# Set in a sweep's process (and inherited by its workers) once the store failed: later jobs do not wait on it again.
FAILED_ENV = "HOSTBOUND_TRACKING_FAILED"


def bound_requests(tracking: TrackingConfig) -> None:
    """Each HTTP request to a tracking server waits at most tracking.timeout_s, and is not retried
    (MLflow's default: 7 retries with backoff, minutes against a server that is down); a write to a
    locked sqlite store waits at most as long (MLflow's own wait: 20 s a write)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, math.ceil(tracking.timeout_s))))
    global _busy_wait_ms
    _busy_wait_ms = int(tracking.timeout_s * 1000)


def short_reason(exc: BaseException) -> str:
    """Why a store failed, in a few words: MLflow wraps a refused connection in three paragraphs."""
    text = one_line(exc)
    if m := re.search(r"\((?:sqlite3|psycopg2?|pymysql|MySQLdb|pyodbc)\.\w+\) ([^;\[]+)", text):  # a database's own words
        return m[1].strip() + (" (another process holds its write lock; waited tracking.timeout_s)" if "locked" in m[1] else "")
    if m := re.search(r"\[Errno -?\d+\] ([^'\")\];]+)", text):
        return m[1].strip()
    if "timed out" in text.lower() or "timeout" in text.lower():
        return "no answer in time (tracking.timeout_s)"
    return text[:300]


def later_command(folder: Path, tracking: TrackingConfig) -> str:
    """The command that logs a run's folder (or a sweep's jobs) once the store is back."""
    uri = f" --uri {shlex.quote(tracking.uri)}" if tracking.uri else ""
    experiment = f" --experiment {shlex.quote(tracking.experiment)}" if tracking.experiment != "hostbound" else ""
    return f"python -m harness.tracking log {shlex.quote(str(folder))}{uri}{experiment}"


def log_run_or_mark(
    tracking: TrackingConfig, run_dir: Path, summary: dict, steps: Mapping[str, np.ndarray], params: dict, names: dict, overrides: str = ""
) -> str:
    """log_run, but a failure of the store becomes TrackingError (one line) and TRACKING_FAILED.txt in
    the run folder, which says why and how to log the run later."""
    failed = os.environ.get(FAILED_ENV)
    if failed:
        reason = failed
    else:
        bound_requests(tracking)
        try:
            mlflow_module()
            with mlflow_log_into(run_dir):
                return log_run(tracking, run_dir, summary, steps, params, names, overrides)
        except Exception as exc:  # anything the store or the network raises: the files are what matters
            reason = f"tracking.uri={resolve_uri(tracking)}: {short_reason(exc)}"
    command = later_command(run_dir, tracking)
    write_text(run_dir / FAILED_FILE, f"{reason}\nlog this run later with:\n  {command}\n")
    raise TrackingError(f"tracking failed, the run's files are kept ({reason}); log it later: {command}", reason)


def resolve_uri(tracking: TrackingConfig) -> str:
    return tracking.uri or default_uri()


# MLflow 3's UI opens an experiment without this tag in its GenAI view (traces, an assistant); with it,
# in the runs table and the compare view that a sweep needs.
EXPERIMENT_KIND_TAG = ("mlflow.experimentKind", "custom_model_development")
# MLflow 3.17's UI opens an experiment on its GenAI overview whatever that tag says (a browser-side
# "workflow type", GenAI by default) and shows no metric column until chosen. A shared view (an experiment
# tag the UI reads as `?viewStateShareKey=`) picks the runs table's columns: view_url opens both.
HEADLINE_VIEW = "hostbound"
# The figures a user compares runs by. MLflow's views sort metric names as text (the compare page's table,
# the column picker) and group them by what comes before a "/" (the chart sections): these go first, as
# headline/<key>; the critical-path and task-time shares each in a group of their own; the rest in other/.
HEADLINE_METRICS = (
    "throughput_tok_s", "step_ms_p50", "step_ms_p99", "step_ms_mean", "bubble_ratio", "ttft_ms", "median_ttft_ms", "median_tpot_ms",
    "p99_ttft_ms", "p99_tpot_ms",
)
_METRIC_GROUPS = (("breakdown_", "path_share/"), ("time_share_", "time_share/"))
# Per-step series, not summary figures: MLflow's runs table shows a series' last value, which a plain
# `step_ms` beside `step_ms_mean` passed off as the run's step time (a serving run's last step: 69.6 ms
# against a mean of 18.2). Measured steps and the rest (warm-up, graph builds) apart.
STEP_SERIES, WARMUP_SERIES = "series/step_ms", "series/warmup_step_ms"
OLD_SERIES = ("step_ms", "warmup_step_ms")  # their names in stores written before
HEADLINE_COLUMNS = (
    "attributes.`Run Name`", *(f"metrics.`headline/{key}`" for key in ("throughput_tok_s", "step_ms_p50", "step_ms_p99", "bubble_ratio")),
    "tags.`bound`", *(f"metrics.`headline/{key}`" for key in LATENCY_SHOWN),
)
VIEW_TAG = (f"mlflow.sharedViewState.{HEADLINE_VIEW}", json.dumps({"selectedColumns": list(HEADLINE_COLUMNS)}))


def _logging_order(item: tuple[str, float]) -> tuple:
    """MLflow's run page lists a run's metrics as they were logged, and its compare page plots the first:
    the headline ones first, throughput leading (HEADLINE_METRICS' order), then the rest by name."""
    name = item[0]
    key = name.removeprefix("headline/")
    return (0, HEADLINE_METRICS.index(key), "") if name.startswith("headline/") and key in HEADLINE_METRICS else (1, 0, name)


def metric_name(key: str) -> str:
    """The MLflow metric of a summary key: `headline/throughput_tok_s`, `path_share/launch` (breakdown_launch),
    `time_share/launch`, `other/device_busy`."""
    if key in HEADLINE_METRICS:
        return f"headline/{key}"
    for prefix, group in _METRIC_GROUPS:
        if key.startswith(prefix):
            return group + key.removeprefix(prefix)
    return f"other/{key}"


def summary_key(metric: str) -> str:
    """The summary key of an MLflow metric, from this harness's runs (grouped names) and older ones (the
    summary's own names) alike; the step series keep their names (`series/step_ms`; `step_ms` before)."""
    group, slash, name = metric.partition("/")
    if not slash:
        return metric
    for prefix, grouped in _METRIC_GROUPS:
        if grouped == group + "/":
            return prefix + name
    return name


def view_url(server: str, experiment_id: str) -> str:
    """The MLflow UI's page of an experiment's runs table with the headline columns (the runs, not the
    GenAI overview)."""
    return f"{server.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={HEADLINE_VIEW}"
# Group choices are in a run's name already.
_GROUP_CHOICES = {"hardware", "workload", "strategy", "engine"}


@contextlib.contextmanager
def store_lock(uri: str):
    """Hold `<database>.lock` (an exclusive flock) while a sqlite store is made, migrated and given its
    experiment: processes started together on a new store used to migrate it at once and die
    ("duplicate column name", "Online migration expected to match one row"). Other stores: no lock
    (a server serialises its own database)."""
    database = sqlite_path(uri)
    if database is None:
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(database.with_name(database.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_experiment_ids: dict[tuple[str, str], str] = {}  # (uri, experiment) → id, once per process


def ensure_experiment(tracking: TrackingConfig) -> str:
    """Create the store and the experiment if needed, under the store's lock (safe from any number of
    processes at once); once per process and store (a sweep's jobs asked for every run)."""
    uri = resolve_uri(tracking)
    key = (uri, tracking.experiment)
    if key not in _experiment_ids:
        with store_call(), store_lock(uri):
            _experiment_ids[key] = _ensure_experiment(tracking, uri)
    return _experiment_ids[key]


def _ensure_experiment(tracking: TrackingConfig, uri: str) -> str:
    mlflow = mlflow_module()

    mlflow.set_tracking_uri(uri)
    with _no_stray_folders(uri):  # MLflow opens (and may make) the store here
        experiment = mlflow.get_experiment_by_name(tracking.experiment)
    _write_ahead_log(uri)
    if experiment is not None:
        for key, value in (EXPERIMENT_KIND_TAG, VIEW_TAG):
            if experiment.tags.get(key) != value:  # made by an older harness
                mlflow.MlflowClient().set_experiment_tag(experiment.experiment_id, key, value)
        return experiment.experiment_id
    artifact_location = None
    if tracking.uri is None:
        artifact_location = (launch_dir() / "outputs" / ARTIFACTS_FOLDER).as_uri()
    return mlflow.create_experiment(tracking.experiment, artifact_location=artifact_location, tags=dict([EXPERIMENT_KIND_TAG, VIEW_TAG]))


def _write_ahead_log(uri: str) -> None:
    """Put a sqlite store in write-ahead-log mode (kept in the file): a run's commits cost one fsync
    instead of several (~15 ms of a sweep job's ~60 ms of logging), and readers (the UI, other jobs) no
    longer block writers. A store another program holds open stays as it is."""
    import sqlite3

    database = sqlite_path(uri)
    if database is None:
        return
    try:
        with contextlib.closing(sqlite3.connect(database, timeout=1)) as connection:
            connection.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error as exc:
        log.debug("%s stays in its journal mode: %s", database, exc)


@contextlib.contextmanager
def _no_stray_folders(uri: str):
    """MLflow makes the parent folder of a sqlite URI's path without decoding its escapes
    (`a%23b/outputs` beside `a#b/outputs`): remove the empty folders it made that way."""
    written = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else ""
    database = sqlite_path(uri)
    stray = Path(written).parent if written and database is not None and Path(written) != database else None
    new = [p for p in ([stray, *stray.parents] if stray else []) if not p.exists()]
    try:
        yield
    finally:
        for folder in new:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break


def name_parts(names: dict, overrides: str, swept: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    """(what varies, what is fixed) of a run's name: each preset (workload, strategy, hardware, engine
    unless none) by its name and each value set on top by its last key part (`batch_size=8`), those
    whose key is in `swept` (the keys its sweep varies) in the first list, in command-line order."""
    varying: dict[str, str] = {}
    fixed = []
    for override in overrides.split():
        key, _, value = split_override(override)
        if key.startswith(WHERE_THINGS_GO) or (key in _GROUP_CHOICES and key not in swept):
            continue
        part = names.get(key, value) if key in _GROUP_CHOICES else short_setting(key, value)
        if key in swept:
            varying[key] = part
        else:
            fixed.append(part)
    presets = [names[k] for k in ("workload", "strategy", "hardware", "engine") if k not in varying and names.get(k, "none") != "none"]
    return list(varying.values()), presets + fixed


def run_name(names: dict, overrides: str = "", swept: frozenset[str] = frozenset()) -> str:
    """`workload·strategy·hardware[·engine]` and the values set on top, e.g. `llama2_7b_decode·pipeline·
    atlas_a2·batch_size=8`; a sweep's job leads with what its sweep varies (`acl_graph·qwen3_30b_decode·
    atlas_a2`), which the UI's table then shows where it cuts a long name."""
    varying, fixed = name_parts(names, overrides, swept)
    return "·".join(varying + fixed)[:250]


def artifact_files(run_dir: Path, policy: ArtifactPolicy) -> list[Path]:
    """The run directory's top-level entries MLflow stores under `policy`."""
    if policy == ArtifactPolicy.none:
        return []
    entries = sorted(e for e in run_dir.iterdir() if e.name != FAILED_FILE)
    if policy == ArtifactPolicy.all:
        return entries
    return [entry for entry in entries if entry.name != TRACE_FILE]


def log_run(
    tracking: TrackingConfig, run_dir: Path, summary: dict, steps: Mapping[str, np.ndarray], params: dict, names: dict, overrides: str = "",
    *, parent: str | None = None, swept: frozenset[str] | None = None,
) -> str:
    """Log one run; returns its MLflow run id. `parent` and `swept`: its sweep's parent run and swept keys,
    when known (the log command reads them from the sweep's folder); otherwise Hydra's context says."""
    mlflow = mlflow_module()
    from mlflow.entities import Metric, Param
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.utils.uri import add_databricks_profile_info_to_artifact_uri

    experiment_id = ensure_experiment(tracking)
    metrics = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    metrics = {metric_name(k): v for k, v in metrics.items() if math.isfinite(v)}
    # The folder with its links resolved: the run's own logging and a later `log` through another path to it
    # (a symlink) name it the same, so already_logged finds it either way.
    tags = {**names, "bound": summary["bound"], "run_dir": str(Path(run_dir).resolve())}
    if overrides:  # the same record of what was swept that a run folder keeps (.hydra/overrides.yaml)
        tags["overrides"] = overrides
    if params:  # summary.json's, from the same resolved config: a report finds each run's eager run by it
        tags["setting_hash"] = setting_hash(params)
        tags["strategy_changes"] = strategy_changes(params)
    notes = run_notes(summary)
    if notes:  # the summary's words (captures, fallbacks, warnings) are not metrics
        tags["notes"] = notes
    logged = artifact_files(run_dir, tracking.artifacts)
    left = sorted({entry.name for entry in run_dir.iterdir()} - {entry.name for entry in logged})
    if left:
        tags["files_only_in_run_dir"] = " ".join(left)
    parent = parent or parent_run_id()
    if parent:
        tags["mlflow.parentRunId"] = parent  # shows the job nested under its sweep in the UI
    # One client, one batch (params, summary metrics and step series together; MLflow splits it into
    # requests of its own limits), files last: a sweep's job paid ~0.13 s for one call per kind before.
    with store_call():  # a stop (SIGTERM) waits for the run to be logged or ended FAILED: see harness.base.stopping
        client = mlflow.MlflowClient(tracking_uri=resolve_uri(tracking))
        tags = resolve_tags(tags)  # user and source, as mlflow.start_run adds them
        started_ms, ended_ms = run_times_ms(run_dir, float(summary.get("sim_wall_s", 0.0)))
        name = run_name(names, overrides, swept_keys() if swept is None else swept)
        created = client.create_run(experiment_id, start_time=started_ms, run_name=name, tags=tags).info
        run_id = created.run_id
        try:
            now_ms = int(time.time() * 1000)
            # Measured steps and the rest (warm-up, graph builds) apart: a 3 s build step at step 0 would
            # squash the measured series into a flat line.
            series = [
                Metric(STEP_SERIES if measured else WARMUP_SERIES, float(latency), now_ms, int(step))
                for step, latency, measured in zip(steps["step"], steps["latency_ms"], steps["measured"])
            ]
            client.log_batch(
                run_id,
                metrics=[Metric(key, value, now_ms, 0) for key, value in sorted(metrics.items(), key=_logging_order)] + series,
                params=[Param(key, param_value(value)) for key, value in chosen_params(params, names, overrides).items()],
            )
            # The run's artifact store from the run just made: the client would look the run up again first
            # (~7 ms, its 120 params and 50 metrics loaded with it).
            artifacts = get_artifact_repository(
                add_databricks_profile_info_to_artifact_uri(created.artifact_uri, client.tracking_uri), tracking_uri=client.tracking_uri
            )
            for entry in logged:
                if entry.is_dir():
                    artifacts.log_artifacts(str(entry), entry.name)
                else:
                    artifacts.log_artifact(str(entry))
            with tempfile.TemporaryDirectory() as folder:  # every key's value, where the params hold the chosen ones
                resolved = Path(folder) / RESOLVED_CONFIG_FILE
                resolved.write_text(OmegaConf.to_yaml(OmegaConf.create(unflatten(params))))
                artifacts.log_artifact(str(resolved))
        except BaseException:  # a failed store, or Ctrl-C: the run must not stay RUNNING
            with contextlib.suppress(Exception):
                client.set_terminated(run_id, status="FAILED")
            raise
        client.set_terminated(run_id, status="FINISHED", end_time=ended_ms)
    log.info("logged MLflow run %s to %s", run_id, resolve_uri(tracking))
    return run_id


def run_times_ms(run_dir: Path, simulated_s: float = 0.0) -> tuple[int | None, int | None]:
    """When the run started and finished (ms since the epoch), for MLflow's Duration column: Hydra writes
    .hydra/config.yaml as the job starts, summary.json is written last; a single run's checks before
    Hydra already build the run, so its simulation (`sim_wall_s`) can have begun earlier, and the start is
    then taken from it (`simulated_s`, the summary's sim_wall_s; the Duration had been shorter than the
    simulation). (None, None) without both files: MLflow then takes the time of logging, which measured
    the logging (~50 ms), not the run."""
    try:
        started = (run_dir / ".hydra" / "config.yaml").stat().st_mtime
        ended = (run_dir / SUMMARY_FILE).stat().st_mtime
    except OSError:
        return None, None
    started = min(started, ended - simulated_s)
    return (int(started * 1000), int(ended * 1000)) if ended >= started else (None, None)


def chosen_params(params: Mapping[str, object], names: dict, overrides: str) -> dict[str, object]:
    """The params MLflow gets, out of the flattened resolved config: the presets chosen (`hardware`,
    `workload`, `strategy`, `engine`, and `experiment` when one ran), the sizes and seed that say what ran
    (WHAT_RAN_PARAMS; a serving run's request stream, which sets its batches), each key the command line
    set (all keys under one set whole) and each key its experiment preset sets, where files and runs go
    aside. Tens of params, not the config's ~120, which buried what differs in the compare view;
    RESOLVED_CONFIG_FILE has them all."""
    from harness.config.compose import experiment_keys  # here: Hydra's modules load for logging a run, not for reading a store

    chosen: dict[str, object] = {key: names[key] for key in ("hardware", "workload", "strategy", "engine") if key in names}
    chosen.update({param: params[param] for param in WHAT_RAN_PARAMS.values() if param in params})
    set_keys = []
    for override in overrides.split():
        key, _, value = split_override(override)
        if key == "experiment":
            chosen["experiment"] = value
            set_keys += sorted(experiment_keys(value))
        elif key and key not in _GROUP_CHOICES and not key.startswith(WHERE_THINGS_GO):
            set_keys.append(key)
    if params.get("workload.serving.enabled") is True:
        set_keys.append("workload.serving")
    for key in set_keys:
        chosen.update({k: v for k, v in params.items() if k == key or k.startswith(f"{key}.")})
    if params.get("workload.serving.enabled") is True:
        for key in UNREAD_IN_SERVING:
            chosen.pop(f"workload.{key}", None)
    return chosen


def param_value(value: object) -> str:
    text = str(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."


def swept_keys() -> frozenset[str]:
    """The keys this process's sweep varies (SWEPT_FILE), when it runs a job of a multirun with tracking."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
            return frozenset()
        path = Path(HydraConfig.get().sweep.dir) / SWEPT_FILE
        return frozenset(path.read_text().split()) if path.exists() else frozenset()
    except Exception:  # no Hydra context
        return frozenset()


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


# ---------------------------------------------------------------- logging a run later


def read_run_dir(run_dir: Path) -> tuple[dict, dict[str, np.ndarray], dict, dict, str]:
    """(measured summary, steps, params, names, overrides) of a finished run's folder, as log_run takes them."""
    summary_path = run_dir / SUMMARY_FILE
    if not summary_path.is_file() or not (run_dir / STEPS_FILE).is_file():
        raise HarnessError(f"{run_dir}: not a finished run's folder (no {SUMMARY_FILE} or {STEPS_FILE})")
    try:
        summary = json.loads(summary_path.read_text())
        steps = read_steps(run_dir / STEPS_FILE)
    except (OSError, ValueError) as exc:  # a damaged or half-written file: the user's to fix, not a traceback
        raise HarnessError(f"{run_dir}: not a finished run's folder ({type(exc).__name__}: {exc})") from exc
    if not isinstance(summary, dict):
        raise HarnessError(f"{summary_path}: not a run's summary (a JSON {type(summary).__name__}, not an object)")
    names = {key: summary.get(key, "none" if key == "engine" else "?") for key in ("hardware", "workload", "strategy", "engine")}
    measured = {k: v for k, v in summary.items() if k not in WHAT_RAN_KEYS and k not in names}
    params: dict = {}
    config = run_dir / ".hydra" / "config.yaml"
    if config.is_file():  # Hydra's record of the composed config: the same params the run would have logged
        params = flatten(OmegaConf.to_container(OmegaConf.load(config), resolve=True, enum_to_str=True))
    return measured, steps, params, names, str(summary.get("overrides", ""))


def log_folder(tracking: TrackingConfig, run_dir: Path, logged_as: Path | None = None, sweep=None) -> str | None:
    """Log a finished run's folder unless the store holds it (under `logged_as`, where it first ran, or
    its own path); returns the new run's id, or None. Clears the folder's TRACKING_FAILED.txt. `sweep`
    (harness.tracking.sweep_runs.LoggedSweep): the sweep whose job it is, logged later: the job is named
    and nested as the live sweep would have (its parent run found in the store, or made)."""
    bound_requests(tracking)
    mlflow_module()
    with store_call(), mlflow_log_into(run_dir):
        if any(already_logged(tracking, folder) for folder in {run_dir, logged_as or run_dir}):
            run_id = None
        elif sweep is not None:
            run_id = log_run(tracking, run_dir, *read_run_dir(run_dir), parent=sweep.parent_run(tracking), swept=sweep.swept)
        else:
            run_id = log_run(tracking, run_dir, *read_run_dir(run_dir))
    (run_dir / FAILED_FILE).unlink(missing_ok=True)
    return run_id


def run_folders(path: Path) -> list[Path]:
    """A run's folder as given; a sweep's folder as its jobs' folders (those that finished)."""
    if (path / SUMMARY_FILE).is_file() or not path.is_dir():
        return [path]
    jobs = sorted(summary.parent for summary in path.glob(f"*/{SUMMARY_FILE}"))
    return jobs or [path]


def tag_condition(tag: str, wanted: str) -> tuple[str, bool]:
    """(an MLflow filter on `tags.<tag>` = `wanted`, whether it is exact). MLflow's filter parser has no
    escapes (`\\'` is kept as two characters, so a folder named `o'brien` never matched and was logged
    again on every resume): a value is quoted with the quote it lacks; one with both is searched by its
    prefix up to the first quote, and the caller compares the runs found."""
    if "'" not in wanted or '"' not in wanted:
        quote = '"' if "'" in wanted else "'"
        return f"tags.{tag} = {quote}{wanted}{quote}", True
    prefix = re.split(r"['\"\\]", wanted, maxsplit=1)[0]  # and before a backslash: PostgreSQL's LIKE escape
    return f"tags.{tag} LIKE '{prefix}%'", False


def already_logged(tracking: TrackingConfig, run_dir: Path) -> bool:
    mlflow = mlflow_module()

    client = mlflow.MlflowClient(tracking_uri=resolve_uri(tracking))
    experiment = client.get_experiment_by_name(tracking.experiment)
    if experiment is None:
        return False
    wanted = str(Path(run_dir).resolve())  # as the run_dir tag holds it
    condition, exact = tag_condition("run_dir", wanted)
    # FINISHED only: a run cut off while logging (FAILED, KILLED) is logged again, whole
    query = f"{condition} and attributes.status = 'FINISHED'"
    token = None
    while True:
        runs = client.search_runs([experiment.experiment_id], filter_string=query, max_results=1 if exact else 1000, page_token=token)
        if any(run.data.tags.get("run_dir") == wanted for run in runs):
            return True
        token = runs.token
        if exact or not token:
            return False
