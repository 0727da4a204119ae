"""Error types: one base for everything the harness reports to a user without a traceback, the exit
statuses that tell them apart (docs/reliability.md), and `fail`, the one line that ends a command."""
import sys

from harness.base import stopping

EXIT_BAD_INPUT = 2  # a key, value, preset, trace file or output folder: nothing written
EXIT_TRACKING_FAILED = 3  # the tracking store failed: the run's files are complete
EXIT_WRITE_FAILED = 4  # a file could not be written (disk full, file-size limit): files before it are complete
EXIT_WORKER_DIED = 5  # a sweep's (or an advice's) worker process was killed: a sweep's finished jobs keep their folders (resume=true)


def one_line_text(message: str) -> str:
    """A message as one printable line: a value a user typed may hold newlines or other control characters."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(message))


def fail(message: str, status: int = EXIT_BAD_INPUT) -> None:
    """End the command with `hostbound: error: <message>` on one line and exit status `status`. After a
    stop (Ctrl-C, SIGTERM) the error is the stop's doing, not the user's input: the stop ends it instead."""
    stopping.raise_if_stopped()
    if sys.stderr.isatty():  # a progress line may be showing: the error replaces it
        sys.stderr.write("\r\033[K")
    print(f"hostbound: error: {one_line_text(message)}", file=sys.stderr)
    raise SystemExit(status)


class HarnessError(Exception):
    """A problem the harness explains in one line (bad input, an impossible graph)."""


class ConfigError(HarnessError, ValueError):
    """A configuration value is invalid; the message names the key and the value."""


class TrackingError(HarnessError):
    """The tracking store could not take a run whose files are complete; `reason` says why in one line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason
