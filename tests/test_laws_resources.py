"""Physical laws of the host and device resources, on every hardware preset (tests/test_laws.py has the
graph laws and says why laws are tests): more AI cores (SMs) are never slower, a faster host is never
slower, fewer host threads are never faster. A file of its own so that the suite's workers share the laws.
"""
from __future__ import annotations

import dataclasses

import pytest

from conftest import compose_run
from harness.config.schema import RunConfig
from harness.sim.simulate import simulate_run
from test_laws import HARDWARE, SLACK, STEPS, graph_strategy

def run_with(hardware: str, workload: str, strategy: str, batch: int, change) -> float:
    run: RunConfig = compose_run(f"hardware={hardware}", f"workload={workload}", f"strategy={strategy}", f"workload.batch_size={batch}", STEPS)
    return simulate_run(change(run)).summary["step_ms_p50"]


def with_device(run: RunConfig, **values) -> RunConfig:
    return dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, device=dataclasses.replace(run.hardware.device, **values)))


def with_host(run: RunConfig, **values) -> RunConfig:
    return dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, host=dataclasses.replace(run.hardware.host, **values)))


@pytest.mark.parametrize("strategy", ["eager", "graph"])
@pytest.mark.parametrize("hardware", HARDWARE)
def test_more_ai_cores_are_never_slower(hardware, strategy):
    strategy = graph_strategy(hardware) if strategy == "graph" else strategy
    for workload in ("llama31_8b_decode",):  # dense; the MoE model's cores law adds nothing but time
        for batch in (1, 64):
            def cores(factor: float):
                def change(run: RunConfig) -> RunConfig:
                    device = run.hardware.device  # the peaks stay those of the rated cores: more cores, more compute
                    return with_device(run, ai_cores=max(1, int(device.ai_cores * factor)), rated_cores=device.cores_rated)
                return run_with(hardware, workload, strategy, batch, change)

            times = [cores(f) for f in (0.5, 1.0, 2.0)]
            assert times[0] >= times[1] * (1 - SLACK) >= times[2] * (1 - SLACK) ** 2, f"{workload} batch {batch}: {times}"


@pytest.mark.parametrize("strategy", ["eager", "async", "graph"])  # pipeline: async's queue plus threads (below)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_faster_host_is_never_slower(hardware, strategy):
    strategy = graph_strategy(hardware) if strategy == "graph" else strategy
    for batch in (1, 64):
        def host_speed(factor: float):
            return run_with(hardware, "llama31_8b_decode", strategy, batch, lambda run: with_host(run, speed=run.hardware.host.speed * factor))

        times = [host_speed(f) for f in (0.5, 1.0, 2.0)]
        assert times[0] >= times[1] * (1 - SLACK) >= times[2] * (1 - SLACK) ** 2, f"batch {batch}: {times}"


@pytest.mark.parametrize("strategy", ["async", "pipeline", "graph"])  # eager uses one host thread whatever the count
@pytest.mark.parametrize("hardware", HARDWARE)
def test_fewer_host_threads_are_never_faster(hardware, strategy):
    strategy = graph_strategy(hardware) if strategy == "graph" else strategy
    times = [run_with(hardware, "llama31_8b_decode", strategy, 8, lambda run, n=n: with_host(run, threads=n)) for n in (8, 4, 2, 1)]
    assert all(fewer >= more * (1 - SLACK) for more, fewer in zip(times, times[1:])), f"threads 8/4/2/1: {times}"
