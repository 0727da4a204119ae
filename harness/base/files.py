"""Files that appear complete or not at all.

Every file the harness writes (a run's summary.json, steps.parquet, trace.json, timeline.png; a sweep's
results.csv; reports, profiles, op lists) goes through `atomic_write`: written under a hidden temporary
name in the same folder, flushed to disk, then renamed over the final name. A full disk, a file-size
limit or a kill mid-write leaves the previous file (or none), never half of one; a failed write removes
its temporary file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable


class WriteError(OSError):
    """A file could not be written (disk full, file too large, no permission); the message names it."""


def atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """Call `write(tmp)` to fill a temporary file next to `path`, then rename it to `path`.
    The temporary name keeps the suffix: writers that pick a format by it (matplotlib) still can."""
    path = Path(path)
    tmp = temporary_path(path, os.getpid())
    try:
        write(tmp)
        with open(tmp, "rb+") as written:  # on disk before the rename: a crash cannot leave an empty file
            os.fsync(written.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from exc
        raise


def temporary_path(path: Path, pid: int) -> Path:
    """The temporary file atomic_write fills for `path` in process `pid`."""
    return path.with_name(f".{path.stem}.{pid}.tmp{path.suffix}")


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    write_text(path, json.dumps(data, indent=indent) + "\n")
