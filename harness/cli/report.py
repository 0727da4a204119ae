"""`python -m harness.report` — compare runs: speed-up of each strategy over eager, per workload.

Reads runs from sweep or run directories (their summary.json files) or from an MLflow tracking store,
and writes `runs.csv` (every run with every number it has), `comparison.csv`, `comparison.md` and plots
(`speedup.png`, `bubble.png`) to `--out`, printing the Markdown table:

    python -m harness.report outputs/sweeps/2026-11-30/10-00-00
    python -m harness.report --tracking-uri sqlite:///outputs/mlflow.db [--experiment hostbound] [--parent RUN_ID]
"""
from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import sys
from pathlib import Path

import pandas as pd

from harness.base.commands import CommandParser
from harness.base.errors import EXIT_TRACKING_FAILED, HarnessError, fail
from harness.base.files import check_folder, write_text
from harness.results.comparison import KEYS, comparison, load_run_dirs, missing_eager, plot, to_markdown, unplotted, write_csv

RUN_ID = re.compile(r"[a-zA-Z0-9][\w\-]{0,255}")  # MLflow's own rule for a run id (its ids: 32 hex digits)


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(prog="python -m harness.report", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="sweep or run directories")
    parser.add_argument("--tracking-uri", help="read runs from this MLflow store instead (an existing one: reading makes none)")
    parser.add_argument("--experiment", help="the store's experiment (default: hostbound)")
    parser.add_argument("--parent", help="only the child runs of this sweep (parent run id)")
    parser.add_argument("--out", type=Path, help="where to write the table and plots (default: the one directory given, else outputs/report)")
    args = parser.parse_args(argv)
    if not args.dirs and not args.tracking_uri:
        parser.error("give sweep/run directories or --tracking-uri")
    if args.dirs and args.tracking_uri:  # the directories were ignored without a word
        parser.error(f"give sweep/run directories or --tracking-uri, not both ({args.dirs[0]} and --tracking-uri={args.tracking_uri})")
    for flag, value in (("--experiment", args.experiment), ("--parent", args.parent)):
        if value is not None and not args.tracking_uri:  # ignored without a word: the report was of every run
            parser.error(f"{flag}={value} reads an MLflow store: give --tracking-uri too")
    for d in args.dirs:
        if not d.exists():
            fail(f"{d}: no such directory")
        if not d.is_dir():
            fail(f"{d}: not a directory (give a run's or a sweep's folder)")
    # One folder: its report beside its runs. Several: their own folder, not the first one's (a sweep's
    # bubble.png, which its results.md names, was replaced by a plot of both sweeps' runs).
    out = args.out or (args.dirs[0] if len(args.dirs) == 1 else Path("outputs") / "report")
    if args.tracking_uri:
        if args.experiment is not None and not args.experiment.strip():
            fail(f"--experiment={args.experiment!r}: must name an experiment (default: hostbound)")
        runs = read_store(args.tracking_uri, "hostbound" if args.experiment is None else args.experiment, args.parent)
    else:
        runs = read_dirs(args.dirs)
    # After reading, not before: the check makes --out's missing parents (outputs/), which a refused read left behind.
    check_folder("--out", out)
    table = comparison(runs)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "runs.csv", runs)
    write_csv(out / "comparison.csv", table)
    markdown = to_markdown(table)
    write_text(out / "comparison.md", markdown + "\n")
    plots = plot(table, out)
    print(markdown)
    for note in unplotted(table):
        print(f"hostbound report: note: {note}", file=sys.stderr)
    for key in missing_eager(table):
        print(f"hostbound report: note: no eager run for {key}: no speed-up to show", file=sys.stderr)
    print(f"\nwrote {out / 'runs.csv'}, {out / 'comparison.csv'}, {out / 'comparison.md'}" + "".join(f", {p}" for p in plots), file=sys.stderr)


def read_dirs(dirs: list[Path]) -> pd.DataFrame:
    """The finished runs under `dirs`; a summary.json that is not a run's is named (it was a traceback)."""
    try:
        runs = load_run_dirs(dirs)
    except (ValueError, TypeError, OSError) as exc:
        fail(_bad_summary(dirs) or f"{', '.join(map(str, dirs))}: cannot read a summary.json ({exc})")
    if runs.empty:
        shown = ", ".join(str(d) for d in dirs[:3]) + (", …" if len(dirs) > 3 else "")
        fail(f"{shown}: no finished runs (no summary.json under {'it' if len(dirs) == 1 else 'them'})")
    needed = [*KEYS, "throughput_tok_s"]
    for key in needed:
        lacking = runs[key].isna() if key in runs else pd.Series(True, index=runs.index)
        if lacking.any():
            fail(f"{Path(runs['run_dir'][lacking].iloc[0]) / 'summary.json'}: not a run's summary (no {key})")
    return runs


def _bad_summary(dirs: list[Path]) -> str | None:
    """The first summary.json under `dirs` that is not a JSON object, as a line naming it."""
    for root in dirs:
        for summary in sorted(Path(root).rglob("summary.json")):
            try:
                content = json.loads(summary.read_text())
            except (ValueError, OSError) as exc:
                return f"{summary}: not a run's summary ({getattr(exc, 'strerror', None) or exc})"
            if not isinstance(content, dict):
                return f"{summary}: not a run's summary (a JSON {type(content).__name__}, not an object)"
    return None


def read_store(uri: str, experiment: str, parent: str | None) -> pd.DataFrame:
    """The finished runs of `experiment` (the children of `parent`) in the store at `uri`. Bad input (a
    store that is not there, an experiment or a parent it lacks) is status 2, naming the flag and the
    value; a store that fails, 3. Nothing is made: MLflow would make a store at a mistyped sqlite path."""
    from harness.config.schema import TrackingConfig
    from harness.tracking.read import load_mlflow, not_in_store  # MLflow takes ~1 s to import: only when reading a store
    from harness.tracking.store import bound_requests, short_reason

    try:  # the checks of tracking.uri: a scheme MLflow reads, no password in it (it would be printed)
        tracking = TrackingConfig(uri=uri, experiment=experiment)
    except HarnessError as exc:
        fail(str(exc).replace("tracking.uri=", "--tracking-uri=", 1).replace("tracking.experiment=", "--experiment=", 1))
    if parent is not None and not RUN_ID.fullmatch(parent):
        fail(f"--parent={parent!r}: not a run id (a sweep's is in its folder's mlflow_parent_run_id)")
    check_sqlite_store(uri)
    bound_requests(tracking)
    try:
        problem = not_in_store(uri, experiment, parent)
        runs = None if problem else load_mlflow(uri, experiment, parent)
    except Exception as exc:  # the store is down, refuses, or is not one
        fail(f"--tracking-uri={uri}: {short_reason(exc)}", EXIT_TRACKING_FAILED)
    if problem:
        fail(problem)
    assert runs is not None
    if runs.empty:
        if parent:
            fail(f"--parent={parent}: no finished runs under it in experiment {experiment!r} of {uri}")
        fail(f"--experiment={experiment}: no finished runs in {uri}")
    return runs


def check_sqlite_store(uri: str) -> None:
    """A sqlite store must be there, and be one: MLflow makes a store (~1 MB) at a path with no file and
    fills an empty or foreign database with its tables, where a report only reads."""
    from harness.config.schema import in_memory, sqlite_path

    path = sqlite_path(uri)
    if path is None or in_memory(uri) or str(path).startswith("file:"):
        return
    if not path.exists():
        meant = Path("/" + str(path)) if not path.is_absolute() else None
        hint = f" (did you mean sqlite:///{meant}? an absolute path takes four slashes)" if meant is not None and meant.is_file() else ""
        fail(f"--tracking-uri={uri}: no such file {path}{hint}; a report reads a store, it makes none")
    try:
        with contextlib.closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=5)) as con:
            tables = {name for (name,) in con.execute("select name from sqlite_master where type='table'")}
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc) or "malformed" in str(exc):
            fail(f"--tracking-uri={uri}: {path} is not a sqlite database ({exc})")
        return  # locked, unreadable: MLflow's own try says why (status 3)
    if "experiments" not in tables:
        fail(f"--tracking-uri={uri}: {path} is {'an empty file' if not tables else 'a database'}, not an MLflow store (no experiments table)")
