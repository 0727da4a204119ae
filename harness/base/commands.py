"""What every `python -m harness.<command>` shares: stopping on signals from its first moment, usage
errors in one line, and the exit statuses of docs/reliability.md for what goes wrong.

`python -m harness` itself is Hydra's (harness/__main__.py); the others are argparse commands whose
shims call `run_command("harness.cli.<command>")`.
"""
from __future__ import annotations

import argparse
import importlib
from typing import NoReturn

from harness.base import stopping
from harness.base.errors import EXIT_WRITE_FAILED, HarnessError, fail
from harness.base.files import WriteError


class CommandParser(argparse.ArgumentParser):
    """argparse, with a usage error in one line and exit status 2, as every other bad input
    (`hostbound: error: python -m harness.profile: argument --rank: invalid int value: 'abc' (see --help)`)."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message} (see --help)")


def run_command(module: str) -> NoReturn:
    """Stop on signals, import `module` and run its `main()` (an exit status, or None), and end by
    `stopping.exit_now`: a HarnessError it lets through is bad input (2), a file it could not write 4."""
    stopping.stop_on_signals()
    try:
        try:
            code = importlib.import_module(module).main()
        except HarnessError as exc:
            fail(str(exc))
        except WriteError as exc:
            fail(str(exc.strerror), EXIT_WRITE_FAILED)
    except stopping.Stopped:
        code = None
    except SystemExit as exit_:  # fail(), argparse's --help
        code = exit_.code
    except Exception:
        if stopping.requested() is None:
            raise
        code = None  # a library left broken by the stop failed on its way out: the stop is what ended the command
    stopping.exit_now(code)
