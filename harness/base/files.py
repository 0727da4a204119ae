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

from harness.base.errors import ConfigError


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


def check_folder(key: str, folder: object, empty: bool = False, why_empty: str = "") -> Path:
    """`folder` (given as `key`: a config key or a flag) can be made and written, and, if `empty`, holds
    nothing yet; raises ConfigError naming the key, the value and what is in the way. Tried, not guessed
    from permission bits: the probe makes the folder and a file, then removes both (and any parent it
    made), so a refused folder leaves nothing behind."""
    text = "" if folder is None else str(folder)
    if not text.strip():
        raise ConfigError(f"{key}={text!r}: must name a folder")
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"{key}={text}: is a file, not a folder")
        if empty and any(path.iterdir()):
            raise ConfigError(f"{key}={text}: already holds files ({why_empty})")
    made = [p for p in [path, *path.parents] if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".hostbound-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        # Usable: only the folder itself goes again (it is made when written to). Its parents stay: runs
        # started together share them, and removing one under another's probe made that probe fail.
        made = made[:1]
    except OSError as exc:
        blocker = next((p for p in [path, *path.parents] if p.exists()), path)
        if not blocker.is_dir():
            raise ConfigError(f"{key}={text}: cannot be made ({blocker} is a file)") from None
        raise ConfigError(f"{key}={text}: cannot be made or written in {blocker} ({exc.strerror or exc})") from None
    finally:
        for p in made:  # deepest first
            try:
                p.rmdir()
            except OSError:
                pass
    return path
