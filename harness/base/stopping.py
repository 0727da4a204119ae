"""Stopping a run or a sweep (SIGTERM, Ctrl-C, a sweep's workers told to end) between store calls, never inside one.

A stop unwinds the stack by an exception raised from a signal handler, so that an open MLflow run ends
FAILED and no file is left half-written. Raised in the middle of an MLflow call, though, that exception
can leave the store's connection inside its transaction, holding sqlite's write lock: the FAILED mark
that follows then waited 20 s for it (MLflow's busy timeout), failed, and printed a page of traceback.
So a stop that arrives inside `store_call()` is raised when the call ends; a call to a tracking server
is bounded by `tracking.timeout_s`, which bounds the wait.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

_depth = 0  # store calls under way in this process (they nest: a run's logging makes the experiment)
_pending: Optional[BaseException] = None  # the stop that came during one


def stop_with(exc: BaseException) -> None:
    """From a signal handler: raise `exc` now, or at the end of the store call under way."""
    global _pending
    if _depth:
        if _pending is None:
            _pending = exc
        return
    raise exc


@contextlib.contextmanager
def store_call() -> Iterator[None]:
    """A block of MLflow calls that a stop does not interrupt (it is raised at the block's end)."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending is not None:
            exc, _pending = _pending, None
            raise exc


class SweepStopped(BaseException):
    """SIGTERM reached a sweep: unwinds the stack (an open MLflow run ends, a transaction rolls back)
    up to `python -m harness`, which then marks the parent run KILLED (`finish_stopped_sweep`)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
