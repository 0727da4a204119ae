"""Serving batches: a seeded request stream under continuous batching, simulated exactly step by step."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import compose_run
from harness.run import simulate_run
from harness.serving import draw_requests, plan_serving

SERVING = ("workload.serving.enabled=true", "workload.steps=60", "workload.serving.output_len_mean=24")


def test_whole_run_reproduces_the_step_by_step_plan():
    run = compose_run(*SERVING, "strategy=pipeline", "hardware.host.jitter_cv=0.2")
    plan = plan_serving(run)
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


def test_more_load_means_bigger_batches_and_more_throughput():
    light = simulate_run(compose_run(*SERVING, "workload.serving.arrival_rate_rps=5")).summary
    heavy = simulate_run(compose_run(*SERVING, "workload.serving.arrival_rate_rps=500")).summary
    assert heavy["batch_mean"] > 2 * light["batch_mean"]
    assert heavy["throughput_tok_s"] > light["throughput_tok_s"]
    assert light["bubble_ratio"] > heavy["bubble_ratio"]  # an underloaded server idles between requests


def test_serving_needs_decode():
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match="workload.phase"):
        compose_run("workload=llama2_7b_prefill", "workload.serving.enabled=true")
