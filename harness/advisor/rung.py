"""One rung of an advice's search: candidates made and checked against the limits that need no simulation,
simulated at the rung's steps where the evaluator says, and measured against the latency limits; the
figures an advice ranks and shows, from a run's summary."""
from __future__ import annotations

import time

from harness.advisor.candidates import RUNS_AS, Candidate, check_limits_before, make_run, same_run_key
from harness.advisor.evaluate import Evaluator, Result, simulate_one
from harness.base.errors import HarnessError
from harness.config.advise import AdviseConfig
from harness.sim.metrics import MIN_SAMPLES_FOR_P99


def is_serving(summary: dict) -> bool:
    """Whether the run had a request stream: the summary's own `serving` flag (summary.json's, which the
    advice's simulations carry too), else its request figures (`requests_completed` is in every serving
    summary, 0 requests done included). Not whether a TPOT was measured: a serving run that finished no
    request has none, and was scored as decode steps (its step p50 as its TPOT, its TTFT dropped)."""
    return bool(summary["serving"]) if "serving" in summary else "requests_completed" in summary


def p99_samples(summary: dict) -> int | None:
    """What a TPOT p99 rests on: a serving run's finished requests, decode's measured steps (None: not known)."""
    key = "requests_completed" if is_serving(summary) else "steps_measured"
    return int(summary[key]) if key in summary else None


def figures(summary: dict) -> dict:
    """The figures an advice ranks and shows, from a run's summary: per device, TPOT (a decode's: a
    prefill has none) and TTFT whichever way the run measures them (a serving run's medians, a decode or
    prefill step's own time). A figure the run did not measure is None, never another figure in its
    place; a p99 over fewer than MIN_SAMPLES_FOR_P99 steps (requests) is left out: it is about their
    maximum, not a tail."""
    serving = is_serving(summary)
    decode = "ttft_ms" not in summary  # a prefill's summary has its TTFT (its step), a decode's none
    # Throughput is one DP group's (batch_size is per DP group), which runs on its tp devices: divided by
    # tp × dp, a dp of 2 ranked the same per-device work half as high.
    group_devices = max(1, int(summary.get("tp", 1)))
    p99 = summary.get("p99_tpot_ms") if serving else summary["step_ms_p99"] if decode else None
    samples = p99_samples(summary)
    return {
        "tok_s_per_device": summary["throughput_tok_s"] / group_devices,
        "tpot_ms_p50": summary.get("median_tpot_ms") if serving else summary["step_ms_p50"] if decode else None,
        "tpot_ms_p99": None if samples is not None and samples < MIN_SAMPLES_FOR_P99 else p99,
        "ttft_ms": summary.get("median_ttft_ms") if serving else summary.get("ttft_ms"),
        # A serving run's requests arrive prefilled: its TTFT is the wait for the first decode token.
        "ttft_without_prefill": serving and bool(summary.get("ttft_note")),
        "bubble_ratio": summary["bubble_ratio"],
        "bound": summary["bound"],
        "padding_waste": summary.get("padding_waste", 0.0),
    }


UNMEASURED = "not measured: "  # how a rejection starts when a limit had no figure to check


def unmeasured(summary: dict, advise: AdviseConfig, steps: int) -> str:
    """A latency limit that applies to the run but that it has no figure for ("" when none): a serving run
    that finished no request has no TPOT, one with no first token no TTFT; decode steps without a request
    stream have no TTFT (a candidate of a space that turns serving off). A prefill's TPOT does not apply."""
    f = figures(summary)
    serving = is_serving(summary)
    if advise.tpot_ms_max is not None and f["tpot_ms_p50"] is None and serving:
        return (f"{UNMEASURED}TPOT ({int(summary.get('requests_completed', 0))} requests finished in {steps} steps),"
                f" so advise.tpot_ms_max={advise.tpot_ms_max:g} could not be checked: raise advise.steps")
    if advise.ttft_ms_max is not None and f["ttft_ms"] is None:
        why = (f"no request had its first token in {steps} steps" if serving else "decode steps without a request stream have no TTFT")
        return f"{UNMEASURED}TTFT ({why}), so advise.ttft_ms_max={advise.ttft_ms_max:g} could not be checked"
    return ""


def latency_miss(summary: dict, advise: AdviseConfig) -> str:
    """Which latency limit a simulated candidate misses, in one line ("" when it meets them). A limit it
    has no figure for is `unmeasured`, which the caller decides on (a short rung passes it on unchecked,
    the last rung rejects it): it is never met silently."""
    f = figures(summary)
    if advise.tpot_ms_max is not None and f["tpot_ms_p50"] is not None and f["tpot_ms_p50"] > advise.tpot_ms_max:
        return f"TPOT p50 {f['tpot_ms_p50']:.6g} ms > advise.tpot_ms_max={advise.tpot_ms_max:g}"
    if advise.ttft_ms_max is not None and f["ttft_ms"] is not None and f["ttft_ms"] > advise.ttft_ms_max:
        what = "TTFT without prefill" if f["ttft_without_prefill"] else "TTFT"
        return f"{what} {f['ttft_ms']:.6g} ms > advise.ttft_ms_max={advise.ttft_ms_max:g}"
    return ""


def simulate(candidate: Candidate, steps: int) -> None:
    """One candidate in this process (the baseline; tests)."""
    assert candidate.run is not None
    record(candidate, steps, simulate_one(candidate.run, steps))


def record(candidate: Candidate, steps: int, result: Result) -> None:
    summary, refused = result
    if summary is None:
        candidate.rejected = refused
    else:
        candidate.summary, candidate.steps = summary, steps
        candidate.summaries[steps] = summary


def prepare(candidates: list[Candidate], base: list[str], advise: AdviseConfig, first_of: dict[str, Candidate]) -> None:
    """Make each candidate's run and check it against the limits that need no simulation; one that runs
    what an earlier one runs (a value that does not apply) is marked so and not simulated again."""
    for candidate in candidates:
        try:
            candidate.run = make_run(base + candidate.overrides)
        except HarnessError as exc:
            candidate.rejected = str(exc)
            continue
        check_limits_before(candidate, advise)
        if not candidate.rejected:
            first = first_of.setdefault(same_run_key(candidate.run), candidate)
            if first is not candidate:
                candidate.rejected = f"{RUNS_AS}{first.label} does (a value that does not apply here)"


class Clock:
    """advise.budget_s, from the search's start."""

    def __init__(self, budget_s: float) -> None:
        self.started, self.budget_s = time.perf_counter(), budget_s

    def out(self) -> bool:
        return time.perf_counter() - self.started > self.budget_s


def simulate_all(candidates: list[Candidate], steps: int, where: Evaluator, clock: Clock,
                 advise: AdviseConfig, last: bool = True) -> tuple[list[Candidate], int]:
    """Simulate `candidates` at `steps` where the evaluator says; returns those that meet the latency limits,
    in order, and how many were not run: past the budget no more results are taken (the workers are ended).
    A limit a candidate has no figure for rejects it at the `last` rung; a shorter one passes it on
    unchecked (its requests may finish in the longer run), and the search says so."""
    met: list[Candidate] = []
    if clock.out():
        return met, len(candidates)
    results = where.map([(c.run, steps) for c in candidates])
    for i, candidate in enumerate(candidates):
        record(candidate, steps, next(results))
        if not candidate.rejected:
            candidate.rejected = latency_miss(candidate.summary, advise) or (unmeasured(candidate.summary, advise, steps) if last else "")
        if not candidate.rejected:
            met.append(candidate)
        if clock.out() and i + 1 < len(candidates):
            where.close()
            return met, len(candidates) - i - 1
    return met, 0
