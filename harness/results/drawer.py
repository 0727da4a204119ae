"""timeline.png drawn by another process while the run simulates and writes its other files.

Importing matplotlib (~0.45 s) and drawing a step (~0.15 s) take longer than a default run's
simulation. A child process forked before the simulation imports matplotlib meanwhile, then draws the
window it is sent. `python -m harness` forks it as its first act (`start_early`), before its own
imports, so that the two processes import side by side on two cores; elsewhere `BackgroundDrawer`
forks when entered. Only the standard library is imported here: this module is loaded before anything
else of a command.
"""
from __future__ import annotations

import atexit
import os
import pickle
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from harness.base.files import temporary_path
from harness.base.forking import can_fork, end_child, fork_keeping, single_run, unblock_stops

if TYPE_CHECKING:
    from harness.sim.outcome import RunResult

# A child forked by start_early and not yet taken by a BackgroundDrawer: (pid, write end of its pipe).
_early: tuple[int, int] | None = None


def start_early(argv: list[str]) -> None:
    """Fork the drawing process now, for a single run that may draw timeline.png: not for sweeps (their
    jobs draw none unless asked), Hydra's information flags or `output.timeline_steps=0`. A child that
    no run takes is ended when the process exits."""
    global _early
    if _early is not None or not can_fork() or not single_run(argv, "output.timeline_steps=0"):
        return
    _early = _fork_child()
    atexit.register(_end_early)


def _fork_child() -> tuple[int, int]:
    read_end, write_end = os.pipe()
    pid = fork_keeping(read_end)
    if pid == 0:  # the child: never returns
        _draw_what_arrives(read_end)
    os.close(read_end)
    return pid, write_end


def _end_early() -> None:
    """An early child no run took (bad input, resumed run, no timeline wanted): end it, leave no zombie."""
    global _early
    if _early is not None:
        pid, write_end = _early
        _early = None
        _kill(pid, write_end)


def _kill(pid: int, write_end: int | None, drawing: Path | None = None) -> None:
    """End the drawing process: SIGTERM unwinds it (a picture half-written is removed by atomic_write),
    SIGKILL if it has not ended within a second; then no temporary file of it is left."""
    end_child(pid, 1.0, signal.SIGTERM)
    if write_end is not None:
        os.close(write_end)
    if drawing is not None:
        temporary_path(drawing, pid).unlink(missing_ok=True)


class BackgroundDrawer:
    """timeline.png drawn by a forked process while this one simulates and writes its other files.

    `draw` sends the window to draw; `wait` (before summary.json marks the run finished) returns once
    the file is written; if the child failed, the picture is drawn here, so that its error (a full
    disk) is this process's, as without the child. Where fork is missing or other threads run (forking
    them is unsafe), nothing is started and `draw` draws at once. A context manager: leaving it ends
    the child. Takes the child `start_early` forked, if there is one.
    """

    def __init__(self) -> None:
        self._pid: int | None = None
        self._to_child: int | None = None
        self._sent: tuple | None = None

    def __enter__(self) -> "BackgroundDrawer":
        global _early
        if _early is not None:
            (self._pid, self._to_child), _early = _early, None
        elif can_fork():
            self._pid, self._to_child = _fork_child()
        return self

    def draw(self, outcome: "RunResult", path: Path, steps: int) -> None:
        from harness.results.timeline import draw_window, timeline_window

        window = timeline_window(outcome, steps)
        if self._to_child is None:
            draw_window(window, path)
            return
        self._sent = (window, Path(path).absolute())  # the child's working folder may differ (hydra.job.chdir)
        try:
            with os.fdopen(self._to_child, "wb") as pipe:
                self._to_child = None
                pickle.dump(self._sent, pipe, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError:  # the child is gone: `wait` draws here
            pass

    def wait(self) -> None:
        if self._pid is None:
            return
        if self._to_child is not None:
            os.close(self._to_child)  # nothing to draw: the child ends on end of input
            self._to_child = None
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        if self._sent is not None and os.waitstatus_to_exitcode(status) != 0:
            from harness.results.timeline import draw_window

            draw_window(*self._sent)

    def __exit__(self, *exc: object) -> None:
        if self._pid is not None:  # left by an error or a stop: the child's picture is not wanted
            pid, write_end = self._pid, self._to_child
            self._pid = self._to_child = None
            _kill(pid, write_end, self._sent[1] if self._sent else None)


def _draw_what_arrives(read_end: int) -> NoReturn:
    """The drawing process: import matplotlib and the drawing code while the parent works, then draw
    the window it sends (nothing, on end of input)."""
    status = 1
    drawing = False

    def on_sigterm(signum: int, frame: object) -> None:
        if drawing:
            sys.exit(128 + signum)  # unwinds: no half-written file
        # Still importing: nothing of ours to leave whole, and an exit raised inside the import machinery's
        # callbacks was printed on the shared terminal ("Exception ignored in: _get_module_lock …").
        os._exit(128 + signum)

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it ends this one
        signal.signal(signal.SIGTERM, on_sigterm)
        unblock_stops()
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401

        from harness.results.timeline import draw_window

        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        if data:
            drawing = True
            draw_window(*pickle.loads(data))
        status = 0
    except BaseException:
        pass
    finally:
        os._exit(status)
