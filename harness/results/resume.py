"""Resuming: a run whose configuration already finished is not simulated again.

`resume=true` (a top-level key) makes every run, alone or in a sweep, first look for a finished run of
the same configuration: the same resolved config and seed, where files and runs go aside
(`config_hash`, kept in summary.json). It looks in its own folder (a sweep re-run
into the same `hydra.sweep.dir`), then in every run and sweep folder under the launch folder's
`outputs/`. A match found elsewhere is copied into the run's folder with `RESUMED_FROM.txt` naming the
source; either way the run is not simulated or logged again, so an interrupted sweep re-run with
`resume=true` ends with the same results.csv as an uninterrupted one and no duplicate MLflow runs.
"""
from __future__ import annotations

import functools
import hashlib
import json
import shutil
from pathlib import Path

from harness.base.files import atomic_write, write_text
from harness.results.outputs import STEPS_FILE, SUMMARY_FILE, TIMELINE_FILE, TRACE_FILE, WHERE_THINGS_GO, run_summaries
from harness.base.overrides import override_key

RESUMED_FILE = "RESUMED_FROM.txt"
# Keys that say where files and runs go, or how to run: not what is simulated.
_NOT_THE_CONFIGURATION = WHERE_THINGS_GO


def config_hash(params: dict) -> str:
    """16 hex digits identifying what a run simulates (the flattened resolved config, seed included, and
    the files it reads: input_digests)."""
    kept = {k: v for k, v in params.items() if not k.startswith(_NOT_THE_CONFIGURATION)}
    kept.update(input_digests(params))
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def setting_hash(params: dict) -> str:
    """16 hex digits of what a run simulates but its strategy: runs that schedule the same work, which a
    comparison's speed-up sets side by side (the eager run of the same setting however each was written:
    `experiment=a2_deepseek_eager,a2_deepseek_acl_graph`, or a default written out). The files it reads count
    as in config_hash: an edited CSV under the same name is another setting. summary.json holds it, and so
    does the run's MLflow tag, hashed from the same resolved config when it is logged."""
    return config_hash({k: v for k, v in params.items() if not k.startswith("strategy.")})


def strategy_changes(params: dict) -> str:
    """The run's strategy.* values that differ from plain `strategy=eager` (conf/strategy/eager.yaml over the
    schema's defaults), as `key=value` in key order; '' for plain eager. Among the eager runs of one setting
    it tells the plain one from one with switches an experiment set (a2_deepseek_fusion is eager with
    task fusion), which a speed-up must not take for its baseline, and says which switches those are."""
    from harness.config.compose import plain_strategy_params

    plain = plain_strategy_params()
    changed = {k: v for k, v in params.items() if k.startswith("strategy.") and (k not in plain or plain[k] != v)}
    return " ".join(f"{k}={v if isinstance(v, str) else json.dumps(v, separators=(',', ':'), default=str)}" for k, v in sorted(changed.items()))


def input_digests(params: dict) -> dict[str, str]:
    """Digests of the files a run reads beside its config: the config names them, but an edited file
    under the same name is another run (an op-list CSV edited and rerun with resume=true copied the old
    run's numbers). The model card (workloads/<card>.yaml) by its content, so that a comment edited there
    leaves the hash, and the runs it finds, alone; a trace workload's CSV (used when no card is set, as
    the run uses it) by its bytes. A file that is not there adds nothing: the run itself refuses it."""
    card, path = params.get("workload.card"), params.get("workload.path")
    if card:
        digest = _card_digest(str(card))
        return {"workload.card:content": digest} if digest else {}
    if path:
        digest = _file_digest(str(path))
        return {"workload.path:bytes": digest} if digest else {}
    return {}


def _stamp(path: Path) -> tuple | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (str(path.absolute()), stat.st_mtime_ns, stat.st_size, stat.st_ino)


def _card_digest(name: str) -> str | None:
    from harness.config.paths import WORKLOADS_DIR

    stamp = _stamp(WORKLOADS_DIR / f"{name}.yaml")
    return _card_content_digest(stamp) if stamp is not None else None


def _file_digest(path: str) -> str | None:
    stamp = _stamp(Path(path))
    return _bytes_digest(stamp) if stamp is not None else None


# Keyed by (path, modification time, size, inode): a sweep's jobs over one file read it once, and a file
# edited (or replaced) in between is read again.
@functools.lru_cache(maxsize=64)
def _bytes_digest(stamp: tuple) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(stamp[0], "rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _card_content_digest(stamp: tuple) -> str | None:
    from omegaconf import OmegaConf

    try:
        content = OmegaConf.to_container(OmegaConf.load(stamp[0]), resolve=True)
    except Exception:  # not YAML: the run says so; its bytes tell it apart meanwhile
        return _bytes_digest(stamp)
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def _finished(folder: Path, digest: str) -> bool:
    return (folder / STEPS_FILE).is_file() and finished_hash(folder) == digest


def find_finished(digest: str, run_dir: Path, outputs_dir: Path) -> Path | None:
    """The folder of a finished run of this configuration: `run_dir` itself first, then any under `outputs_dir`."""
    if _finished(run_dir, digest):
        return run_dir
    for folder in _finished_by_digest(outputs_dir).get(digest, []):
        if folder != run_dir and _finished(folder, digest):
            return folder
    return None


_indexes: dict[Path, dict[str, list[Path]]] = {}  # outputs folder → config_hash → finished run folders


def _finished_by_digest(outputs_dir: Path) -> dict[str, list[Path]]:
    """Every summary.json under `outputs_dir` read once per process: each job of a resumed sweep looked
    through all of them again, which made resuming N jobs over M earlier runs read N × M files. Runs
    that finish later in this process are not in it (they are this sweep's own, found in their folders)."""
    key = outputs_dir.absolute()
    if key not in _indexes:
        index: dict[str, list[Path]] = {}
        if outputs_dir.is_dir():
            for summary in run_summaries(outputs_dir):
                try:
                    digest = json.loads(summary.read_text()).get("config_hash")
                except (OSError, ValueError, AttributeError):  # not ours, or not a summary
                    continue
                if isinstance(digest, str):
                    index.setdefault(digest, []).append(summary.parent)
        _indexes[key] = index
    return _indexes[key]


def finished_hash(folder: Path) -> str | None:
    """The config_hash of the finished run `folder` holds; None when it holds none (its summary.json is
    written last, outputs.write_outputs: its presence means finished)."""
    if not (folder / SUMMARY_FILE).is_file():
        return None
    try:
        digest = json.loads((folder / SUMMARY_FILE).read_text()).get("config_hash")
    except (OSError, ValueError, AttributeError):  # a file from elsewhere that is not ours: no run of ours
        return None
    return digest if isinstance(digest, str) else None


def what_a_sweep_simulates(overrides: list[str]) -> list[str]:
    """A sweep's command-line overrides less those that say where files and runs go or how jobs run
    (`resume`, `tracking.*`, `output.*`, `hydra.*`, `hydra/…`), in their order."""
    kept = []
    for override in overrides:
        key = override_key(override)
        if not key.startswith(_NOT_THE_CONFIGURATION):
            kept.append(override)
    return kept


def reuse(found: Path, run_dir: Path) -> dict:
    """Bring a finished run's files into `run_dir` (when elsewhere); returns its summary."""
    if found != run_dir:
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in (SUMMARY_FILE, STEPS_FILE, TRACE_FILE, TIMELINE_FILE):
            if (found / name).is_file():
                atomic_write(run_dir / name, lambda tmp, source=found / name: shutil.copyfile(source, tmp))
        write_text(run_dir / RESUMED_FILE, f"{found}\n")
    return json.loads((run_dir / SUMMARY_FILE).read_text())
