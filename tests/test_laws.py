"""Physical laws every hardware preset must keep: a what-if with the wrong sign is worse than none.

Each law compares runs that differ in one thing, on every hardware preset and a dense and a MoE decode
model, at steady state (graph builds and warm-up left out of the measured steps):
- graph replay is never slower than eager at the same batch, without padding (the batch is a capture size);
- the graph's gain shrinks as the batch grows (host work is per op, device work grows with the batch);
- more AI cores (SMs) are never slower; a faster host is never slower; fewer host threads are never faster.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest

from conftest import compose_run
from harness.config.paths import CONF_DIR
from harness.config.schema import GRAPH_STRATEGY_OF, RunConfig
from harness.sim.simulate import simulate_run

HARDWARE = sorted(p.stem for p in (CONF_DIR / "hardware").glob("*.yaml"))
# A dense model (Llama-3.1-8B) and a MoE one (Qwen3-30B-A3B): few steps, what a law needs.
WORKLOADS = ["llama31_8b_decode", "qwen3_30b_decode"]
STEPS = "workload.steps=6"
# Batches that are capture sizes (no padding) and fit every preset's HBM with these models.
BATCHES = [1, 8, 64]
SLACK = 1e-9  # relative: float sums in another order


@lru_cache(maxsize=None)
def step_ms(*overrides: str) -> float:
    return simulate_run(compose_run(*overrides, STEPS)).summary["step_ms_p50"]


def graph_strategy(hardware: str) -> str:
    return GRAPH_STRATEGY_OF[compose_run(f"hardware={hardware}").hardware.platform]


def test_every_hardware_preset_is_covered():
    assert {"atlas_a2", "h100", "h200"} <= set(HARDWARE)


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_graph_replay_is_never_slower_than_eager_at_the_same_batch(hardware, workload):
    for batch in BATCHES:
        common = (f"hardware={hardware}", f"workload={workload}", f"workload.batch_size={batch}")
        eager = step_ms(*common, "strategy=eager")
        graph = step_ms(*common, f"strategy={graph_strategy(hardware)}")
        assert graph <= eager * (1 + SLACK), f"batch {batch}: graph {graph:.4f} ms > eager {eager:.4f} ms"


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_the_graph_gain_shrinks_as_the_batch_grows(hardware, workload):
    gains = []
    for batch in BATCHES:
        common = (f"hardware={hardware}", f"workload={workload}", f"workload.batch_size={batch}")
        gains.append(step_ms(*common, "strategy=eager") / step_ms(*common, f"strategy={graph_strategy(hardware)}"))
    assert all(later <= earlier * (1 + SLACK) for earlier, later in zip(gains, gains[1:])), f"eager/graph by batch {BATCHES}: {gains}"


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
    for workload in WORKLOADS:
        for batch in (1, 64):
            def cores(factor: float):
                def change(run: RunConfig) -> RunConfig:
                    device = run.hardware.device  # the peaks stay those of the rated cores: more cores, more compute
                    return with_device(run, ai_cores=max(1, int(device.ai_cores * factor)), rated_cores=device.cores_rated)
                return run_with(hardware, workload, strategy, batch, change)

            times = [cores(f) for f in (0.5, 1.0, 2.0)]
            assert times[0] >= times[1] * (1 - SLACK) >= times[2] * (1 - SLACK) ** 2, f"{workload} batch {batch}: {times}"


HOST_COSTS = ("framework_us", "infer_shape_us", "tiling_us", "alloc_us", "launch_us", "free_us", "sync_us", "param_write_us",
              "packed_params_us", "driver_alloc_us", "tiling_lookup_us")


@pytest.mark.parametrize("strategy", ["eager", "async", "pipeline", "graph"])
@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_faster_host_is_never_slower(hardware, strategy):
    strategy = graph_strategy(hardware) if strategy == "graph" else strategy
    for batch in (1, 64):
        def host_speed(factor: float):
            def change(run: RunConfig) -> RunConfig:
                host = run.hardware.host
                return with_host(run, **{key: getattr(host, key) / factor for key in HOST_COSTS}, cpu_gflops=host.cpu_gflops * factor)
            return run_with(hardware, "llama31_8b_decode", strategy, batch, change)

        times = [host_speed(f) for f in (0.5, 1.0, 2.0)]
        assert times[0] >= times[1] * (1 - SLACK) >= times[2] * (1 - SLACK) ** 2, f"batch {batch}: {times}"


@pytest.mark.parametrize("strategy", ["eager", "async", "pipeline", "graph"])
@pytest.mark.parametrize("hardware", HARDWARE)
def test_fewer_host_threads_are_never_faster(hardware, strategy):
    strategy = graph_strategy(hardware) if strategy == "graph" else strategy
    times = [run_with(hardware, "llama31_8b_decode", strategy, 8, lambda run, n=n: with_host(run, threads=n)) for n in (8, 4, 2, 1)]
    assert all(fewer >= more * (1 - SLACK) for more, fewer in zip(times, times[1:])), f"threads 8/4/2/1: {times}"
