"""A single run's MLflow logging, done by a process forked as the command starts.

Importing MLflow and opening its store take ~2 s of a tracked default run, longer than everything else
it does. `python -m harness` therefore forks this process first (`start_early`): it imports MLflow
while the run composes and simulates, opens the store as soon as the run knows its tracking config
(`open_store`, at the start of the job), and logs the run when its files are written (`log_run_or_mark`,
the same function, called there; its run id or its TrackingError comes back). Where no such process is
there (a sweep's job, a test, `hostbound` under threads), the run logs in its own process as before.

Stopping: Ctrl-C is the run's to handle (ignored here); once the store is being opened, a run that
ends closes the connection and waits for this process to finish what it is writing (bounded), so an
MLflow run is never left RUNNING by it. Before that, it is killed. Only the standard library is
imported at the top: this module is loaded before anything else of a command.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import signal
import socket
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from harness.base.forking import can_fork, end_child, fork_keeping, single_run, unblock_stops

if TYPE_CHECKING:
    from harness.config.schema import TrackingConfig

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!Q")
# Seconds a run's exit waits for the logging process beyond tracking.timeout_s (a sqlite store's lock).
_EXIT_GRACE_S = 30.0


class _Child:
    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock = pid, sock
        self.opened = False  # the store is being opened or written: end it gently
        self.wait_s = _EXIT_GRACE_S


_child: _Child | None = None
# The run folders this command has logged (here or by the logging process): a stop says which are not.
logged_run_dirs: set[str] = set()


def start_early(argv: list[str]) -> None:
    """Fork the logging process, for a single run that may be tracked: not for sweeps (their workers
    log), Hydra's information flags or `tracking.enabled=false`."""
    global _child
    if _child is not None or not can_fork() or not single_run(argv, "tracking.enabled=false"):
        return
    mine, theirs = socket.socketpair()
    pid = fork_keeping(theirs.fileno())
    if pid == 0:  # never returns
        mine.detach()  # closed by fork_keeping already
        _serve(theirs)
    theirs.close()
    _child = _Child(pid, mine)
    atexit.register(_end)


def open_store(tracking: "TrackingConfig") -> None:
    """Have the logging process open the store and make the experiment now, while the run simulates."""
    if _child is None:
        return
    try:
        _send(_child.sock, ("open", tracking))
        _child.opened = True
        _child.wait_s = tracking.timeout_s + _EXIT_GRACE_S
    except OSError:  # gone: the run logs in its own process
        _drop()


def log_run_or_mark(tracking: "TrackingConfig", run_dir: Path, *args: Any) -> str:
    """harness.tracking.store.log_run_or_mark, done by the logging process when there is one; the same
    return value or TrackingError. If that process is gone, done here."""
    from harness.base.errors import TrackingError
    from harness.base.stopping import store_call

    child = _child
    if child is not None:
        try:
            with store_call():  # SIGTERM waits for the run to be logged, as when logging here
                _send(child.sock, ("log", (tracking, run_dir, *args)))
                child.opened = True
                reply = _receive(child.sock)
                if reply[0] == "logged":
                    logged_run_dirs.add(str(run_dir))
        except (OSError, EOFError):
            reply = None
        if reply is not None:
            kind, *values = reply
            if kind == "logged":
                log.info("logged MLflow run %s to %s", values[0], values[1])
                return values[0]
            raise TrackingError(*values)
        _drop()
    from harness.tracking import store

    with store_call():  # a stop is raised once the run is logged and recorded as such
        run_id = store.log_run_or_mark(tracking, run_dir, *args)
        logged_run_dirs.add(str(run_dir))
    return run_id


def _drop() -> None:
    """The logging process failed: reap it, log here from now on."""
    global _child
    child, _child = _child, None
    if child is not None:
        child.sock.close()
        end_child(child.pid, 0.0)


def _end() -> None:
    """At exit: a process still importing is killed; one that may be writing to the store is told
    there is nothing more (end of input) and waited for."""
    global _child
    child, _child = _child, None
    if child is None:
        return
    if not child.opened:
        end_child(child.pid, 0.0)
        child.sock.close()
        return
    child.sock.close()
    end_child(child.pid, child.wait_s)


def _send(sock: socket.socket, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _receive(sock: socket.socket) -> Any:
    (size,) = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
    return pickle.loads(_read_exactly(sock, size))


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    parts, left = [], size
    while left:
        part = sock.recv(min(left, 1 << 20))
        if not part:
            raise EOFError
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _serve(sock: socket.socket) -> NoReturn:
    """The logging process: import MLflow, then open the store and log runs as asked, until end of input."""
    status = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's; it ends this process gently
        from harness.base.stopping import stop_with

        # While importing, SIGTERM ends the process at once: nothing is open yet, and an exit raised inside
        # the import machinery's callbacks was printed on the shared terminal ("Exception ignored in:
        # _get_module_lock …"). Then it unwinds between store calls, as in the run's process.
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))
        unblock_stops()
        from harness.base.errors import TrackingError
        from harness.tracking import store

        store.mlflow_module()
        import mlflow.entities  # noqa: F401  what log_run uses, imported before it is asked
        import mlflow.tracking.context.registry  # noqa: F401

        signal.signal(signal.SIGTERM, lambda signum, frame: stop_with(SystemExit(128 + signum)))

        failed_open: tuple | None = None  # (the tracking config, why) of an open that failed
        while True:
            try:
                kind, payload = _receive(sock)
            except EOFError:
                break
            if kind == "open":
                try:
                    store.bound_requests(payload)
                    store.ensure_experiment(payload)
                except Exception as exc:  # said when the run is logged, without asking the store again
                    # A store that did not answer the open cost the run tracking.timeout_s already; trying
                    # again when logging doubled that (a database that is down: minutes). The run is marked
                    # with this reason instead, as a sweep's later jobs are (FAILED_ENV).
                    failed_open = (payload, f"tracking.uri={store.resolve_uri(payload)}: {store.short_reason(exc)}")
            elif kind == "log":
                tracking = payload[0]
                if failed_open is not None and failed_open[0] == tracking:
                    os.environ[store.FAILED_ENV] = failed_open[1]
                try:
                    run_id = store.log_run_or_mark(*payload)
                    reply: tuple = ("logged", run_id, store.resolve_uri(tracking))
                except TrackingError as exc:
                    reply = ("failed", str(exc), exc.reason)
                except BaseException:  # stopped (SIGTERM) while logging: the run's MLflow run ended FAILED
                    command = store.later_command(payload[1], tracking)
                    reason = "stopped while logging"
                    reply = ("failed", f"tracking failed, the run's files are kept ({reason}); log it later: {command}", reason)
                    status = 1
                _send(sock, reply)
                if status:
                    break
    except BaseException:
        status = 1
    finally:
        os._exit(status)
