"""Long runs are simulated in chunks of steps (bounded memory): the numbers must not depend on it."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import compose_run
from harness.sim.outcome import without_wall_clock
from harness.sim.simulate import simulate_run


@pytest.mark.parametrize(
    "overrides",
    [
        ("strategy=eager", "workload.steps=7"),
        ("strategy=pipeline", "workload.steps=7", "workload.warmup_steps=2"),
        ("strategy=acl_graph", "workload=qwen3_30b_decode", "workload.steps=9"),  # build steps among replays
        ("strategy=tiling_cache", "workload=qwen3_30b_decode", "workload.steps=6"),
        ("strategy=async", "workload.serving.enabled=true", "workload.steps=12"),  # releases: idle gaps
    ],
)
def test_chunked_run_equals_one_piece(overrides):
    run = compose_run(*overrides)
    whole = simulate_run(run)
    per_step = whole.summary["tasks_simulated"] // run.workload.steps
    chunked = simulate_run(run, chunk_tasks=2 * per_step)  # two steps per chunk (one when it doesn't fit)
    assert chunked.summary["tasks_simulated"] == whole.summary["tasks_simulated"]
    # The outcome keeps only the drawn steps of a chunked run, simulated again from their start.
    assert chunked.result.graph.n_tasks < whole.result.graph.n_tasks
    for key, value in without_wall_clock(whole.summary).items():
        assert chunked.summary[key] == (pytest.approx(value, rel=1e-12, abs=1e-12) if isinstance(value, float) else value), key
    pd.testing.assert_frame_equal(chunked.steps, whole.steps, rtol=1e-12)
    # The kept window has the very task times of the whole run.
    kept = chunked.result
    steps = np.unique(kept.graph.tasks["step"])
    mine = np.isin(whole.result.graph.tasks["step"], steps)
    assert np.array_equal(kept.start_us, whole.result.start_us[mine])
    assert np.array_equal(kept.end_us, whole.result.end_us[mine])


def test_chunks_are_lowered_and_measured_beside_the_simulation(monkeypatch):
    """A long run lowers the next chunk and measures the previous one in a helper thread; the helper is
    gone when the run returns, so a sweep's launcher may fork after it."""
    import threading

    from harness.sim import lowering, simulate

    threads = {"lower": set(), "measure": set()}
    lower, measure = lowering.Lowering.graph, simulate.StepMeasures.of

    def recorded_lower(self, *args, **kwargs):
        threads["lower"].add(threading.current_thread().name)
        return lower(self, *args, **kwargs)

    def recorded_measure(*args, **kwargs):
        threads["measure"].add(threading.current_thread().name)
        return measure(*args, **kwargs)

    monkeypatch.setattr(lowering.Lowering, "graph", recorded_lower)
    monkeypatch.setattr(simulate.StepMeasures, "of", staticmethod(recorded_measure))
    before = threading.active_count()
    run = compose_run("strategy=eager", "workload.steps=6")
    simulate_run(run, chunk_tasks=1)  # one step per chunk
    assert any(name.startswith("hostbound-chunks") for name in threads["lower"])
    assert {name.split("_")[0] for name in threads["measure"]} == {"hostbound-chunks"}
    assert threading.active_count() == before


def test_a_chunk_that_fails_to_lower_fails_the_run(monkeypatch):
    import threading

    from harness.base.errors import HarnessError
    from harness.sim import lowering

    calls = []
    lower = lowering.Lowering.graph

    def failing_third(self, *args, **kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) == 3:
            raise HarnessError("chunk 3 cannot be lowered")
        return lower(self, *args, **kwargs)

    monkeypatch.setattr(lowering.Lowering, "graph", failing_third)
    before = threading.active_count()
    with pytest.raises(HarnessError, match="chunk 3"):
        simulate_run(compose_run("strategy=eager", "workload.steps=6"), chunk_tasks=1)
    assert threading.active_count() == before
    assert len(calls) == 3  # nothing was lowered after the failure
