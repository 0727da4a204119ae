"""Serving batches: a seeded request stream under continuous batching decides each step's batch.

Which requests are in step s depends on simulated time (what has arrived by the end of step s − 1),
so the batches cannot be fixed before the simulation. Steps are separated by a barrier in the task
graph (harness/sim/lowering.py), so a step's duration depends only on its own batch (and on the causal
policy state: cache contents, sunk graphs, planned for the prefix of steps where a strategy has them);
the loop below prepares and simulates one step at a time, admits and retires requests, and returns the batch,
mean KV length and release time of every step. The whole run is then simulated once more as one
graph, which reproduces these step times exactly (tests check it) and gives the usual metrics.

Requests arrive already prefilled (a separate prefill phase or instance): a request's KV length
starts at its prompt length and grows by one per generated token.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from harness.config.schema import GraphMode, RunConfig, ServingConfig, StrategyConfig
from harness.sim.kernel import simulate
from harness.model.device import US_PER_S
from harness.sim.lowering import Lowering, engine_costs, engine_in_effect
from harness.sim.metrics import MIN_SAMPLES_FOR_P99
from harness.sim.policies import prepare

SERVING_STREAM = 1  # generator stream of the request draws: (seed, 1); host jitter uses (seed, 0, step)
MIN_REQUESTS_FOR_PERCENTILES = MIN_SAMPLES_FOR_P99  # fewer completed requests: the summary says its latency figures are thin



@dataclass
class Requests:
    arrival_us: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray


@dataclass
class ServingBatches:
    """The batches a request stream makes under continuous batching, and what each request lived through
    (not a "plan": a StepPlan is the strategy's per-step graph and cache decisions, policies.py)."""

    batch: np.ndarray  # sequences per step
    kv_len: np.ndarray  # mean KV length per step
    release_us: np.ndarray  # earliest start of each step (an idle server waits for the next arrival)
    step_us: np.ndarray  # duration of each step as simulated alone
    requests: Requests
    admitted_us: np.ndarray  # when each request joined a batch (NaN: never)
    finished_us: np.ndarray  # when it produced its last token (NaN: not within the run)
    first_token_us: np.ndarray  # when it produced its first token (NaN: never)
    itl_us: np.ndarray  # every gap between two consecutive tokens of a request (inter-token latency)
    # tokens each step produced: its batch less the sequences done earlier in a multi-step block (None: its batch)
    generated: np.ndarray | None = None
    idle_us: np.ndarray | None = None  # how long the server waited for a request before each step
    scheduled_here: np.ndarray | None = None  # async scheduling: the steps that scheduled themselves (engine_costs)
    itl_end_us: np.ndarray | None = None  # when each gap of itl_us ended (its token delivered; None: every gap is measured)
    # requests left waiting after each step's admission because every max_batch slot was taken (None: not recorded)
    unplaced: np.ndarray | None = None


def draw_requests(serving: ServingConfig, seed: int, count: int) -> Requests:
    """`count` requests of the seeded stream. Request i is the same whatever `count` is: arrival gaps,
    prompt and output lengths each come from a generator of their own, drawn in request order (one
    generator drawing all gaps, then all lengths, moved every length when the count changed, and the count
    follows workload.steps and max_batch: runs of one stream differing in those served other requests)."""
    gaps_rng, prompt_rng, output_rng = (np.random.default_rng([seed, SERVING_STREAM, k]) for k in range(3))
    gaps_us = gaps_rng.exponential(US_PER_S / serving.arrival_rate_rps, size=count)
    # The initial requests wait at time 0 and the stream starts then too (the gaps drawn for the initial
    # ones once pushed it back by initial / rate: 100 at 10 rps, a first arrival at 10.7 s).
    initial = min(serving.initial_requests, count)
    arrival = np.concatenate([np.zeros(initial), np.cumsum(gaps_us[: count - initial])])

    def lengths(mean: float, rng: np.random.Generator) -> np.ndarray:
        if serving.len_cv == 0:
            return np.full(count, max(1, round(mean)), dtype=np.int64)
        sigma2 = np.log1p(serving.len_cv**2)
        drawn = rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), size=count)
        return np.maximum(1, np.rint(drawn)).astype(np.int64)

    return Requests(arrival, lengths(serving.prompt_len_mean, prompt_rng), lengths(serving.output_len_mean, output_rng))


def steps_plan_alone(strategy: StrategyConfig) -> bool:
    """Whether a step's plan can be made from that step alone. It depends on the steps before it only
    through the tiling cache's contents and graph sink's graphs, built in program order; capture graphs
    are made at start-up, and a step pads its routed ops by its own mode."""
    return not strategy.tiling_cache and strategy.graph.mode != GraphMode.sink


def batch_requests(run: RunConfig, progress=None) -> ServingBatches:
    run, _ = engine_in_effect(run)  # the engine as it runs under this strategy
    serving, steps = run.workload.serving, run.workload.steps
    # Enough requests that the stream never runs dry within the run: every step can admit max_batch.
    requests = draw_requests(serving, run.seed, serving.initial_requests + steps * serving.max_batch + 1)

    batch = np.zeros(steps, dtype=np.int64)
    kv_len = np.zeros(steps)
    release = np.zeros(steps)
    step_us = np.zeros(steps)
    idle_us = np.zeros(steps)  # how long the server waited for a request before each step
    unplaced = np.zeros(steps, dtype=np.int64)  # arrived requests left waiting for want of a slot
    scheduled_here = np.ones(steps, dtype=bool)  # with async scheduling: no step before fixed its batch
    ahead = run.engine is not None and run.engine.active and run.engine.async_scheduling
    admitted = np.full(requests.arrival_us.size, np.nan)
    finished = np.full(requests.arrival_us.size, np.nan)
    first_token = np.full(requests.arrival_us.size, np.nan)
    last_token = np.full(requests.arrival_us.size, np.nan)
    gaps: list[np.ndarray] = []
    gap_ends: list[np.ndarray] = []
    generated = np.zeros(requests.arrival_us.size, dtype=np.int64)
    undelivered: list[np.ndarray] = []  # sequences that made a token in each step of this block so far
    running: list[int] = []
    waiting: deque[int] = deque()
    next_arrival = 0
    now = 0.0
    step_by_step = steps_plan_alone(run.strategy)
    tokens = np.zeros(steps)
    produced = np.zeros(steps, dtype=np.int64)
    block = run.engine.multi_step if run.engine is not None and run.engine.active else 1
    for s in range(steps):
        if not running and not waiting and next_arrival < requests.arrival_us.size:
            now = max(now, float(requests.arrival_us[next_arrival]))  # idle until the next request
        # With async scheduling the step before fixed this step's batch right after it was submitted (vLLM
        # V1's EngineCore.step_with_batch_queue, SGLang's overlap scheduler): a request that arrived while
        # it ran waits a step more. An engine with nothing running, or after a wait, schedules here.
        idle_us[s] = now - (release[s - 1] + step_us[s - 1]) if s > 0 else 0.0
        scheduled_here[s] = not (ahead and s > 0 and running and idle_us[s] == 0.0)
        cutoff = now if scheduled_here[s] else release[s - 1]
        while next_arrival < requests.arrival_us.size and requests.arrival_us[next_arrival] <= cutoff:
            waiting.append(next_arrival)
            next_arrival += 1
        # Multi-step scheduling (vLLM V0 --num-scheduler-steps) schedules once a block: requests join a
        # batch only at its first step (an empty server starts a block when a request arrives).
        while waiting and len(running) < serving.max_batch and (s % block == 0 or not running):
            r = waiting.popleft()
            admitted[r] = now
            running.append(r)
        # Waiting for a slot, not for the next scheduling point (async scheduling's cutoff, a multi-step block)
        unplaced[s] = len(waiting) if len(running) >= serving.max_batch else 0
        ids = np.array(running, dtype=np.int64)
        batch[s] = ids.size
        kv_len[s] = float(np.mean(requests.prompt_len[ids] + generated[ids] + 1))
        release[s] = now
        if step_by_step:  # this step alone: linear in steps (the engine's costs: from every step's sizes so far)
            workload, plan = prepare(run, batch[s : s + 1], kv_len[s : s + 1])
            tokens[s] = workload.tokens[0]
            first = max(0, s - s % block - block)  # from the block before this step's: its outputs are this block's side work
            engine_us = engine_costs(batch[first : s + 1], tokens[first : s + 1], run.engine, first, idle_us[first : s + 1],
                                     scheduled_here[first : s + 1])[-1:]
            graph = Lowering(workload, run.hardware, run.strategy, run.seed, plan, run.engine, first_step=s, engine_us=engine_us).graph(np.array([0]))
        else:  # the plan of step s depends on the steps before: plan the prefix again
            workload, plan = prepare(run, batch[: s + 1], kv_len[: s + 1])
            engine_us = engine_costs(workload.real_batch, workload.tokens, run.engine, 0, idle_us[: s + 1], scheduled_here[: s + 1])
            graph = Lowering(workload, run.hardware, run.strategy, run.seed, plan, run.engine, engine_us=engine_us).graph(np.array([s]))
        one = simulate(graph)
        step_us[s] = one.makespan_us
        now += step_us[s]
        if progress is not None:
            progress.update(f"serving step {s + 1}/{steps}, batch {batch[s]}")
        # A sequence that finished earlier in this block still fills its row (the block runs to its end,
        # its tokens thrown away) but produces nothing.
        live = ids[generated[ids] < requests.output_len[ids]]
        produced[s] = live.size
        generated[live] += 1
        block_ends = (s + 1) % block == 0
        # A multi-step block hands its tokens to the client at its end (vLLM V0's LLMEngine.step returns no
        # outputs until the block's last step): a request gets them as one chunk, and a streaming client
        # (benchmark_serving) times the chunk, one inter-token gap per chunk. A block the run cuts off
        # delivers nothing within it.
        undelivered.append(live)
        if block_ends:
            delivered = live if block == 1 else np.array(list(dict.fromkeys(np.concatenate(undelivered).tolist())), dtype=np.int64)
            undelivered = []
            seen = ~np.isnan(last_token[delivered])
            gaps.append(now - last_token[delivered[seen]])
            gap_ends.append(np.full(int(seen.sum()), now))
            first_token[delivered[~seen]] = now
            last_token[delivered] = now
            finished[delivered[generated[delivered] >= requests.output_len[delivered]]] = now
        running = [int(r) for r in (ids[generated[ids] < requests.output_len[ids]] if block_ends else ids)]
    itl = np.concatenate(gaps) if gaps else np.zeros(0)
    ends = np.concatenate(gap_ends) if gap_ends else np.zeros(0)
    return ServingBatches(batch, kv_len, release, step_us, requests, admitted, finished, first_token, itl, produced, idle_us,
                          scheduled_here, ends, unplaced)


# Share of a serving run's window spent waiting for a request from which its note says the load is light.
LIGHT_LOAD_IDLE = 0.5


def serving_summary(plan: ServingBatches, warmup_steps: int = 0) -> dict:
    """Request-level numbers of a serving run (ms): latency from arrival to last token and queueing, and
    vLLM's benchmark_serving names and definitions (`mean_ttft_ms`, `median_tpot_ms`, `p99_itl_ms`,
    `mean_e2el_ms`, ...): TPOT from the first token to the last over the tokens after the first, over the
    requests done with more than one token. (A harness-only `tpot_ms_mean`, admission to last token over
    every token, was dropped: printed as "TPOT" it was not vLLM's.) Requests arrive already prefilled, so
    TTFT here is the wait for the first decode step's token, without prefill (`ttft_note`); it counts
    every request whose first token came in the run, done or not (vLLM's benchmark waits for every
    request to finish; a run's window ends with some in flight). With `warmup_steps`, the figures are the
    measured window's, as throughput's are: its steps' batches, the first tokens (TTFT), the last tokens
    (latency, TPOT, end to end) and the inter-token gaps that came in it. They counted the warm-up's too,
    beside a throughput that did not. (Counting only the requests that arrived after the warm-up left a
    saturated run none: they queue behind the backlog past the window's end.)"""
    # Tokens are delivered at a step's end: the window's come after its first step's release. A time of
    # NaN (no such token within the run) compares False.
    window_start_us = plan.release_us[warmup_steps] if warmup_steps > 0 else -np.inf
    if warmup_steps > 0:
        assert plan.itl_end_us is not None, "a plan with warm-up steps says when each gap ended"
    itl_us = plan.itl_us if warmup_steps == 0 else plan.itl_us[plan.itl_end_us > window_start_us]
    batch = plan.batch[warmup_steps:]
    done = plan.finished_us > window_start_us
    req = plan.requests
    latency_ms = (plan.finished_us[done] - req.arrival_us[done]) / 1e3
    out = {"requests_completed": int(done.sum()), "batch_mean": float(batch.mean()), "batch_max": int(batch.max())}
    if done.any():
        out.update(
            {
                "request_latency_ms_p50": float(np.percentile(latency_ms, 50)),
                "request_latency_ms_p99": float(np.percentile(latency_ms, 99)),
            }
        )
    started = plan.first_token_us > window_start_us
    if started.any():  # the requests TTFT counts (a request's queueing is part of its TTFT): they were the finished ones
        out["queue_ms_mean"] = float(((plan.admitted_us[started] - req.arrival_us[started]) / 1e3).mean())
    # vLLM's definitions (benchmarks/benchmark_serving.py): TPOT excludes the first token; ITL is every gap.
    series = {"ttft": (plan.first_token_us[started] - req.arrival_us[started]) / 1e3}
    many = done & (req.output_len > 1)
    series["tpot"] = (plan.finished_us[many] - plan.first_token_us[many]) / (req.output_len[many] - 1) / 1e3
    series["itl"] = itl_us / 1e3
    series["e2el"] = latency_ms
    for name, values in series.items():
        if values.size:
            out[f"mean_{name}_ms"] = float(values.mean())
            out[f"median_{name}_ms"] = float(np.median(values))
            out[f"p99_{name}_ms"] = float(np.percentile(values, 99))
    out["ttft_note"] = "requests arrive prefilled: TTFT is the wait for the first decode token, without prefill"
    notes = []
    if warmup_steps > 0:
        notes.append(f"latency figures and the batch over the measured window: the tokens after the {warmup_steps} warm-up"
                     " step(s) (workload.warmup_steps)")
    # Requests left waiting for a slot (every max_batch one taken) after the last step's admission: the server
    # falls behind its arrival rate, and the figures above are the served ones only (a median TTFT of 26.7 ms
    # beside a queue that grows with the run). Not every request without a first token: under async
    # scheduling the last step's batch was fixed before it began, and a multi-step block the run cuts off
    # delivers no token; neither is a server out of slots.
    arrived = req.arrival_us <= plan.release_us[-1]
    unserved = int(plan.unplaced[-1]) if plan.unplaced is not None else 0
    if unserved:
        notes.append(f"saturated: {unserved} of {int(arrived.sum())} requests that arrived before the last step got no first token;"
                     " TTFT, queueing and latencies leave them out and grow with workload.steps")
    if plan.idle_us is not None:
        # A server mostly waiting for requests is "device-bound" on its few steps: said, as the load that sets its pace.
        span_us = float(plan.release_us[-1] + plan.step_us[-1] - plan.release_us[warmup_steps])
        waited = float(plan.idle_us[warmup_steps + 1:].sum()) / span_us if span_us > 0 else 0.0
        if waited >= LIGHT_LOAD_IDLE:
            notes.append(f"light load: the server waited for requests {waited:.0%} of the window; the request stream, not the server, sets its pace")
    if done.sum() < MIN_REQUESTS_FOR_PERCENTILES:
        notes.append(
            f"latency figures rest on {int(done.sum())} completed request(s) (TTFT on {int(started.sum())} first tokens),"
            f" fewer than {MIN_REQUESTS_FOR_PERCENTILES}:"
            " raise workload.steps or lower workload.serving.output_len_mean"
        )  # said where the figures are shown (terminal, reports, MLflow), not logged: an advice's workers printed it once a candidate
    if notes:
        out["serving_note"] = "; ".join(notes)
    return out
