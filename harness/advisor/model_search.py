"""A space too large to simulate whole: Optuna's TPE sampler picks the candidates (advise.trials of them),
learning from those simulated so far which values give throughput and which break a limit.

Each axis of advise.space is one parameter, the index of its value: ordered where the values are numbers
in order (batch sizes, threads), a category otherwise (strategies; capture-size lists are values too). A candidate that breaks a limit, before or after its simulation, is a violated constraint for the
sampler (`Trial.set_constraint`), so it learns to avoid the region instead of only scoring it low. Trials
are asked and simulated in batches of a fixed size, whatever the number of workers: the sampler (seeded
with the run's `seed`) then sees the same history, and the same question gives the same answer anywhere.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from harness.advisor.candidates import Candidate, make_run, same_run_key, value_text
from harness.advisor.rung import Clock, figures, prepare, simulate_all

if TYPE_CHECKING:
    from harness.advisor.evaluate import Evaluator
    from harness.config.advise import AdviseConfig

BATCH = 8  # candidates simulated together, then told to the sampler
ASKS_PER_TRIAL = 20  # asks allowed per candidate wanted: a sampler that has settled repeats itself


def _distribution(values: list):
    """An axis as the sampler sees it: the index of a value; ordered where the values are numbers in
    order (batch sizes, thread counts: the sampler then learns that neighbours behave alike), else a
    category (strategies, capture-size lists)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numbers and len(values) > 2 and (values == sorted(values) or values == sorted(values, reverse=True)):
        return IntDistribution(0, len(values) - 1)
    return CategoricalDistribution(list(range(len(values))))


def model_search(base: list[str], advise: "AdviseConfig", where: "Evaluator", clock: Clock, space_size: int,
                 say: Callable[[str], None]) -> tuple[list[Candidate], list[Candidate], int]:
    """Simulate the candidates the sampler picks at the first rung's steps. Returns every candidate made and
    those meeting the limits, in the order picked, and how many were left unsimulated by the budget."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    keys = list(advise.space)
    distributions = {key: _distribution(advise.space[key]) for key in keys}
    sampler = optuna.samplers.TPESampler(seed=make_run(base).seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    wanted = min(advise.trials, space_size)
    made_in_order: list[Candidate] = []
    not_run = 0
    made: dict[tuple[int, ...], Candidate] = {}
    first_of: dict[str, Candidate] = {}
    met: list[Candidate] = []
    asks = 0
    while len(made) < wanted and asks < ASKS_PER_TRIAL * wanted and not clock.out():
        pending: list[tuple[optuna.Trial, Candidate]] = []
        fresh: list[Candidate] = []
        while len(fresh) < BATCH and len(made) < wanted and asks < ASKS_PER_TRIAL * wanted:
            trial = study.ask(distributions)
            asks += 1
            picks = tuple(trial.params[key] for key in keys)
            candidate = made.get(picks)
            if candidate is None:
                candidate = Candidate(overrides=[f"{key}={value_text(advise.space[key][i])}" for key, i in zip(keys, picks)])
                made[picks] = candidate
                fresh.append(candidate)
            pending.append((trial, candidate))
        made_in_order += fresh
        prepare(fresh, base, advise, first_of)
        simulated, left = simulate_all([c for c in fresh if not c.rejected], advise.steps[0], where, clock, advise,
                                       last=len(advise.steps) == 1)
        met += simulated
        not_run += left
        for trial, candidate in pending:
            same = _runs_as(candidate, first_of)
            if not same.summary and not same.rejected:  # left unsimulated: the budget ran out
                study.tell(trial, state=TrialState.FAIL)
                continue
            trial.set_constraint("limits", 0.0 if same.summary and not same.rejected else 1.0)
            study.tell(trial, figures(same.summary)["tok_s_per_device"] if same.summary else 0.0)
    say(f"Optuna picked {len(made)} candidates in {asks} trials")
    return made_in_order, met, not_run


def _runs_as(candidate: Candidate, first_of: dict[str, Candidate]) -> Candidate:
    """The candidate whose simulation stands for this one (itself, or the one it runs the same as)."""
    if candidate.run is None or not candidate.runs_as_another:
        return candidate
    return first_of.get(same_run_key(candidate.run), candidate)
