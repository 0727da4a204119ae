"""`python -m harness.tracking log RUN_DIR ...`: log finished run folders whose tracking failed or was off
(a sweep's jobs nested under its parent run, found in the store or made as the live sweep makes it)."""
from __future__ import annotations

import sys
from pathlib import Path

from harness.base.commands import CommandParser
from harness.base.errors import EXIT_BAD_INPUT, EXIT_TRACKING_FAILED, HarnessError, one_line_text
from harness.base.stopping import store_call
from harness.config.schema import ArtifactPolicy, TrackingConfig
from harness.tracking.store import bound_requests, log_folder, read_run_dir, resolve_uri, run_folders, short_reason
from harness.tracking.sweep_runs import logged_sweeps


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.tracking log RUN_DIR ...`: log finished runs whose tracking failed (or ran off)."""
    parser = CommandParser(prog="python -m harness.tracking", description="Log finished run folders to MLflow.")
    sub = parser.add_subparsers(dest="command", required=True)
    log_parser = sub.add_parser("log", help="log run folders (skips those the store already holds)")
    log_parser.add_argument("run_dirs", nargs="+", type=Path, help="run folders, or sweep folders (their jobs)")
    log_parser.add_argument("--uri", help="tracking URI (default: sqlite:///outputs/mlflow.db here)")
    log_parser.add_argument("--experiment", default="hostbound")
    log_parser.add_argument("--artifacts", default="small", choices=[p.value for p in ArtifactPolicy])
    log_parser.add_argument("--timeout-s", type=float, default=5.0, help="per request, without retries")
    args = parser.parse_args(argv)
    try:
        tracking = TrackingConfig(uri=args.uri, experiment=args.experiment, artifacts=ArtifactPolicy(args.artifacts), timeout_s=args.timeout_s)
        # resolve(), not absolute(): a folder given through a symlink is the folder its run_dir tag names,
        # not a second run of it.
        folders = [folder for given in args.run_dirs for folder in run_folders(given.resolve())]
        for folder in folders:
            read_run_dir(folder)  # every folder is a finished run's before anything is logged
        # A sweep's job is logged as the live sweep would have logged it: named by what the sweep varies,
        # nested under the sweep's parent run (found in the store, or made as the sweep makes it), read
        # from the sweep's folder (Hydra's context, where a live job reads them, is not here).
        sweeps = logged_sweeps(folders)
    except HarnessError as exc:
        print(f"hostbound tracking: error: {one_line_text(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bound_requests(tracking)
    try:
        for run_dir in folders:
            run_id = log_folder(tracking, run_dir, sweep=sweeps.get(run_dir))
            print(f"{run_dir}: logged as run {run_id}" if run_id else f"{run_dir}: already in {resolve_uri(tracking)}")
        for sweep in dict.fromkeys(sweeps.values()):
            with store_call():
                if sweep.finish(tracking):
                    print(f"{sweep.folder}: the sweep's parent run {sweep.parent}")
    except Exception as exc:
        for sweep in dict.fromkeys(sweeps.values()):
            sweep.abandon(tracking)  # a parent made here ends FAILED, not RUNNING; the next `log` finishes it
        print(f"hostbound tracking: error: tracking.uri={resolve_uri(tracking)}: {short_reason(exc)}", file=sys.stderr)
        return EXIT_TRACKING_FAILED
    return 0
