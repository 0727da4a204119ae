"""The search: candidates that pass the limits are simulated on the same simulator (no Hydra job, no MLflow
run each; in this process, forked workers or on Ray: harness.advisor.evaluate), short runs first and longer
ones for the leaders (successive halving), and ranked by the objective among those that meet the user's
latency limits. Every combination of a small space is a candidate; in a large one Optuna's TPE sampler
picks them (harness.advisor.model_search).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from harness.advisor.candidates import Candidate, check_limits_before, check_space, combinations, make_run
from harness.advisor.evaluate import Evaluator, InProcess, OnRay, evaluator
from harness.advisor.model_search import model_search
from harness.advisor.rung import Clock, figures, prepare, simulate, simulate_all, unmeasured
from harness.config.advise import AdviseConfig
from harness.sim.serving import MIN_REQUESTS_FOR_PERCENTILES


def score(candidate: Candidate) -> tuple[float, int, float, float]:
    """Higher is better: the objective, then (on a tie) fewer graphs, less capture time, less memory."""
    return (figures(candidate.summary)["tok_s_per_device"], -candidate.graphs, -candidate.capture_s, -candidate.memory_gb)


@dataclass
class Advice:
    candidates: list[Candidate]  # every one made, in the order made (the space's, or the model's trials')
    ranked: list[Candidate]  # simulated at the last rung and meeting every limit, best first
    baseline: Candidate | None
    rungs: list[tuple[int, int]] = field(default_factory=list)  # (steps, candidates that met the limits)
    seconds: float = 0.0
    out_of_time: int = 0  # candidates left unsimulated when advise.budget_s ran out
    space_size: int = 0  # combinations in advise.space
    method: str = "exhaustive"  # or "optuna": a model chose which candidates to simulate
    workers: int = 1  # simulations at once (processes here, or a Ray cluster's cores)
    notes: list[str] = field(default_factory=list)  # what qualifies the ranking (a rung pruned on thin serving figures)


def space_size(space: dict[str, list]) -> int:
    return math.prod(len(values) for values in space.values())


def advise_runs(base: list[str], advise: AdviseConfig, say: Callable[[str], None] = lambda line: None,
                where: Evaluator | None = None) -> Advice:
    """Search the space on top of `base` (the run's overrides) as `advise` asks: every combination where the
    space is small (advise.search=exhaustive, or auto up to advise.exhaustive_max), else the candidates
    Optuna's TPE sampler picks (advise.trials of them); then successive halving over advise.steps."""
    check_space(advise.space, base)  # a typo in the space is the user's, refused before any candidate: not a rejection each
    clock = Clock(advise.budget_s)
    size = space_size(advise.space)
    method = advise.search if advise.search != "auto" else ("exhaustive" if size <= advise.exhaustive_max else "optuna")
    baseline = None
    if advise.baseline:  # composed first: a bad baseline is refused before the search spends its time
        baseline = Candidate(overrides=list(advise.baseline))
        baseline.run = make_run(base + baseline.overrides)
    where = where or evaluator(advise.workers, advise.ray_address)
    advice = Advice(candidates=[], ranked=[], baseline=None, space_size=size, method=method, workers=where.workers)
    try:
        if method == "exhaustive":
            advice.candidates = [Candidate(overrides=combo) for combo in combinations(advise.space)]
            prepare(advice.candidates, base, advise, {})
            alive = [c for c in advice.candidates if not c.rejected]
            same = sum(c.runs_as_another for c in advice.candidates)
            # Worded as the summary at the end words them: a duplicate is not simulated, but breaks no limit.
            skipped = ", ".join(part for part in (
                f"{size - len(alive) - same} rejected before simulating" if size - len(alive) > same else "",
                f"{same} the same run as another candidate" if same else "",
            ) if part)
            say(f"{size} candidates" + (f" ({skipped})" if skipped else "") + f"; simulating on {_where_text(where)}")
            first_rung = None
        else:
            say(f"{size:,} candidates: Optuna's TPE sampler picks {advise.trials} of them to simulate on {_where_text(where)}")
            advice.candidates, first_rung, advice.out_of_time = model_search(base, advise, where, clock, size, say)
            alive = first_rung
        for rung, steps in enumerate(advise.steps):
            if rung == 0 and first_rung is not None:
                simulated = first_rung
            else:
                simulated, not_run = simulate_all(alive, steps, where, clock, advise, last=rung == len(advise.steps) - 1)
                advice.out_of_time += not_run
            advice.rungs.append((steps, len(simulated)))
            simulated = sorted(simulated, key=score, reverse=True)  # stable: ties keep the order made
            say(f"{steps} steps: {len(simulated)} candidates meet the limits" + (f", best {simulated[0].label}" if simulated else ""))
            last = rung == len(advise.steps) - 1
            alive = simulated if last else simulated[: max(1, math.ceil(len(simulated) * advise.keep))]
            for place, dropped in enumerate(simulated[len(alive):], start=len(alive) + 1):
                dropped.pruned = (f"pruned after the {steps}-step rung: ranked {place} of {len(simulated)} there, the best {len(alive)}"
                                  f" went on (advise.keep={advise.keep:g})")
            unchecked = [c for c in simulated if unmeasured(c.summaries[steps], advise, steps)] if not last else []
            if unchecked:  # a limit with no figure yet (no request finished): passed on, checked at the last rung
                what = sorted({unmeasured(c.summaries[steps], advise, steps).split()[2] for c in unchecked})  # TPOT, TTFT
                note = (f"the {steps}-step rung had no {' or '.join(what)} for {len(unchecked)} of {len(simulated)} candidates"
                        f" (no request finished there: {', '.join(c.label for c in unchecked[:3])}{', …' if len(unchecked) > 3 else ''}),"
                        f" so it ranked them on throughput alone, their latency limits unchecked; the last rung rejects any still unmeasured")
                advice.notes.append(note)
                say(f"note: {note}")
            thin = [c for c in simulated if c.summaries[steps].get("requests_completed", MIN_REQUESTS_FOR_PERCENTILES) < MIN_REQUESTS_FOR_PERCENTILES]
            if not last and thin and len(alive) < len(simulated):
                # A request stream's throughput before its requests finish is its batches' alone: a server
                # that pads more can look slower there and faster once requests complete.
                note = (f"the {steps}-step rung dropped {len(simulated) - len(alive)} of {len(simulated)} candidates while {len(thin)} of them"
                        f" had finished fewer than {MIN_REQUESTS_FOR_PERCENTILES} requests: raise advise.steps[0] for a ranking on finished requests")
                advice.notes.append(note)
                say(f"note: {note}")
        advice.ranked = alive
        last_steps = advise.steps[-1]
        thin = [c for c in alive if c.summaries.get(last_steps, {}).get("requests_completed", MIN_REQUESTS_FOR_PERCENTILES) < MIN_REQUESTS_FOR_PERCENTILES]
        if thin:  # the figures the ranking and its limits read (TPOT, TTFT) rest on too few requests
            done = int(thin[0].summaries[last_steps]["requests_completed"]) if thin[0] is alive[0] else None
            note = (f"{len(thin)} of the {len(alive)} ranked candidates finished fewer than {MIN_REQUESTS_FOR_PERCENTILES} requests in"
                    f" {last_steps} steps" + (f" (the winner {done})" if done is not None else "")
                    + ": their latency figures and the limits checked on them rest on few requests; raise advise.steps")
            advice.notes.append(note)
            say(f"note: {note}")
    finally:
        where.close()
    if baseline is not None:
        check_limits_before(baseline, advise)
        simulate(baseline, advise.steps[-1])
        advice.baseline = baseline
    advice.seconds = time.perf_counter() - clock.started
    return advice


def _where_text(where: Evaluator) -> str:
    if isinstance(where, InProcess):
        return "this process"
    return f"{where.workers} cores of Ray" if isinstance(where, OnRay) else f"{where.workers} worker processes"
