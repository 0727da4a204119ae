"""Stopping a command (Ctrl-C, SIGTERM, a sweep's workers told to end) between store calls, never inside
one, and ending it: by its exit status, or by the signal that stopped it after one line saying so.

Every command installs `stop_on_signals` first (`python -m harness`, and the `python -m harness.*` shims
through harness.base.commands.run_command): SIGINT and SIGTERM raise `Stopped`, which unwinds to the command's top. A stop
unwinds the stack by an exception raised from a signal handler, so that an open MLflow run ends
FAILED and no file is left half-written. Raised in the middle of an MLflow call, though, that exception
can leave the store's connection inside its transaction, holding sqlite's write lock: the FAILED mark
that follows then waited 20 s for it (MLflow's busy timeout), failed, and printed a page of traceback.
So a stop that arrives inside `store_call()` is raised when the call ends; a call to a tracking server
is bounded by `tracking.timeout_s`, which bounds the wait.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Iterator, NoReturn, Optional

_depth = 0  # store calls under way in this process (they nest: a run's logging makes the experiment)
_exiting = False  # exit_now has done the command's teardown: a stop is recorded, not raised
_pending: Optional[BaseException] = None  # the stop that came during one


def stop_with(exc: BaseException) -> None:
    """From a signal handler: raise `exc` now, or at the end of the store call under way (or, once the
    command is exiting, record it for `exit_now`'s last look)."""
    global _pending, _requested
    if isinstance(exc, Stopped) and _requested is None:
        _requested = exc
    if _exiting:
        return
    if _depth:
        if _pending is None:
            _pending = exc
        return
    raise exc


@contextlib.contextmanager
def _deferring(raise_at_end: bool) -> Iterator[None]:
    """A block that a stop does not interrupt: the stop is raised at its end, or (not `raise_at_end`) left
    requested for the command's `raise_if_stopped`."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    finally:
        _depth = max(0, _depth - 1)
        if _depth == 0 and _pending is not None:
            exc, _pending = _pending, None
            if raise_at_end or exc is not _requested:
                raise exc


def store_call() -> contextlib.AbstractContextManager[None]:
    """A block of MLflow calls that a stop does not interrupt (it is raised at the block's end)."""
    return _deferring(raise_at_end=True)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A block that a stop does not interrupt and that does not raise it either: a command's imports (a
    module left half-imported by Ctrl-C broke what came after it: a false "bad input" line, an exception
    swallowed and the run finished). The stop stays requested; the command's `raise_if_stopped` raises it.
    An error that leaves the block once a stop was requested gives way to the stop: the user asked to
    stop, and the error may be the stop's doing (a "bad input" line would be false)."""
    with _deferring(raise_at_end=False):
        try:
            yield
        except Exception:
            if _requested is not None:
                raise _requested from None
            raise


def forget() -> None:
    """No stop and no store call: a forked child (a helper, a sweep's worker) starts so, and a test ends so."""
    global _depth, _pending, _requested, _said, _left, _exiting
    _depth, _pending, _requested, _said, _left, _exiting = 0, None, None, False, "", False


os.register_at_fork(after_in_child=forget)


class Stopped(BaseException):
    """SIGINT or SIGTERM reached a command: unwinds the stack (an open MLflow run ends, a transaction rolls
    back, a file being written is dropped) up to the command's top, which says so and ends by the signal.
    `where` is what the command leaves behind, for that line ("the run's files are complete in …")."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.where = ""


class SweepStopped(Stopped):
    """A stop that reached a sweep: `python -m harness` marks its parent run KILLED (`finish_stopped_sweep`)."""


_requested: Optional[Stopped] = None  # the stop that reached this process, once one has
_said = False  # its line was printed
_left = ""  # what the command has left behind so far, for a stop that comes after its work (`leaves`)


def requested() -> Optional[Stopped]:
    """The stop that reached this process, if one has (raised or not yet)."""
    return _requested


def raise_if_stopped() -> None:
    """At a point where stopping is safe: a stop whose exception was swallowed on its way up (raised inside
    a `__del__` or a callback that ignores errors: 'Exception ignored in …') ends the command here."""
    if _requested is not None:
        raise _requested


def _stop(signum: int, frame: object) -> None:
    if _requested is not None:  # a second Ctrl-C while the first unwinds (a store call ending): once is enough
        return
    stop_with(Stopped(signum))


def _quiet_unraisable(unraisable) -> None:
    """sys.unraisablehook: a stop raised where Python cannot raise it (a weakref callback or a `__del__`
    that runs during garbage collection) is already requested, and `raise_if_stopped` ends the command by
    it; Python's own hook printed "Exception ignored in …" and its traceback first. Anything else as before."""
    if isinstance(unraisable.exc_value, Stopped) and unraisable.exc_value is _requested:
        return
    _python_unraisable_hook(unraisable)


_python_unraisable_hook = sys.unraisablehook


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise `Stopped` in this process (between store calls). The main thread only:
    Python runs signal handlers there. A sweep replaces them with its own (harness.sweep.callbacks)."""
    sys.unraisablehook = _quiet_unraisable
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)


def leaves(what: str) -> None:
    """From here on the command's work is done and `what` says what it left ("… holds the finished run"): a
    stop during the exit that follows (helpers waited for, exit handlers) says so instead of nothing."""
    global _left
    _left = what


def say_stopped(detail: str = "") -> None:
    """The one line for a stop (once), e.g. `hostbound: error: stopped by SIGINT (Ctrl-C); …`."""
    global _said
    if _requested is None or _said:
        return
    _said = True
    name = signal.Signals(_requested.signum).name
    why = {"SIGINT": " (Ctrl-C)"}.get(name, "")
    detail = detail or _requested.where or _left
    if sys.stderr.isatty():  # a progress line may be showing: the line replaces it
        sys.stderr.write("\r\033[K")
    print(f"hostbound: error: stopped by {name}{why}" + (f"; {detail}" if detail else ""), file=sys.stderr)


def exit_now(code: object) -> NoReturn:
    """End the process as `sys.exit(code)` would, without the interpreter's teardown: freeing every object
    of numba, pandas, MLflow and Hydra one by one took ~1 s after each command. What teardown is for still
    happens: other threads are waited for, exit handlers run, the streams are flushed. A command that a
    signal stopped ends by that signal once its line is said (a shell sees 130 for SIGINT, 143 for
    SIGTERM, and a script that ran it stops too), also when the stop's exception was swallowed on its way."""
    global _requested, _exiting
    if code is None or isinstance(code, int):
        status = code or 0
    else:  # SystemExit("text"), as sys.exit prints it
        print(code, file=sys.stderr)
        status = 1
    with held():  # a stop now (a helper being waited for) ends the process once this is done, not in the middle
        threading._shutdown()  # as the interpreter does first: executors' exit hooks, then other threads waited for
        atexit._run_exitfuncs()
        logging.shutdown()
        _exiting = True  # still held: a stop from here to the end is recorded (below), never raised out of exit_now
    # From here a stop is recorded, not raised, and read below: one that arrived while the last lines were
    # flushed had no handler run before os._exit, and the command ended 0 as if it had not come (seen in a
    # CI run of the signal tests). The main thread blocks the signals, so one sent now stays pending for
    # `sigpending`; one that another thread takes runs the handler here at the next call, which records it.
    # The last look comes after the last flush: only the few calls from it to os._exit are left.
    stops = {signal.SIGINT, signal.SIGTERM}
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    while True:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (`| head`): nothing more can reach it
                pass
        pending = signal.sigpending() & stops
        if _requested is None and pending:
            _requested = Stopped(int(min(pending)))
        if _requested is None or _said:
            break
        say_stopped()  # once, then flushed and looked at again
    if _requested is not None:
        signal.signal(_requested.signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [_requested.signum])
        os.kill(os.getpid(), _requested.signum)
        status = 128 + _requested.signum  # not reached, unless the signal is ignored by whoever started us
    os._exit(status)
