"""Helper processes forked beside a run: the one that draws timeline.png, the one that logs to MLflow.

A command forks them as its first act, so that their imports (matplotlib, MLflow: seconds on two cores)
run beside its own. Each child keeps only the descriptors it was given: one that held a copy of another
child's pipe would keep that pipe open, and the other child would never see its end of input.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time


def can_fork() -> bool:
    """fork is there and no other thread runs (forking a process with threads is unsafe)."""
    return hasattr(os, "fork") and threading.active_count() == 1


def cores_usable() -> int:
    """Cores this process may run on (its CPU affinity, as a container or taskset limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def single_run(argv: list[str], *off: str) -> bool:
    """Whether a command line asks for one run a helper may serve: no flag (-m, --cfg, --help ...), no
    sweep (a value with a comma), none of the `off` overrides (`tracking.enabled=false`)."""
    for arg in argv:
        flat = arg.replace(" ", "")
        if arg.startswith("-") or flat == "hydra.mode=MULTIRUN" or flat in off or "," in arg.partition("=")[2]:
            return False
    return True


# Ctrl-C and SIGTERM: held back across a fork. A child that took one before setting its own handlers ran
# the parent's, which raised a stop inside os.fork and unwound the *parent's* code in the child (a second
# copy of the command, or of a pytest worker): a parent that ends its helper at once (bad input) did so.
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


def fork_keeping(*keep_fds: int) -> int:
    """os.fork, after flushing the standard streams (nothing buffered is written twice); in the child,
    every descriptor above stderr except `keep_fds` is closed. Returns the child's pid, or 0 in the child.
    The child starts with Ctrl-C and SIGTERM blocked (sent ones wait): it calls `unblock_stops` once its
    own handlers are set."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the mask as it is, changed by nothing
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        pid = os.fork()
    except BaseException:  # no child (EAGAIN, ENOMEM) or a stop taken on the way: the parent's mask is back
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        raise
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        return pid
    low = 3
    for fd in sorted(keep_fds):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _max_fd())
    return 0


def unblock_stops() -> None:
    """In a child of fork_keeping, once its handlers are set: Ctrl-C and SIGTERM reach them (one sent
    meanwhile is taken now)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def end_child(pid: int, wait_s: float, first: signal.Signals | None = None) -> None:
    """Send `first` (if any) to a helper child, give it `wait_s` to end, then SIGKILL; reaped either way."""
    if first is not None:
        _signal(pid, first)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped already
            return
        if done:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    _signal(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # ended already
        pass


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        return 65536
