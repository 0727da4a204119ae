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


@pytest.mark.parametrize("hardware", HARDWARE)
def test_packing_a_kernels_parameters_never_makes_its_launch_slower(hardware):
    """Parameter packing writes a kernel's parameters at once (seed 002): on the CUDA and ROCm presets it cost
    0.5 µs where writing a kernel's 10 one by one costs 0.3, and every launch got slower with it on."""
    from harness.sim.lowering import host_stage_costs
    from harness.model.workload import build_workload

    run = compose_run(f"hardware={hardware}", "workload=llama31_8b_decode", "+workload.card_overrides.num_hidden_layers=1", "workload.steps=1")
    workload = build_workload(run.workload)
    launch = {packing: host_stage_costs(workload, run.hardware, dataclasses.replace(run.strategy, param_packing=packing))["launch"]
              for packing in (False, True)}
    assert (launch[True] <= launch[False] + 1e-12).all(), f"packed {launch[True].max()} µs, one by one {launch[False].min()} µs"
    times = [run_with(hardware, "llama31_8b_decode", "eager", 1, lambda run, p=p: dataclasses.replace(run, strategy=dataclasses.replace(run.strategy, param_packing=p)))
             for p in (False, True)]
    assert times[1] <= times[0] * (1 + SLACK), f"one by one, packed: {times}"
