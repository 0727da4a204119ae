"""Laws of the work's size, on every hardware preset (tests/test_laws.py says why laws are tests): a decode
step over a longer context is never faster, a larger batch never takes less time a step, and a faster
link or a wider memory never slows a step. A file of its own so that the suite's workers share the laws.
"""
from __future__ import annotations

import dataclasses

import pytest

from conftest import compose_run
from harness.config.schema import RunConfig
from harness.sim.simulate import simulate_run
from test_laws import HARDWARE, SLACK, STEPS, WORKLOADS, graph_strategy, step_ms, summary


def non_decreasing(times: list[float]) -> bool:
    return all(later >= earlier * (1 - SLACK) for earlier, later in zip(times, times[1:]))


@pytest.mark.parametrize("strategy", ["eager", "graph"])
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_longer_context_never_makes_a_decode_step_faster(hardware, workload, strategy):
    strategy = graph_strategy(hardware) if strategy == "graph" else strategy
    contexts = [128, 1024, 4096]
    times = [step_ms(f"hardware={hardware}", f"workload={workload}", f"strategy={strategy}", "workload.batch_size=8",
                     f"workload.context_len={context}") for context in contexts]
    assert non_decreasing(times), f"context {contexts}: {times}"


@pytest.mark.parametrize("strategy", ["eager", "graph"])
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_larger_batch_never_takes_less_time_a_step(hardware, workload, strategy):
    """At capture sizes (no padding): more sequences are more work for every op."""
    strategy = graph_strategy(hardware) if strategy == "graph" else strategy
    batches = [1, 2, 4, 8, 16, 32, 64]
    times = [step_ms(f"hardware={hardware}", f"workload={workload}", f"strategy={strategy}", f"workload.batch_size={batch}")
             for batch in batches]
    assert non_decreasing(times), f"batch {batches}: {times}"


def _step_with(hardware: str, overrides: tuple, change) -> float:
    run: RunConfig = compose_run(f"hardware={hardware}", *overrides, STEPS)
    return simulate_run(change(run)).summary["step_ms_p50"]


@pytest.mark.parametrize("hardware", HARDWARE)
def test_more_memory_bandwidth_or_a_faster_link_never_slows_a_step(hardware):
    """Qwen3-30B-A3B at TP 4 with EP (collectives on the scale-up link) as a graph: the device-bound case."""
    overrides = ("workload=qwen3_30b_decode", f"strategy={graph_strategy(hardware)}", "workload.batch_size=16")

    def device(factor: float):
        return lambda run: dataclasses.replace(run, hardware=dataclasses.replace(
            run.hardware, device=dataclasses.replace(run.hardware.device, hbm_gbps=run.hardware.device.hbm_gbps * factor)))

    def link(factor: float):
        return lambda run: dataclasses.replace(run, hardware=dataclasses.replace(
            run.hardware, link=dataclasses.replace(run.hardware.link, scaleup_gbps=run.hardware.link.scaleup_gbps * factor)))

    for change in (device, link):
        times = [_step_with(hardware, overrides, change(factor)) for factor in (2.0, 1.0, 0.5)]
        assert non_decreasing(times), f"{change.__name__} x2, x1, x0.5: {times}"


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_batch_padded_into_a_larger_graph_is_never_faster_than_one_captured_at_its_size(hardware, workload):
    """Batches 3 and 12 replayed from the graphs of 4 and 16 (padding rows are work) against graphs captured
    at 3 and 12: the block-split rule's own times had the padded batch ~1.6 % faster on b200 and mi300x."""
    graph = f"strategy={graph_strategy(hardware)}"
    for batch, sizes in ((3, "[1,2,3,4,8]"), (12, "[1,2,4,8,12,16]")):
        common = (f"hardware={hardware}", f"workload={workload}", graph, f"workload.batch_size={batch}")
        exact = summary(*common, f"strategy.graph.buckets={sizes}")
        padded = summary(*common)
        # (a MoE graph pads each expert's rows either way: the exact graph wastes a little too)
        assert padded["padding_waste"] > exact["padding_waste"], (padded.get("graph_note"), exact.get("graph_note"))
        assert padded["step_ms_p50"] >= exact["step_ms_p50"] * (1 - SLACK), f"batch {batch}: padded {padded['step_ms_p50']} < exact {exact['step_ms_p50']}"
