"""The search: candidates that pass the limits are simulated in this process (no Hydra job, no MLflow run
each), short runs first and longer ones for the leaders (successive halving), and ranked by the objective
among those that meet the user's latency limits.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from harness.base.errors import HarnessError
from harness.config.advise import AdviseConfig
from harness.advisor.candidates import Candidate, check_limits_before, combinations, make_run, same_run_key, with_steps
from harness.sim.simulate import simulate_run


def figures(summary: dict) -> dict:
    """The figures an advice ranks and shows, from a run's summary: per device, TPOT and TTFT whichever
    way the run measures them (a serving run's medians, a decode or prefill step's own time)."""
    serving = "median_tpot_ms" in summary
    devices = max(1, int(summary.get("devices", 1)))
    return {
        "tok_s_per_device": summary["throughput_tok_s"] / devices,
        "tpot_ms_p50": summary.get("median_tpot_ms") if serving else summary["step_ms_p50"],
        "tpot_ms_p99": summary.get("p99_tpot_ms") if serving else summary["step_ms_p99"],
        "ttft_ms": summary.get("median_ttft_ms") if serving else summary.get("ttft_ms"),
        "bubble_ratio": summary["bubble_ratio"],
        "bound": summary["bound"],
        "padding_waste": summary.get("padding_waste", 0.0),
    }


def latency_miss(summary: dict, advise: AdviseConfig) -> str:
    """Which latency limit a simulated candidate misses, in one line ("" when it meets them)."""
    f = figures(summary)
    if advise.tpot_ms_max is not None and f["tpot_ms_p50"] is not None and f["tpot_ms_p50"] > advise.tpot_ms_max:
        return f"TPOT p50 {f['tpot_ms_p50']:.2f} ms > advise.tpot_ms_max={advise.tpot_ms_max:g}"
    if advise.ttft_ms_max is not None and f["ttft_ms"] is not None and f["ttft_ms"] > advise.ttft_ms_max:
        return f"TTFT {f['ttft_ms']:.1f} ms > advise.ttft_ms_max={advise.ttft_ms_max:g}"
    return ""


def score(candidate: Candidate) -> tuple[float, int, float, float]:
    """Higher is better: the objective, then (on a tie) fewer graphs, less capture time, less memory."""
    return (figures(candidate.summary)["tok_s_per_device"], -candidate.graphs, -candidate.capture_s, -candidate.memory_gb)


@dataclass
class Advice:
    candidates: list[Candidate]  # every one, in the space's order
    ranked: list[Candidate]  # simulated at the last rung and meeting every limit, best first
    baseline: Candidate | None
    rungs: list[tuple[int, int]] = field(default_factory=list)  # (steps, candidates simulated)
    seconds: float = 0.0
    out_of_time: int = 0  # candidates left unsimulated when advise.budget_s ran out


def simulate(candidate: Candidate, steps: int) -> None:
    assert candidate.run is not None
    try:
        candidate.summary = simulate_run(with_steps(candidate.run, steps)).summary
        candidate.steps = steps
    except HarnessError as exc:  # a limit only the simulation finds (e.g. the KV cache at its last step)
        candidate.rejected = str(exc)


def advise_runs(base: list[str], advise: AdviseConfig, say: Callable[[str], None] = lambda line: None) -> Advice:
    """Search the space on top of `base` (the run's overrides) as `advise` asks."""
    started = time.perf_counter()
    candidates = [Candidate(overrides=combo) for combo in combinations(advise.space)]
    for candidate in candidates:
        try:
            candidate.run = make_run(base + candidate.overrides)
        except HarnessError as exc:
            candidate.rejected = str(exc)
            continue
        check_limits_before(candidate, advise)
    first_of: dict[str, Candidate] = {}
    for candidate in candidates:  # one simulation for candidates that run the same thing
        if not candidate.rejected:
            first = first_of.setdefault(same_run_key(candidate.run), candidate)
            if first is not candidate:
                candidate.rejected = f"runs as {first.label} does (a value that does not apply here)"
    alive = [c for c in candidates if not c.rejected]
    say(f"{len(candidates)} candidates, {len(candidates) - len(alive)} rejected before simulating")
    advice = Advice(candidates=candidates, ranked=[], baseline=None)
    for rung, steps in enumerate(advise.steps):
        simulated = []
        for candidate in alive:
            if time.perf_counter() - started > advise.budget_s:
                advice.out_of_time += 1
                continue
            simulate(candidate, steps)
            if not candidate.rejected:
                candidate.rejected = latency_miss(candidate.summary, advise)
            if not candidate.rejected:
                simulated.append(candidate)
        advice.rungs.append((steps, len(simulated)))
        simulated.sort(key=score, reverse=True)  # stable: ties keep the space's order
        say(f"{steps} steps: {len(simulated)} candidates meet the limits" + (f", best {simulated[0].label}" if simulated else ""))
        last = rung == len(advise.steps) - 1
        alive = simulated if last else simulated[: max(1, math.ceil(len(simulated) * advise.keep))]
    advice.ranked = alive
    if advise.baseline:
        baseline = Candidate(overrides=list(advise.baseline))
        baseline.run = make_run(base + baseline.overrides)
        check_limits_before(baseline, advise)
        simulate(baseline, advise.steps[-1])
        advice.baseline = baseline
    advice.seconds = time.perf_counter() - started
    return advice
