"""`python -m harness.report` — compare runs: speed-up of each strategy over eager, per workload.

Reads runs from sweep or run directories (their summary.json files) or from an MLflow tracking store,
and writes `runs.csv` (every run with every number it has), `comparison.csv`, `comparison.md` and plots
(`speedup.png`, `bubble.png`) to `--out`, printing the Markdown table:

    python -m harness.report outputs/sweeps/2026-11-30/10-00-00
    python -m harness.report --tracking-uri sqlite:///outputs/mlflow.db [--experiment hostbound] [--parent RUN_ID]
"""
from __future__ import annotations

import sys
from pathlib import Path

from harness.base.commands import CommandParser
from harness.base.errors import EXIT_TRACKING_FAILED, HarnessError, fail
from harness.base.files import check_folder, write_text
from harness.results.comparison import comparison, load_run_dirs, missing_eager, plot, to_markdown, unplotted, write_csv


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(prog="python -m harness.report", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="sweep or run directories")
    parser.add_argument("--tracking-uri", help="read runs from this MLflow store instead")
    parser.add_argument("--experiment", default="hostbound")
    parser.add_argument("--parent", help="only the child runs of this sweep (parent run id)")
    parser.add_argument("--out", type=Path, help="where to write the table and plots (default: the first directory, or outputs/report)")
    args = parser.parse_args(argv)
    if not args.dirs and not args.tracking_uri:
        parser.error("give sweep/run directories or --tracking-uri")
    for d in args.dirs:
        if not d.is_dir():
            print(f"hostbound report: error: {d}: no such directory", file=sys.stderr)
            raise SystemExit(2)
    out = args.out or (args.dirs[0] if args.dirs else Path("outputs") / "report")
    check_folder("--out", out)
    if args.tracking_uri:
        from harness.config.schema import TrackingConfig
        from harness.tracking.read import load_mlflow  # MLflow takes ~1 s to import: only when reading a store
        from harness.tracking.store import bound_requests, short_reason

        try:  # the checks of tracking.uri: a scheme MLflow reads, no password in it (it would be printed)
            tracking = TrackingConfig(uri=args.tracking_uri, experiment=args.experiment)
        except HarnessError as exc:
            fail(str(exc).replace("tracking.uri=", "--tracking-uri=", 1))
        bound_requests(tracking)
        try:
            runs = load_mlflow(args.tracking_uri, args.experiment, args.parent)
        except Exception as exc:  # the store is down, refuses, or is not one
            fail(f"--tracking-uri={args.tracking_uri}: {short_reason(exc)}", EXIT_TRACKING_FAILED)
    else:
        runs = load_run_dirs(args.dirs)
    if runs.empty:
        print("hostbound report: error: no runs found", file=sys.stderr)
        raise SystemExit(2)
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
