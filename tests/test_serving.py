"""Serving batches: a seeded request stream under continuous batching, simulated exactly step by step."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import compose_run
from harness.sim.simulate import simulate_run
from harness.sim.serving import draw_requests, batch_requests

SERVING = ("workload.serving.enabled=true", "workload.steps=60", "workload.serving.output_len_mean=24")


@pytest.mark.parametrize("engine", [(), ("engine=vllm_v0_6", "engine.multi_step=4", "engine.api.per_step_us=80000")])
def test_whole_run_reproduces_the_step_by_step_plan(engine):
    """Also with an engine whose API process streams a 4-step block's tokens (80 ms, longer than the
    steps) during the next block: every step of that block carries its quarter in the plan as in the run."""
    run = compose_run(*SERVING, "strategy=pipeline", "hardware.host.jitter_cv=0.2", *engine)
    plan = batch_requests(run)
    outcome = simulate_run(run)
    steps = outcome.steps
    # Equal up to floating-point rounding of absolute times (the run is ~1 s long, the steps ~10 ms).
    assert steps["latency_ms"].to_numpy() * 1e3 == pytest.approx(plan.step_us, rel=1e-9)
    assert np.array_equal(steps["batch"].to_numpy(), plan.batch)
    # A step starts when the previous one ended, or when the server stopped idling.
    assert np.all(steps["start_ms"].to_numpy() * 1e3 >= plan.release_us - 1e-9)


def test_batch_changes_step_by_step_within_max_batch():
    run = compose_run(*SERVING, "workload.serving.max_batch=8", "workload.serving.arrival_rate_rps=200")
    outcome = simulate_run(run)
    batch = outcome.steps["batch"].to_numpy()
    assert batch.max() == 8 and batch.min() >= 1 and len(set(batch)) > 2
    assert outcome.summary["requests_completed"] > 0
    assert outcome.summary["request_latency_ms_p99"] >= outcome.summary["request_latency_ms_p50"]
    kv = outcome.steps["kv_len"].to_numpy()
    assert len(set(np.round(kv, 6))) > 10  # requests of different lengths come and go


SERVING_H100_V1 = ("hardware=h100", "workload=llama31_8b_decode", "strategy=cuda_graph", "engine=vllm_v1",
                   "workload.serving.enabled=true", "workload.steps=60")


def test_request_stream_is_seeded():
    run = compose_run(*SERVING)
    a, b = draw_requests(run.workload.serving, 0, 50), draw_requests(run.workload.serving, 0, 50)
    c = draw_requests(run.workload.serving, 1, 50)
    assert np.array_equal(a.arrival_us, b.arrival_us) and np.array_equal(a.output_len, b.output_len)
    assert not np.array_equal(a.arrival_us, c.arrival_us)
    # Poisson arrivals at the configured rate: mean gap 1 / rate.
    many = draw_requests(run.workload.serving, 0, 20000)
    assert np.mean(np.diff(many.arrival_us)) == pytest.approx(1e6 / run.workload.serving.arrival_rate_rps, rel=0.03)
    assert np.mean(many.prompt_len) == pytest.approx(run.workload.serving.prompt_len_mean, rel=0.03)


def test_request_i_is_the_same_whatever_the_run_length_or_max_batch():
    """The count drawn follows workload.steps and max_batch; one generator drew every gap, then every
    length, so the first request's prompt was 472 tokens at max_batch 32 and 240 steps, 773 at max_batch
    128, 2364 at 60 steps: candidates the advisor compared served other requests."""
    run = compose_run(*SERVING, "workload.serving.len_cv=0.5")
    short, long = draw_requests(run.workload.serving, 0, 40), draw_requests(run.workload.serving, 0, 4000)
    for field in ("arrival_us", "prompt_len", "output_len"):
        np.testing.assert_array_equal(getattr(short, field), getattr(long, field)[:40])
    # Through the runs: the requests both runs finish got the same lengths and arrived at the same time.
    a = batch_requests(compose_run(*SERVING, "workload.serving.max_batch=8"))
    b = batch_requests(compose_run(*SERVING, "workload.serving.max_batch=128", "workload.steps=90"))
    n = min(len(a.requests.arrival_us), len(b.requests.arrival_us))
    np.testing.assert_array_equal(a.requests.prompt_len[:n], b.requests.prompt_len[:n])
    np.testing.assert_array_equal(a.requests.arrival_us[:n], b.requests.arrival_us[:n])


def test_the_stream_after_the_initial_requests_starts_at_time_zero():
    """100 requests waiting at t = 0 and a 10 rps Poisson stream: the stream's first request comes one
    drawn gap after 0 and ~100 arrive in the first 10 s (the initial requests' gaps once delayed it to
    10.7 s, with none in [0, 10 s)); the lengths drawn are the same either way."""
    from harness.config.schema import ServingConfig

    serving = ServingConfig(arrival_rate_rps=10.0, initial_requests=100)
    drawn = draw_requests(serving, 0, 1100)
    assert (drawn.arrival_us[:100] == 0).all()
    stream = drawn.arrival_us[100:]
    assert 0 < stream[0] < 1e6 and np.all(np.diff(stream) > 0)
    assert 70 <= np.count_nonzero(stream < 10e6) <= 130
    alone = draw_requests(ServingConfig(arrival_rate_rps=10.0), 0, 1100)
    np.testing.assert_array_equal(stream, alone.arrival_us[:1000])
    np.testing.assert_array_equal(drawn.output_len, alone.output_len)


def test_a_step_after_an_idle_wait_schedules_itself_and_its_side_work_was_done_in_the_wait():
    """vLLM V1 (async scheduling, output and API in processes of their own), one sequence a step. Step 0
    schedules itself (schedule + prepare: 2 x (1,068 + 6.03) = 2,148.06 us); step 1 was scheduled ahead
    by step 0 and shares step 0's outputs off the main thread (1,074.03 us output, 3,666.6 us API).
    Step 2 follows a 0.5 s wait for a request: nobody scheduled it ahead (it ran 2.1 ms short before),
    and step 1's outputs were processed during the wait (they were charged to step 2)."""
    from harness.sim.lowering import ENGINE_SLOT, engine_costs

    run = compose_run("hardware=h100", "workload=llama31_8b_decode", "engine=vllm_v1")
    ones = np.ones(3)
    here = np.array([True, False, True])  # step 2 follows the wait: it schedules itself
    table = engine_costs(ones, ones, run.engine, 0, idle_us=np.array([0.0, 0.0, 5e5]), scheduled_here=here)
    assert table[:, ENGINE_SLOT["pre"]] == pytest.approx([2148.06, 0.0, 2148.06])
    assert table[:, ENGINE_SLOT["output_side"]] == pytest.approx([0.0, 1074.03, 0.0])
    assert table[:, ENGINE_SLOT["api_side"]] == pytest.approx([0.0, 3666.6, 0.0])
    short = engine_costs(ones, ones, run.engine, 0, idle_us=np.array([0.0, 0.0, 1000.0]), scheduled_here=here)  # a wait shorter than the work
    assert short[2, ENGINE_SLOT["api_side"]] == pytest.approx(2666.6)
    # In a served stream: every step after a wait costs what the first step costs, not 2.1 ms less.
    served = batch_requests(compose_run(*SERVING_H100_V1, "workload.serving.arrival_rate_rps=2", "workload.serving.max_batch=4",
                                        "workload.serving.output_len_mean=8", "workload.serving.len_cv=0"))
    after_wait = np.r_[False, served.release_us[1:] > served.release_us[:-1] + served.step_us[:-1]]
    assert after_wait.sum() >= 3
    assert served.step_us[after_wait] == pytest.approx(served.step_us[0], rel=1e-3)


def test_with_async_scheduling_a_request_that_arrives_during_a_step_waits_a_step_more():
    """vLLM V1 schedules step k+1 right after submitting step k (EngineCore.step_with_batch_queue): a
    request that arrives while k runs joins k+2, not k+1. A step with nothing running, or after a wait,
    schedules itself with what has arrived by then (and pays its scheduling: no step did it ahead)."""
    run = compose_run(*SERVING_H100_V1, "workload.serving.arrival_rate_rps=150", "workload.serving.max_batch=64",
                      "workload.serving.output_len_mean=16")
    served = batch_requests(run)
    release, arrival = served.release_us, served.requests.arrival_us
    step_of = np.searchsorted(release, served.admitted_us[~np.isnan(served.admitted_us)])
    joined = arrival[~np.isnan(served.admitted_us)]
    ahead = ~served.scheduled_here[step_of]
    assert ahead.sum() >= 10 and (~served.scheduled_here).any() and served.scheduled_here[0]
    # Joined a step scheduled ahead: arrived before the step before it began (they joined the next step).
    assert np.all(joined[ahead] <= release[step_of[ahead] - 1])
    # Without async scheduling every step schedules itself, with what has arrived by its start: here many
    # requests join the step right after the one they arrived in.
    inline = batch_requests(compose_run(*SERVING_H100_V1, "engine.async_scheduling=false", "workload.serving.arrival_rate_rps=150",
                                        "workload.serving.max_batch=64", "workload.serving.output_len_mean=16"))
    assert inline.scheduled_here.all()
    admitted = ~np.isnan(inline.admitted_us)
    k = np.searchsorted(inline.release_us, inline.admitted_us[admitted])
    assert np.count_nonzero((k >= 1) & (inline.requests.arrival_us[admitted] > inline.release_us[k - 1])) >= 10


def test_more_load_means_bigger_batches_and_more_throughput():
    light = simulate_run(compose_run(*SERVING, "workload.serving.arrival_rate_rps=5")).summary
    heavy = simulate_run(compose_run(*SERVING, "workload.serving.arrival_rate_rps=500")).summary
    assert heavy["batch_mean"] > 2 * light["batch_mean"]
    assert heavy["throughput_tok_s"] > light["throughput_tok_s"]
    assert light["bubble_ratio"] > heavy["bubble_ratio"]  # an underloaded server idles between requests


def test_serving_needs_decode():
    from harness.base.errors import ConfigError

    with pytest.raises(ConfigError, match="workload.phase"):
        compose_run("workload=llama2_7b_prefill", "workload.serving.enabled=true")


@pytest.mark.parametrize("engine, max_batch, sizes", [
    # vLLM V0 pads max_num_seqs up to a capture size and captures up to it: 256 -> [1, 2, 4, 8, ..., 256].
    ("vllm_v0_6", 256, [1, 2, 4, *range(8, 257, 8)]),
    ("vllm_v0_6", 3, [1, 2, 4]),
    # vLLM >= 0.11.1: every size up to min(2 x max_num_seqs, 512), the list's sizes above 256 every 16.
    ("vllm_v1", 256, [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]),
    ("vllm_v1", 4, [1, 2, 4, 8]),
    ("vllm_v1", 3, [1, 2, 4]),  # up to 6: no 8 (batches of 5 and 6 run without a graph)
    # SGLang 0.4: up to cuda_graph_max_bs 160, whatever the batch limit.
    ("sglang", 256, [1, 2, 4, *range(8, 161, 8)]),
    ("sglang", 20, [1, 2, 4, 8, 16, 24]),
])
def test_each_engine_captures_the_sizes_its_version_captures(engine, max_batch, sizes):
    from harness.sim.policies import startup_sizes

    run = compose_run("hardware=h100", "workload=llama31_8b_decode", "strategy=cuda_graph", f"engine={engine}")
    assert startup_sizes(list(run.strategy.graph.buckets), max_batch, run.engine) == sizes
    serving = simulate_run(compose_run("hardware=h100", "workload=llama31_8b_decode", "strategy=cuda_graph", f"engine={engine}",
                                       "workload.serving.enabled=true", "workload.steps=4", f"workload.serving.max_batch={max_batch}")).summary
    assert serving["graph_captures"] == len(sizes)


def test_vllm_06_processes_outputs_inline_when_it_runs_eagerly():
    """vLLM 0.6 turns async output processing off with enforce_eager on CUDA (ModelConfig.
    verify_async_output_proc, v0.6.3): eagerly, the outputs are processed on the engine's main thread
    (no output lane) and the run says so; with CUDA graphs they are processed during the next step."""
    args = ("hardware=h100", "workload=llama31_8b_decode", "engine=vllm_v0_6", "workload.serving.enabled=true", "workload.steps=6")
    eager, graphs = (simulate_run(compose_run(*args, f"strategy={s}")) for s in ("eager", "cuda_graph"))
    assert "engine.output" not in eager.result.graph.lane_names and "asynchronous output processing off" in eager.summary["engine_note"]
    assert "engine.output" in graphs.result.graph.lane_names and "engine_note" not in graphs.summary
    inline = simulate_run(compose_run(*args, "strategy=eager", "engine.async_output=false"))
    assert eager.summary["step_ms_mean"] == inline.summary["step_ms_mean"]


def test_graphs_are_captured_before_the_first_request():
    """A serving engine captures its graphs at start-up: no capture inside the request stream (TPOT used
    to include ~3 s captures while steps took 22 ms)."""
    run = compose_run(
        "workload=qwen3_30b_decode", "strategy=acl_graph", "workload.steps=40", "workload.serving.enabled=true",
        "workload.serving.initial_requests=24", "workload.serving.output_len_mean=8", "workload.serving.max_batch=16",
        "tracking.enabled=false",
    )
    outcome = simulate_run(run)
    summary, steps = outcome.summary, outcome.steps
    capture_ms = run.hardware.graph.capture_ms
    assert set(steps["mode"]) == {"replay"}
    # The capture sizes up to max_batch left after trimming to the A2's stream resources (1800 / 49 graphs).
    assert summary["graph_captures"] >= 3 and summary["capture_ms"] == pytest.approx(summary["graph_captures"] * capture_ms)
    # A token's time is a step's (weighted by the requests in it): between the shortest and longest step.
    assert steps["latency_ms"].min() <= summary["mean_tpot_ms"] <= steps["latency_ms"].max()
    assert summary["p99_e2el_ms"] < capture_ms  # no request waited for a capture


def test_thin_percentiles_are_flagged():
    summary = simulate_run(compose_run(
        "workload=llama31_8b_decode", "hardware=h100", "workload.steps=12", "workload.serving.enabled=true",
        "workload.serving.initial_requests=3", "workload.serving.output_len_mean=4", "tracking.enabled=false",
    )).summary
    assert summary["requests_completed"] < 20 and "fewer than 20" in summary["serving_note"]


@pytest.mark.parametrize("cv", [0.5, 1.0])
def test_lengths_have_the_mean_and_the_spread_asked_for(cv):
    """Lognormal lengths with the configured mean and coefficient of variation (std / mean)."""
    from harness.config.schema import ServingConfig

    drawn = draw_requests(ServingConfig(prompt_len_mean=1024, output_len_mean=2048, len_cv=cv), 0, 50_000)
    for lengths, mean in ((drawn.prompt_len, 1024), (drawn.output_len, 2048)):
        assert lengths.mean() == pytest.approx(mean, rel=0.02)
        assert lengths.std() / lengths.mean() == pytest.approx(cv, rel=0.05)


def test_every_request_makes_at_least_one_token():
    from harness.config.schema import ServingConfig

    fixed = draw_requests(ServingConfig(output_len_mean=1, len_cv=0), 0, 100)
    assert fixed.output_len.tolist() == [1] * 100
    spread = draw_requests(ServingConfig(output_len_mean=1, len_cv=1.0), 0, 10_000)
    assert spread.output_len.min() == 1 and np.mean(spread.output_len == 1) > 0.3


def test_a_burst_of_arrivals_fills_every_slot_and_drains_the_stream():
    """At a million requests a second all 161 requests the plan draws (20 steps × 8 slots + 1) have
    arrived by the end of the first step: every later step runs a full batch."""
    run = compose_run("workload.serving.enabled=true", "workload.steps=20", "workload.serving.max_batch=8",
                      "workload.serving.arrival_rate_rps=1e6", "workload.serving.output_len_mean=4", "+workload.card_overrides.num_hidden_layers=1")
    plan = batch_requests(run)
    assert plan.batch[0] == 1 and plan.batch[1:].tolist() == [8] * 19  # the first request arrives alone, ~1 µs in
    assert np.all(plan.requests.arrival_us <= plan.release_us[0] + plan.step_us[0])


@pytest.mark.parametrize("overrides", [
    ["workload=llama2_7b_decode", "strategy=pipeline", "hardware.host.jitter_cv=0.2"],
    ["hardware=h100", "workload=llama31_8b_decode", "strategy=cuda_graph", "engine=vllm_v1", "strategy.graph.buckets=[1,2,4]"],
    # multi-step blocks and outputs handled a step later: engine costs that reach across steps
    ["hardware=h100", "workload=llama31_8b_decode", "strategy=eager", "engine=vllm_v0_6", "hardware.host.jitter_cv=0.1"],
    ["hardware=h100", "workload=llama31_8b_decode", "strategy=async", "engine=sglang"],
    # MoE inside graphs: steps above the largest bucket run eagerly, routed ops stay padded once graphs ran
    ["workload=qwen3_30b_decode", "strategy=acl_graph", "strategy.graph.buckets=[1,2]", "workload.serving.max_batch=4"],
])
def test_planning_each_step_alone_is_planning_the_prefix(overrides, monkeypatch):
    """Serving plans one step at a time; where a step's plan depends on that step alone
    (serving.steps_plan_alone) it is prepared alone, linear in steps. The batches, release times and
    step times are those of preparing every prefix of steps again (the quadratic way, still used with a
    tiling cache or graph sink)."""
    import harness.sim.serving as serving

    run = compose_run("workload.serving.enabled=true", "workload.steps=24", "workload.serving.arrival_rate_rps=400", *overrides)
    assert serving.steps_plan_alone(run.strategy)
    alone = batch_requests(run)
    monkeypatch.setattr(serving, "steps_plan_alone", lambda strategy: False)
    prefix = batch_requests(run)
    assert alone.batch.tolist() == prefix.batch.tolist() and len(set(alone.batch.tolist())) > 1
    np.testing.assert_array_equal(alone.step_us, prefix.step_us)
    np.testing.assert_array_equal(alone.release_us, prefix.release_us)


@pytest.mark.parametrize(
    "multi_step, batch, produced",
    [
        # One step a block: r0 and r1 finish at step 2 (3 tokens each), r2 and r3 join at step 3, ...
        (1, [2] * 8, [2] * 8),
        # 4-step blocks (vLLM V0 --num-scheduler-steps 4): r0 and r1 finish at step 2 but keep their rows
        # to the block's end (step 3 computes them for nothing); r2 and r3 join at step 4, the next block.
        (4, [2] * 8, [2, 2, 2, 0, 2, 2, 2, 0]),
    ],
)
def test_multi_step_admits_at_a_blocks_first_step_and_keeps_finished_rows_to_its_end(multi_step, batch, produced):
    run = compose_run("engine=vllm_v0_5", f"engine.multi_step={multi_step}", "workload.serving.enabled=true",
                      "workload.steps=8", "workload.serving.max_batch=2", "workload.serving.output_len_mean=3",
                      "workload.serving.len_cv=0", "workload.serving.initial_requests=6")
    plan = batch_requests(run)
    assert plan.batch.tolist() == batch and plan.generated.tolist() == produced
    second_pair = 3 if multi_step == 1 else 4  # the step r2 and r3 join
    assert plan.admitted_us[2] == plan.admitted_us[3] == pytest.approx(plan.step_us[:second_pair].sum())
    # r0 and r1 make their third token in step 2; one step a block, it reaches them then. A 4-step block
    # hands its tokens over at its end (vLLM V0's LLMEngine.step returns no outputs before the block's last
    # step): r0's first token, and its last, come with the block's end, one chunk with no gap inside.
    delivered = 3 if multi_step == 1 else 4
    assert plan.finished_us[0] == pytest.approx(plan.step_us[:delivered].sum())
    assert plan.first_token_us[0] == pytest.approx(plan.step_us[: 1 if multi_step == 1 else 4].sum())
    assert plan.itl_us.size == (2 * 2 + 2 * 2 + 2 * 1 if multi_step == 1 else 0)
    outcome = simulate_run(run)
    measured = outcome.steps["measured"].to_numpy()
    tokens = np.array(produced)[measured].sum()
    assert outcome.summary["throughput_tok_s"] == pytest.approx(tokens / (outcome.summary["window_ms"] / 1e3))


def test_the_terminal_prints_vllms_tpot_as_tpot():
    """The serving line's TPOT is vLLM's (first to last token over the tokens after the first), the median
    the summary holds, and no other figure is printed under that name."""
    from pathlib import Path

    from harness.results.outputs import format_summary

    outcome = simulate_run(compose_run(*SERVING))
    summary = {**outcome.summary, "sim_wall_s": 0.0}
    line = next(x for x in format_summary(summary, {"workload": "w", "hardware": "h", "strategy": "s"}, Path(".")).splitlines()
                if x.lstrip().startswith("serving"))
    assert summary["requests_completed"] > 0 and "tpot_ms_mean" not in summary
    assert line.endswith(f", latency p50 {summary['request_latency_ms_p50']:.0f} ms, TPOT p50 {summary['median_tpot_ms']:.1f} ms")


def test_a_serving_run_says_batch_size_and_context_len_are_not_read(tmp_path):
    """A sweep over workload.batch_size with serving on gave rows with the same numbers (its batches are the
    requests admitted) and nothing said why; written on the command line, the run says so. Not written,
    nothing to say; a run without serving reads them."""
    from harness.cli.job import execute
    from harness.config.schema import flatten

    def note(*overrides: str) -> str:
        run = compose_run(*overrides, "tracking.enabled=false")
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        outcome = execute(run, folder, flatten(dataclasses.asdict(run)), overrides)
        return outcome.summary.get("serving_note", "")

    said = note(*SERVING, "workload.batch_size=8", "workload.context_len=64")
    assert said.startswith("workload.batch_size and workload.context_len not read by a serving run: its batches are the"
                           " requests admitted (up to workload.serving.max_batch=32)")
    assert "not read" not in note(*SERVING)
    assert "not read" not in note("workload.batch_size=8", "workload.steps=4")


def test_an_engines_own_processes_do_not_take_the_dispatching_processs_threads():
    """hardware.host.threads is the dispatching process's cores. vLLM V1's API server and detokenizer run in
    processes of their own: one thread or two, the same steps (TPOT was 15.8 ms at one thread, V0.5's figure
    with everything in one process, where two gave 10.2). vLLM 0.6's asynchronous output processing is a
    thread of the engine's process: it shares the one core, and the step is longer than with two."""
    def step_ms(engine: str, threads: int, *extra: str) -> float:
        run = compose_run("hardware=h100", "workload=llama31_8b_decode", f"engine={engine}", "strategy=cuda_graph",
                          "workload.serving.enabled=true", "workload.serving.initial_requests=32", "workload.serving.arrival_rate_rps=200",
                          "workload.steps=40", f"hardware.host.threads={threads}", *extra)
        return simulate_run(run).summary["step_ms_mean"]

    assert step_ms("vllm_v1", 1, "engine.async_scheduling=false") == step_ms("vllm_v1", 2, "engine.async_scheduling=false")
    assert step_ms("vllm_v0_6", 1) > step_ms("vllm_v0_6", 2) * 1.05


@pytest.mark.parametrize("engine", [
    # async scheduling (vLLM V1's default): the last step's batch was fixed when the step before it was
    # submitted, so a request arriving between the two waits a step, which is not a server out of slots
    ("engine=vllm_v1", "seed=4"),
    # multi-step: a block the run cuts off delivers no first token to the requests it admitted
    ("engine=vllm_v0_6", "engine.multi_step=8", "seed=1", "workload.serving.output_len_mean=64", "workload.serving.arrival_rate_rps=20"),
])
def test_a_server_with_free_slots_is_not_said_to_be_saturated(engine):
    """Batches of at most 14 of 32 slots: every arrived request found a place. The note said "saturated: 1 of
    25 requests ..." (async scheduling) and "5 of 18" (an 8-step block cut off by the run's end)."""
    run = compose_run("hardware=h100", "workload=llama31_8b_decode", "workload.serving.enabled=true", "workload.serving.arrival_rate_rps=40",
                      "workload.steps=60", "workload.serving.output_len_mean=16", *engine)
    plan = batch_requests(run)
    assert plan.batch.max() < run.workload.serving.max_batch
    from harness.sim.serving import serving_summary
    assert "saturated" not in serving_summary(plan).get("serving_note", "")
    # Out of slots, it still says so: max_batch 2 at 200 requests a second
    full = batch_requests(dataclasses.replace(run, workload=dataclasses.replace(
        run.workload, serving=dataclasses.replace(run.workload.serving, max_batch=2, arrival_rate_rps=200.0))))
    assert serving_summary(full)["serving_note"].startswith("saturated: ")
