"""timeline.png drawn by a forked process while the run simulates (harness.results.drawer):
the same bytes as drawn in the run's own process, drawn here when the child dies, nothing left behind
when the run fails or has nothing to draw."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from conftest import compose_run
from harness.results import drawer as drawer_module
from harness.results.drawer import BackgroundDrawer
from harness.results.timeline import draw_timeline
from harness.sim.simulate import simulate_run


@pytest.fixture(scope="module")
def outcome():
    return simulate_run(compose_run("workload.steps=3"))


def forked(drawer: BackgroundDrawer) -> bool:
    return drawer._pid is not None


def test_the_child_draws_the_same_picture(outcome, tmp_path):
    draw_timeline(outcome, tmp_path / "here.png", 1)
    with BackgroundDrawer() as drawer:
        if not forked(drawer):
            pytest.skip("no fork here (other threads run): the drawer draws in-process")
        drawer.draw(outcome, tmp_path / "child.png", 1)
        drawer.wait()
    assert (tmp_path / "child.png").read_bytes() == (tmp_path / "here.png").read_bytes()


def test_a_dead_child_is_drawn_for_here(outcome, tmp_path):
    with BackgroundDrawer() as drawer:
        if not forked(drawer):
            pytest.skip("no fork here")
        os.kill(drawer._pid, signal.SIGKILL)
        drawer.draw(outcome, tmp_path / "t.png", 1)
        drawer.wait()
    assert (tmp_path / "t.png").stat().st_size > 0


def test_an_error_ends_the_child_and_leaves_no_picture(outcome, tmp_path):
    with pytest.raises(RuntimeError):
        with BackgroundDrawer() as drawer:
            pid = drawer._pid
            raise RuntimeError("the simulation failed")
    assert drawer._pid is None and not list(tmp_path.iterdir())
    if pid is not None:
        with pytest.raises(ChildProcessError):  # reaped: no zombie left
            os.waitpid(pid, os.WNOHANG)


def test_nothing_sent_nothing_drawn(tmp_path):
    with BackgroundDrawer() as drawer:
        drawer.wait()  # a resumed run: the child ends on end of input
    assert drawer._pid is None and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv, starts",
    [
        ([], True),
        (["workload=deepseek_v3", "strategy=eager"], True),
        (["-m", "strategy=eager,acl_graph"], False),
        (["strategy=eager,acl_graph"], False),  # a sweep's values: Hydra refuses it without -m, nothing to draw
        (["hydra.mode=MULTIRUN"], False),
        (["--cfg", "job"], False),
        (["output.timeline_steps=0"], False),
    ],
)
def test_the_early_child_is_forked_for_single_runs_only(monkeypatch, argv, starts):
    if starts and threading.active_count() != 1:
        pytest.skip("other threads run here: forking them is unsafe, so nothing is forked")
    monkeypatch.setattr(drawer_module, "_early", None)
    drawer_module.start_early(argv)
    early = drawer_module._early
    try:
        assert (early is not None) == starts
    finally:
        drawer_module._end_early()
    if early is not None:
        with pytest.raises(ChildProcessError):  # ended and reaped
            os.waitpid(early[0], os.WNOHANG)


def test_a_drawer_takes_the_early_child_and_it_draws(outcome, tmp_path, monkeypatch):
    monkeypatch.setattr(drawer_module, "_early", None)
    drawer_module.start_early([])
    early = drawer_module._early
    if early is None:
        pytest.skip("no fork here")
    draw_timeline(outcome, tmp_path / "here.png", 1)
    with BackgroundDrawer() as drawer:
        assert drawer._pid == early[0] and drawer_module._early is None
        drawer.draw(outcome, tmp_path / "child.png", 1)
        drawer.wait()
    assert (tmp_path / "child.png").read_bytes() == (tmp_path / "here.png").read_bytes()


def test_a_child_ended_while_drawing_leaves_no_temporary_file(outcome, tmp_path):
    """A run that fails after sending its window (a full disk writing trace.json) ends the drawing
    process: SIGTERM unwinds it, and whatever it had half-written is gone."""
    for attempt in range(3):  # the child may be importing, drawing or done: none may leave a temporary file
        folder = tmp_path / str(attempt)
        folder.mkdir()
        with pytest.raises(RuntimeError):
            with BackgroundDrawer() as drawer:
                if not forked(drawer):
                    pytest.skip("no fork here")
                drawer.draw(outcome, folder / "timeline.png", 1)
                time.sleep(0.05 * attempt)
                raise RuntimeError("trace.json: File too large")
        assert not [p for p in folder.iterdir() if ".tmp" in p.name]


def test_a_stop_sent_before_a_child_sets_its_handlers_waits_for_them():
    """A helper child ended at once (a command refusing its input right after forking it) used to take
    SIGTERM with the parent's handler, which raised a stop inside os.fork and unwound the parent's code in
    the child. Now the signal waits until the child has set its own handler: here the child is still
    asleep when SIGTERM arrives, and ends by its own handler (status 7), not by the parent's (3)."""
    from harness.base.forking import can_fork, fork_keeping, unblock_stops

    if not can_fork():
        pytest.skip("other threads run here: forking them is unsafe")

    class ParentsStop(Exception):
        pass

    def parents_handler(signum, frame):
        raise ParentsStop

    previous = signal.signal(signal.SIGTERM, parents_handler)
    try:
        pid = fork_keeping()
        if pid == 0:  # the child: never returns
            try:
                time.sleep(0.3)
                signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(7))
                unblock_stops()
                time.sleep(5)
                os._exit(0)
            except BaseException:
                os._exit(3)
        assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the parent's mask is back
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert os.waitstatus_to_exitcode(status) == 7


def test_a_failed_fork_leaves_the_parents_signals_as_they_were(monkeypatch):
    from harness.base.forking import fork_keeping

    def no_child():
        raise BlockingIOError("fork: resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_child)
    with pytest.raises(BlockingIOError):
        fork_keeping()
    assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_the_drawing_child_takes_sigterm_by_its_own_handler():
    """The child set its handler and unblocked the stops: SIGTERM ends it at once with 128 + 15, where a
    child that never unblocked would sit on the signal until its parent's grace ran out and it was killed."""
    drawer_module._early = None
    drawer_module.start_early([])
    early = drawer_module._early
    if early is None:
        pytest.skip("no fork here")
    drawer_module._early = None
    pid, write_end = early
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 128 + signal.SIGTERM
    finally:
        os.close(write_end)
