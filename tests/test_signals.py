"""Ctrl-C and SIGTERM at any moment of any command (docs/reliability.md, "Stopping a command").

Each case starts a command in its own process group, as a terminal's foreground job, and signals the
whole group after a delay spread over the command's own duration (measured first, on this machine), so
that start-up, simulation, writing and logging are each hit. Whatever the moment: one line saying so,
no traceback, the process ends by the signal (a shell's 130 / 143), no helper process left, no MLflow
run left RUNNING, every file whole (no temporary file left), and a run that says it was not logged can
be logged by the command the line gives.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.base import errors, stopping

ENV = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
STOP_LINE = {signal.SIGINT: "hostbound: error: stopped by SIGINT (Ctrl-C)", signal.SIGTERM: "hostbound: error: stopped by SIGTERM"}


def _group_left(pgid: int) -> list[int]:
    """Processes of the process group `pgid` still running (zombies have ended)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            left.append(int(stat.parent.name))
    return left


def _statuses(database: Path) -> list[str]:
    if not database.exists():
        return []
    with sqlite3.connect(database) as con:
        try:
            return [status for (status,) in con.execute("SELECT status FROM runs")]
        except sqlite3.OperationalError:  # the store's tables were never made
            return []


def _signals_taken(pid: int) -> bool:
    """Whether process `pid` has its own SIGTERM handler: the command's code runs (harness.base.stopping). Before
    it, the interpreter starts (its site module, the editable install's finder): a Ctrl-C there is Python's
    own "Fatal Python error: init_import_site", as for any Python program, which no command can change."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    except OSError:
        return True  # ended
    return bool(int(fields["SigCgt"], 16) & (1 << (signal.SIGTERM - 1)))


def run_and_stop(args: list[str], cwd: Path, sig: signal.Signals | None, delay_s: float) -> tuple[subprocess.Popen, str, bool]:
    """Run `python -m <args>` in a group of its own, signal the group `delay_s` after the command has taken
    its signals (None: let it end). Returns the process, its stderr, and whether the signal was sent before
    the command ended."""
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    sent = False
    if sig is not None:
        deadline = time.monotonic() + 60
        while not _signals_taken(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        taken = time.monotonic()
        try:
            proc.wait(timeout=delay_s)
            proc.ran_s = time.monotonic() - taken  # type: ignore[attr-defined]  # from its signals taken to its end
        except subprocess.TimeoutExpired:
            # A process that ended since the wait timed out is a zombie, which a signal does not reach: not sent
            # (a CI run counted one as stopped, and its exit 0 as a lost signal).
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                os.killpg(proc.pid, sig)
                sent = True
    _, err = proc.communicate(timeout=180)
    deadline = time.monotonic() + 10
    while _group_left(proc.pid) and time.monotonic() < deadline:  # helpers end within their grace
        time.sleep(0.1)
    assert _group_left(proc.pid) == [], f"processes of {args[0]} left running after it ended: {err[-2000:]}"
    return proc, err, sent


def assert_stopped_cleanly(proc: subprocess.Popen, err: str, sig: signal.Signals, folder: Path) -> str:
    """The checks every stop must pass; returns the stop's line."""
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert proc.returncode == -sig, f"exit {proc.returncode}: {err[-2000:]}"
    lines = [line for line in err.splitlines() if line.startswith("hostbound") and " error: " in line]
    assert lines and lines[-1].startswith(STOP_LINE[sig]), err[-2000:]
    assert len(lines) == 1, f"more than the stop's line: {lines}"  # no false "bad input" before it
    assert list(folder.rglob(".*.tmp*")) == [], "a temporary file was left"
    for summary in folder.rglob("summary.json"):
        json.loads(summary.read_text())  # whole, or not there
    return lines[-1]


@pytest.fixture(scope="module")
def run_duration_s(tmp_path_factory) -> float:
    """How long a default tracked run takes here, start to end (the signals are spread over it)."""
    folder = tmp_path_factory.mktemp("whole")
    started = time.monotonic()
    proc, err, _ = run_and_stop(["harness", f"hydra.run.dir={folder / 'run'}", f"tracking.uri=sqlite:///{folder / 'mlflow.db'}"],
                                folder, None, 0)
    assert proc.returncode == 0, err[-2000:]
    assert _statuses(folder / "mlflow.db") == ["FINISHED"]
    return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_run_stopped_at_any_moment_ends_in_one_line_by_the_signal(sig, run_duration_s, tmp_path):
    """Nine moments from the first tenth of a second to the end of the run's logging."""
    fractions = [0.02, 0.1, 0.2, 0.35, 0.5, 0.62, 0.74, 0.86, 0.96]
    stopped, said = 0, set()
    duration_s = run_duration_s
    for i, fraction in enumerate(fractions):
        folder = tmp_path / f"at{i}"
        folder.mkdir()
        database = folder / "mlflow.db"
        proc, err, sent = run_and_stop(["harness", f"hydra.run.dir={folder / 'run'}", f"tracking.uri=sqlite:///{database}"],
                                       folder, sig, fraction * duration_s)
        assert "RUNNING" not in _statuses(database), err[-2000:]
        if not sent or proc.returncode == 0:  # ended before the signal came
            assert proc.returncode == 0 and _statuses(database) == ["FINISHED"], err[-2000:]
            # The run took less than measured (another test's load is gone): later moments are spread over this one.
            duration_s = min(duration_s, getattr(proc, "ran_s", duration_s))
            continue
        stopped += 1
        line = assert_stopped_cleanly(proc, err, sig, folder)
        said.add(next((phase for phase in ("unfinished run", "not logged", "finished run") if phase in line), "nothing yet"))
        if "not logged to MLflow: " in line:  # the command it gives logs the run
            command = shlex.split(line.split("not logged to MLflow: ", 1)[1])
            assert command[:3] == ["python", "-m", "harness.tracking"]
            logged = subprocess.run([sys.executable, *command[1:], "--uri", f"sqlite:///{database}"], env=ENV,
                                    capture_output=True, text=True, timeout=120)
            assert logged.returncode == 0, logged.stderr[-2000:]
            assert _statuses(database) == ["FINISHED"]
        elif "holds the finished run" in line:
            assert _statuses(database) == ["FINISHED"], "the line says logged, the store does not hold it"
        else:
            assert _statuses(database) == [], "a run the line calls unfinished is in the store"
    assert stopped >= 5, f"only {stopped} of {len(fractions)} moments came before the run ended"
    assert len(said) >= 2, f"the moments hit only one phase: {said}"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_run_stopped_after_its_summary_says_it_holds_the_finished_run(sig, tmp_path):
    """The moment the summary is printed the run is logged; what remains is the exit (helpers waited for).
    A stop then said nothing about the folder ("stopped by SIGTERM", 1 in 18 stops of a CI run)."""
    database = tmp_path / "mlflow.db"
    proc = subprocess.Popen([sys.executable, "-m", "harness", f"hydra.run.dir={tmp_path / 'run'}", f"tracking.uri=sqlite:///{database}"],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    for line in proc.stdout:
        if line.startswith("  outputs "):  # the summary's last line
            os.killpg(proc.pid, sig)
            break
    _, err = proc.communicate(timeout=180)
    if proc.returncode == 0:  # it had ended: nothing to check but the run
        assert _statuses(database) == ["FINISHED"]
        return
    line = assert_stopped_cleanly(proc, err, sig, tmp_path)
    assert line.endswith(f"{tmp_path / 'run'} holds the finished run"), line
    assert _statuses(database) == ["FINISHED"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("finished")
    proc = subprocess.run([sys.executable, "-m", "harness", f"hydra.run.dir={folder / 'run'}", "tracking.enabled=false",
                           "output.trace_steps=0"], cwd=folder, env=ENV, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return folder / "run"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["profile", "report", "repro", "tracking", "export_ops", "advise"])
def test_every_other_command_stopped_ends_in_one_line_by_the_signal(command, finished_run, tmp_path):
    trace = Path(__file__).parent / "data" / "traces"
    args = {
        "profile": ["harness.profile", str(trace / "tl_qwen05b_mi300.json.gz"), "--out", str(tmp_path / "profile")],
        "report": ["harness.report", str(finished_run.parent), "--out", str(tmp_path / "report")],
        "repro": ["harness.repro", "--out", str(tmp_path / "repro")],
        "tracking": ["harness.tracking", "log", str(finished_run), "--uri", f"sqlite:///{tmp_path / 'mlflow.db'}"],
        "export_ops": ["harness.export_ops", "--out", str(tmp_path / "ops.csv")],
        "advise": ["harness.advise", f"advise.out={tmp_path / 'advice'}"],
    }[command]
    for sig, delay_s in ((signal.SIGINT, 0.3), (signal.SIGTERM, 1.2), (signal.SIGINT, 2.5)):
        proc, err, sent = run_and_stop(args, tmp_path, sig, delay_s)
        if not sent:
            assert proc.returncode == 0, err[-2000:]
            continue
        assert_stopped_cleanly(proc, err, sig, tmp_path)
        assert "RUNNING" not in _statuses(tmp_path / "mlflow.db")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_advice_stopped_while_its_workers_simulate_ends_them(sig, tmp_path):
    """The advice's simulations run on processes forked from it: a stop while they run ends every one."""
    space = "{strategy:[eager,async,pipeline,acl_graph],workload.batch_size:[" + ",".join(map(str, range(1, 41))) + "]}"
    proc = subprocess.Popen([sys.executable, "-m", "harness.advise", f"advise.space={space}", "advise.workers=2",
                             f"advise.out={tmp_path / 'advice'}", "tracking.enabled=false"],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "simulating on 2 worker processes" in line:
            time.sleep(0.5)  # the workers are simulating
            assert len(_group_left(proc.pid)) == 3, "the advice and its two workers"
            os.killpg(proc.pid, sig)
            break
    _, err = proc.communicate(timeout=60)
    err = "".join(seen) + err
    deadline = time.monotonic() + 10
    while _group_left(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group_left(proc.pid) == [], "a worker was left running"
    assert_stopped_cleanly(proc, err, sig, tmp_path)
    assert not (tmp_path / "advice" / "advice.md").exists()


def test_a_stop_swallowed_on_its_way_up_still_ends_the_command(monkeypatch):
    """A stop raised inside a `__del__` is printed as 'Exception ignored' and lost: the command went on, and an
    error it then met was reported as bad input. The stop stays requested: the next safe point and any
    error line end the command by the stop instead."""
    monkeypatch.setattr(stopping, "_requested", None)
    monkeypatch.setattr(stopping, "_said", False)
    with stopping.held():  # as during the imports: recorded, not raised
        stopping._stop(signal.SIGINT, None)
    assert isinstance(stopping.requested(), stopping.Stopped) and stopping.requested().signum == signal.SIGINT
    with pytest.raises(stopping.Stopped):
        stopping.raise_if_stopped()
    with pytest.raises(stopping.Stopped):
        errors.fail("workload.batch_size=x: not a number")  # not the user's fault: the stop's
    stopping._stop(signal.SIGTERM, None)  # a second signal while the first unwinds changes nothing
    assert stopping.requested().signum == signal.SIGINT


def test_a_stop_that_comes_while_the_command_exits_is_recorded_for_the_exit_not_raised(monkeypatch):
    """Once exit_now has done the teardown, a handler run on its last calls used to raise Stopped out of
    exit_now (a traceback after the work was done); it is recorded and exit_now ends by it."""
    import inspect

    source = inspect.getsource(stopping.exit_now)  # set while the teardown's stops are still held back
    assert source.index("_exiting = True") < source.index("pthread_sigmask") and "        _exiting = True" in source
    monkeypatch.setattr(stopping, "_requested", None)
    monkeypatch.setattr(stopping, "_exiting", True)
    stopping._stop(signal.SIGTERM, None)  # would raise Stopped outside a store call before the exit
    assert stopping.requested() is not None and stopping.requested().signum == signal.SIGTERM
    monkeypatch.setattr(stopping, "_requested", None)
    monkeypatch.setattr(stopping, "_exiting", False)
    with pytest.raises(stopping.Stopped):
        stopping._stop(signal.SIGTERM, None)
