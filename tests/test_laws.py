"""Physical laws every hardware preset must keep: a what-if with the wrong sign is worse than none.

Each law compares runs that differ in one thing, on every hardware preset and a dense and a MoE decode
model, at steady state (graph builds and warm-up left out of the measured steps):
- graph replay is never slower than eager at the same batch, without padding (the batch is a capture size);
- the graph's gain shrinks as the batch grows (host work is per op, device work grows with the batch);
- a piecewise graph (attention launched eagerly between captured pieces) is never slower than eager
  by more than what leaving its pieces costs the device (`graph.exit_gap_us` a piece: 0 but on mi300x,
  whose measured 11.4 µs can outweigh eager's kernel gaps in a device-bound step): it does a subset of
  eager's host work, and its pieces' tasks pay the graph's gap, not the eager one; nor is it faster than
  the whole step as one graph, which does the same with one launch and no eager kernels; a longer exit gap
  never speeds a step, and changes only steps with eager kernels after graph pieces;
- more AI cores, a faster host, more host threads never slower: tests/test_laws_resources.py;
- a faster device or link, a deeper host queue, a larger tiling cache, fusion never slower, a longer prompt
  never faster: tests/test_laws_knobs.py;
- a longer context, a larger batch, padding never faster, more bandwidth never slower: tests/test_laws_sizes.py.
The graph laws hold for the programs users compare too (`test_the_graph_laws_hold_for_other_programs`):
HF transformers' own kernels and a serving engine's host work around the model. They compare one program:
HF's eager decode with its DynamicCache copies the whole KV cache every step (`workload.kv_cache=dynamic`,
what `auto` picks for eager) where a captured step writes one token in place, so there the graph's gain
may grow with the batch; the law is stated with the static cache on both sides.
"""
from __future__ import annotations

from functools import lru_cache

import pytest

from conftest import compose_run
from harness.config.paths import CONF_DIR
from harness.config.schema import GRAPH_STRATEGY_OF
from harness.sim.simulate import simulate_run

HARDWARE = sorted(p.stem for p in (CONF_DIR / "hardware").glob("*.yaml"))
# A dense model (Llama-3.1-8B) and a MoE one (Qwen3-30B-A3B): few steps, what a law needs.
WORKLOADS = ["llama31_8b_decode", "qwen3_30b_decode"]
STEPS = "workload.steps=4"
# Batches that are capture sizes (no padding) and fit every preset's HBM with these models.
BATCHES = [1, 8, 64]
SLACK = 1e-9  # relative: float sums in another order


@lru_cache(maxsize=None)
def summary(*overrides: str) -> dict:
    return simulate_run(compose_run(*overrides, STEPS)).summary


def step_ms(*overrides: str) -> float:
    return summary(*overrides)["step_ms_p50"]


@lru_cache(maxsize=None)
def graph_strategy(hardware: str) -> str:
    return GRAPH_STRATEGY_OF[compose_run(f"hardware={hardware}").hardware.platform]


def test_every_hardware_preset_is_covered():
    assert {"atlas_a2", "h100", "h200"} <= set(HARDWARE)


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_graph_replay_is_never_slower_than_eager_at_the_same_batch(hardware, workload):
    assert_never_slower_than_eager(hardware, workload, "graph", f"strategy={graph_strategy(hardware)}")


def assert_never_slower_than_eager(hardware: str, workload: str, label: str, *overrides: str, leaving_graphs: bool = False) -> None:
    """`leaving_graphs`: allow what leaving each graph piece costs the device (graph.exit_gap_us a piece)."""
    exit_ms = compose_run(f"hardware={hardware}").hardware.graph.exit_gap_us / 1e3 if leaving_graphs else 0.0
    for batch in BATCHES:
        common = (f"hardware={hardware}", f"workload={workload}", f"workload.batch_size={batch}")
        eager = step_ms(*common, "strategy=eager")
        other = summary(*common, *overrides)
        allowed = eager * (1 + SLACK) + other.get("graph_pieces", 0) * exit_ms
        assert other["step_ms_p50"] <= allowed, f"batch {batch}: {label} {other['step_ms_p50']:.4f} ms > eager {eager:.4f} ms (+ {allowed - eager:.4f})"


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_the_graph_gain_shrinks_as_the_batch_grows(hardware, workload):
    gains = []
    for batch in BATCHES:
        common = (f"hardware={hardware}", f"workload={workload}", f"workload.batch_size={batch}")
        gains.append(step_ms(*common, "strategy=eager") / step_ms(*common, f"strategy={graph_strategy(hardware)}"))
    assert all(later <= earlier * (1 + SLACK) for earlier, later in zip(gains, gains[1:])), f"eager/graph by batch {BATCHES}: {gains}"


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_piecewise_graph_is_never_slower_than_eager_at_the_same_batch(hardware, workload):
    assert_never_slower_than_eager(
        hardware, workload, "piecewise", f"strategy={graph_strategy(hardware)}", "strategy.graph.splitting_ops=[attention]", leaving_graphs=True,
    )


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_a_whole_graph_is_never_slower_than_a_piecewise_one(hardware, workload):
    for batch in BATCHES:
        common = (f"hardware={hardware}", f"workload={workload}", f"workload.batch_size={batch}", f"strategy={graph_strategy(hardware)}")
        whole = step_ms(*common)
        pieces = step_ms(*common, "strategy.graph.splitting_ops=[attention]")
        assert whole <= pieces * (1 + SLACK), f"batch {batch}: whole graph {whole:.4f} ms > piecewise {pieces:.4f} ms"


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("hardware", HARDWARE)
def test_leaving_graphs_slower_never_speeds_a_step_and_touches_only_piecewise_ones(hardware, workload):
    """A longer graph exit gap (0 → 20 µs) never makes a piecewise step faster, and costs it no more than
    20 µs a piece; eager steps and whole-graph replays hold no kernel launched alone after a graph's tasks,
    so they do not change at all."""
    common = (f"hardware={hardware}", f"workload={workload}", "workload.batch_size=8")
    graph = f"strategy={graph_strategy(hardware)}"
    for strategy, piecewise in ((("strategy=eager",), False), ((graph,), False), ((graph, "strategy.graph.splitting_ops=[attention]"), True)):
        without = summary(*common, *strategy, "hardware.graph.exit_gap_us=0")
        slow = summary(*common, *strategy, "hardware.graph.exit_gap_us=20")
        pieces = without["graph_pieces"] if piecewise else 0
        assert without["step_ms_p50"] <= slow["step_ms_p50"] * (1 + SLACK), strategy
        assert slow["step_ms_p50"] <= without["step_ms_p50"] * (1 + SLACK) + pieces * 20 / 1e3, strategy
        if pieces == 0:
            assert slow["step_ms_p50"] == without["step_ms_p50"], strategy


# Programs beyond the fused kernels with no engine: HF transformers' kernels (one KV cache handling on both
# sides, see the module docstring) and serving engines' host work (vLLM V1, SGLang, vllm-ascend).
OTHER_PROGRAMS = {
    "hf_unfused_static_kv": ("workload.kernels=unfused", "workload.kv_cache=static"),
    "vllm_v1": ("engine=vllm_v1",),
    "sglang": ("engine=sglang",),
    "vllm_ascend": ("engine=vllm_ascend",),
}


# Each engine on its own platform: vLLM and SGLang on GPUs, vllm-ascend on Ascend presets.
PROGRAM_CASES = [(hardware, program) for hardware in HARDWARE for program in sorted(OTHER_PROGRAMS)
                 if program.startswith("hf_") or (program == "vllm_ascend") == (graph_strategy(hardware) == "acl_graph")]


@pytest.mark.parametrize("hardware, program", PROGRAM_CASES)
def test_the_graph_laws_hold_for_other_programs(hardware, program):
    """Graph never slower than eager, a piecewise graph between the two, the gain shrinking with the batch:
    the laws above, for the dense model run by another program."""
    exit_ms = compose_run(f"hardware={hardware}").hardware.graph.exit_gap_us / 1e3
    gains = []
    for batch in BATCHES:
        common = (f"hardware={hardware}", "workload=llama31_8b_decode", f"workload.batch_size={batch}", *OTHER_PROGRAMS[program])
        graph = (*common, f"strategy={graph_strategy(hardware)}")
        eager, whole = step_ms(*common, "strategy=eager"), step_ms(*graph)
        pieces = summary(*graph, "strategy.graph.splitting_ops=[attention]")
        assert whole <= eager * (1 + SLACK), f"batch {batch}: graph {whole:.4f} ms > eager {eager:.4f} ms"
        assert whole <= pieces["step_ms_p50"] * (1 + SLACK), f"batch {batch}: graph {whole:.4f} ms > piecewise {pieces['step_ms_p50']:.4f}"
        assert pieces["step_ms_p50"] <= eager * (1 + SLACK) + pieces["graph_pieces"] * exit_ms, f"batch {batch}: piecewise > eager"
        gains.append(eager / whole)
    assert all(later <= earlier * (1 + SLACK) for earlier, later in zip(gains, gains[1:])), f"eager/graph by batch {BATCHES}: {gains}"
