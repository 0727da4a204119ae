"""A sweep's MLflow side: its parent run (made at the start, given the results at the end, ended KILLED or
FAILED when the sweep is stopped or fails) and a forked worker's fresh database connections.

harness.sweep.callbacks decides when; these calls are the only ones a sweep makes to MLflow.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from omegaconf import OmegaConf

from harness.base.errors import HarnessError
from harness.base.files import write_text
from harness.config.schema import TrackingConfig
from harness.results.outputs import RESULTS_CSV, RESULTS_MD, SUMMARY_FILE, WHERE_THINGS_GO, failed_job_dirs
from harness.tracking.store import PARENT_FILE, SWEPT_FILE, ensure_experiment, mlflow_module, name_parts, param_value, resolve_uri, tag_condition
from harness.base.overrides import override_key, split_override

MULTIRUN_FILE = "multirun.yaml"  # Hydra's record of a sweep (its overrides, the presets chosen), in the sweep's folder


def _client(tracking: TrackingConfig):
    mlflow = mlflow_module()

    return mlflow.MlflowClient(tracking_uri=resolve_uri(tracking))


def start_parent_run(tracking: TrackingConfig, name: str, sweep_dir: Path, overrides: str) -> str:
    """Make the sweep's parent run (RUNNING) in the experiment; returns its id."""
    from mlflow.entities import Param

    experiment_id = ensure_experiment(tracking)
    client = _client(tracking)
    parent = client.create_run(experiment_id, run_name=name, tags={"sweep_dir": str(sweep_dir), "overrides": overrides, "kind": "sweep"})
    # Its params: what the command line set, swept values as written (strategy=eager,acl_graph).
    chosen = [split_override(override) for override in overrides.split()]
    params = {key: value for key, _, value in chosen if key and not key.startswith(WHERE_THINGS_GO)}
    try:
        client.log_batch(parent.info.run_id, params=[Param(key, param_value(value)) for key, value in params.items()])
    except BaseException:  # the sweep never learns this run's id: it must not stay RUNNING
        client.set_terminated(parent.info.run_id, status="FAILED")
        raise
    return parent.info.run_id


def reopen_parent_run(tracking: TrackingConfig, run_id: str, sweep_dir: Path) -> str | None:
    """The parent run a sweep made before (`resume=true` in its folder), RUNNING again, so that its jobs,
    those that finished before and those that run now, stay the children of one run; None when the
    store does not hold it as this folder's sweep (then a new one is made)."""
    client = _client(tracking)
    try:
        run = client.get_run(run_id)
    except Exception:  # deleted, or another store
        return None
    if run.info.experiment_id != ensure_experiment(tracking) or run.data.tags.get("sweep_dir") != str(sweep_dir):
        return None
    client.update_run(run_id, status="RUNNING")
    return run_id


def finish_parent_run(tracking: TrackingConfig, run_id: str, artifacts: list[Path], jobs: int, failed: bool, description: str = "") -> None:
    """Describe the run (Markdown), attach the sweep's results files, count its finished jobs, end it FINISHED
    (FAILED if a job failed)."""
    client = _client(tracking)
    if description:
        client.set_tag(run_id, "mlflow.note.content", description)  # what the UI shows as the run's description
    for path in artifacts:
        client.log_artifact(run_id, str(path))
    client.log_metric(run_id, "jobs", float(jobs))
    client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")


def end_parent_run(tracking: TrackingConfig, run_id: str, status: str, only_if_running: bool = False) -> None:
    """End the parent run with `status` (only if still RUNNING, when asked), and its jobs' runs still RUNNING
    as KILLED: by then every process of the sweep has ended, so a job's open run belonged to a worker
    killed mid-job (SIGKILL, out of memory), which could not end it itself."""
    client = _client(tracking)
    parent = client.get_run(run_id)
    if not only_if_running or parent.info.status == "RUNNING":
        client.set_terminated(run_id, status=status)
    for job in client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}' and attributes.status = 'RUNNING'", max_results=10000
    ):
        client.set_terminated(job.info.run_id, status="KILLED")


class LoggedSweep:
    """A sweep whose jobs `python -m harness.tracking log` logs later (the store was down, or tracking off):
    what its live callback (harness.sweep.callbacks) would have used, read from its folder (Hydra's
    multirun.yaml, SWEPT_FILE, PARENT_FILE), and its parent run in the target store: the one there
    (PARENT_FILE's, or one tagged with this folder), or one made as a live sweep makes it, at the first
    job the store lacks."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        try:
            hydra = OmegaConf.load(folder / MULTIRUN_FILE).hydra
            self.overrides = [str(o) for o in OmegaConf.to_container(hydra.overrides.task)]
            self.choices = {str(k): str(v) for k, v in OmegaConf.to_container(hydra.runtime.choices).items()}
            swept_file = folder / SWEPT_FILE
            self.swept = frozenset(swept_file.read_text().split()) if swept_file.is_file() else frozenset(swept_keys_of(self.overrides))
        except Exception as exc:  # a damaged multirun.yaml: the user's to fix, not a traceback
            raise HarnessError(f"{folder / MULTIRUN_FILE}: not a sweep's record ({type(exc).__name__}: {exc})") from exc
        self.parent: str | None = None
        self.made = False  # the parent run made here
        self.to_finish = False

    def parent_run(self, tracking: TrackingConfig) -> str:
        """The sweep's parent run in the target store, found or made (RUNNING) on the first call."""
        if self.parent is None:
            found = self._find(tracking)
            if found is not None:
                self.parent = found.info.run_id
                # A live sweep's end that did not reach the store left it without its results: given them now.
                ended = any((self.folder / name).is_file() for name in (RESULTS_CSV, RESULTS_MD))
                self.to_finish = "jobs" not in found.data.metrics and ended
            else:
                name = sweep_name(self.overrides, self.folder.name, self.choices)
                self.parent = start_parent_run(tracking, name, self.folder, " ".join(self.overrides))
                self.made = self.to_finish = True
                if not (self.folder / PARENT_FILE).exists():  # as a live sweep leaves it (resume=true reopens it)
                    with contextlib.suppress(OSError):
                        write_text(self.folder / PARENT_FILE, self.parent)
        return self.parent

    def _find(self, tracking: TrackingConfig):
        client = _client(tracking)
        experiment_id = ensure_experiment(tracking)
        parent_file = self.folder / PARENT_FILE
        if parent_file.is_file():
            try:
                run = client.get_run(parent_file.read_text().strip())
            except Exception:  # another store's run, or deleted
                run = None
            if run is not None and run.info.experiment_id == experiment_id and self._is_this_sweep(run):
                return run
        condition, exact = tag_condition("sweep_dir", str(self.folder))
        runs = client.search_runs([experiment_id], f"{condition} and tags.kind = 'sweep'", max_results=1000, order_by=["attributes.start_time DESC"])
        return next((run for run in runs if self._is_this_sweep(run)), None)

    def _is_this_sweep(self, run) -> bool:
        """A sweep's parent run of this folder (a live sweep tags its folder as given: maybe relative)."""
        tag = run.data.tags.get("sweep_dir", "")
        if run.data.tags.get("kind") != "sweep" or not tag:
            return False
        return tag == str(self.folder) or (not Path(tag).is_absolute() and self.folder.match(tag))

    def finish(self, tracking: TrackingConfig) -> bool:
        """Give the parent run the sweep's results as the live sweep's end does (finish_parent_run), when made
        here or left without them; True when it did."""
        if self.parent is None or not self.to_finish:
            return False
        from harness.results.comparison import PLOTS

        failed = failed_job_dirs(self.folder)
        jobs = len([s for s in self.folder.glob(f"*/{SUMMARY_FILE}") if s.parent.absolute() not in failed])
        plots = [self.folder / name for _, name, _ in PLOTS if (self.folder / name).is_file()]
        description = ""
        if (self.folder / RESULTS_CSV).is_file():
            with contextlib.suppress(Exception):  # the table the sweep wrote, one row a job that finished
                import pandas as pd

                jobs = len(pd.read_csv(self.folder / RESULTS_CSV))
            if (self.folder / RESULTS_MD).is_file():
                compared = (self.folder / RESULTS_MD).read_text().removesuffix("\n")
                description = parent_description(jobs, self.overrides, compared, plots)
        artifacts = [self.folder / name for name in (RESULTS_CSV, RESULTS_MD) if (self.folder / name).is_file()] + plots
        finish_parent_run(tracking, self.parent, artifacts, jobs, bool(failed), description)
        self.to_finish = False
        return True

    def abandon(self, tracking: TrackingConfig) -> None:
        """Logging failed: a parent made here ends FAILED instead of RUNNING (best effort)."""
        if self.made and self.to_finish:
            with contextlib.suppress(Exception):
                _client(tracking).set_terminated(self.parent, status="FAILED")


def sweep_folder_of(run_dir: Path) -> Path | None:
    """The sweep's folder a job's folder lies in (the nearest one above with Hydra's multirun.yaml), or None."""
    return next((folder for folder in run_dir.parents if (folder / MULTIRUN_FILE).is_file()), None)


def logged_sweeps(folders: list[Path]) -> dict[Path, LoggedSweep]:
    """The sweep of each of `folders` that is a sweep's job (one LoggedSweep a sweep)."""
    sweeps: dict[Path, LoggedSweep] = {}
    of: dict[Path, LoggedSweep] = {}
    for folder in folders:
        sweep_dir = sweep_folder_of(folder)
        if sweep_dir is not None:
            if sweep_dir not in sweeps:
                sweeps[sweep_dir] = LoggedSweep(sweep_dir)
            of[folder] = sweeps[sweep_dir]
    return of


def forget_inherited_connections() -> None:
    """A forked process must not use its parent's database connections (SQLAlchemy's `dispose(close=False)`
    recipe): MLflow keeps one engine per database URI for the process. (Its HTTP sessions are per process
    id already.)"""
    if "mlflow.store.tracking.sqlalchemy_store" not in sys.modules:  # never imported: nothing inherited
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for engine in list(SqlAlchemyStore._engine_map.values()):
        engine.dispose(close=False)


def swept_keys_of(overrides: list[str]) -> set[str]:
    """The keys a sweep's command line varies (`strategy`, `workload.batch_size`), without +/~."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return {
        override_key(o.get_key_element())
        for o in OverridesParser.create().parse_overrides(overrides)
        if o.is_sweep_override() and not o.is_hydra_override()
    }


def parent_description(jobs: int, overrides: list[str], compared_markdown: str, plots: list[Path]) -> str:
    """The parent run's description (Markdown, on its page in the MLflow UI): the command, the comparison
    table the sweep printed, and where the rest is."""
    import shlex

    files = ", ".join(f"`{name}`" for name in (RESULTS_MD, RESULTS_CSV, *(p.name for p in plots)))
    return (  # the table first: the UI shows a description's first lines until "Show more"
        f"{compared_markdown}\n\n**{jobs} jobs** of `{shlex.join(['python', '-m', 'harness', '-m', *overrides])}`, each a run"
        f" nested under this one. Artifacts: {files} ({RESULTS_CSV}: every summary key of every job)."
    )


def sweep_name(overrides: list[str], folder: str, choices: dict | None = None) -> str:
    """A parent run's name: what its jobs share, then what they vary, e.g. `sweep atlas_a2·steps=4 ·
    strategy=eager,async × batch_size=1,8 · 03-10-00_1234` (the folder tells apart two sweeps of the same
    values). `choices`: the presets Hydra chose (hydra.runtime.choices)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    sweeps = [o for o in parsed if o.is_sweep_override() and not o.is_hydra_override()]
    swept = [f"{override_key(o.get_key_element()).rsplit('.', 1)[-1]}={o.input_line.split('=', 1)[1]}" for o in sweeps]
    keys = frozenset(swept_keys_of(overrides))
    shared = {k: str(v) for k, v in (choices or {}).items() if k not in keys}  # the presets every job runs
    single = " ".join(o.input_line for o in parsed if not (o.is_sweep_override() or o.is_hydra_override()))
    fixed = name_parts(shared, single)[1]
    return f"sweep {'·'.join(fixed) or 'of the defaults'} · {' × '.join(swept) or 'of one job'} · {folder}"[:250]
