"""`python -m harness.advise` — the best configuration of a run under the user's limits, with the reasons.

    python -m harness.advise hardware=atlas_a2 workload=qwen3_30b_decode advise=decode_slo advise.tpot_ms_max=30
    python -m harness.advise hardware=h100 workload=llama31_8b_decode advise=max_throughput advise.baseline=[strategy=eager]

Arguments are Hydra overrides: `advise=PRESET` (conf/advise/) and `advise.KEY=VALUE` set the question
(objective, limits, search space, steps, budget); every other override sets the run the candidates
start from, as for `python -m harness`. Each candidate (a combination of the space's values) is checked
against the limits that need no simulation (graph streams, the largest batch against the largest capture
size, capture time, device memory), then simulated, short runs first and longer ones for the leaders: on
one worker process per core (advise.workers), or on a Ray cluster (advise.ray_address=HOST:PORT). Every
combination of a space up to advise.exhaustive_max; beyond it, advise.trials of them picked by Optuna. Writes `candidates.csv` (every candidate: its status, its figures, why it is not ranked) and
`advice.md` to `advise.out` (default outputs/advise/<date>/<time>), and the winner as
`conf/experiment/<advise.name>.yaml` in this folder, which `python -m harness experiment=<name>` runs;
with tracking on (as for a run), an MLflow run holding all of it, the advise.leaders best as its children.
"""
from __future__ import annotations

import datetime
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.base.errors import EXIT_TRACKING_FAILED, ConfigError, TrackingError, fail
from harness.base.files import check_folder

if TYPE_CHECKING:  # imported where used: the command starts before they load
    from harness.config.advise import AdviseConfig
    from harness.config.schema import RunConfig

_HELP = ("-h", "--help")


def split_arguments(argv: list[str]) -> tuple[str, list[str], list[str], str | None]:
    """(advise preset, advise.* overrides without the prefix, the run's overrides, advise.out)."""
    preset, advise, run, out = "max_throughput", [], [], None
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq:
            raise ConfigError(f"{arg}: not an override (KEY=VALUE); see python -m harness.advise --help")
        if key == "advise":
            preset = value
        elif key == "advise.out":
            out = value
        elif key.startswith("advise."):
            advise.append(f"{key.removeprefix('advise.')}={value}")
        else:
            run.append(arg)
    return preset, advise, run, out


def limit_the_run_cannot_meet(advise: AdviseConfig, run: RunConfig) -> str:
    """A latency limit that the run's phase has no figure for ('' when none): a TPOT limit on a prefill,
    a TTFT limit on a decode without a request stream (its requests' first tokens)."""
    from harness.config.schema import Phase

    serving = run.workload.serving.enabled
    if advise.tpot_ms_max is not None and run.workload.phase == Phase.prefill:
        return f"advise.tpot_ms_max={advise.tpot_ms_max:g}: a prefill has no time per output token (its step is its TTFT: advise.ttft_ms_max)"
    if advise.ttft_ms_max is not None and run.workload.phase == Phase.decode and not serving:
        return (f"advise.ttft_ms_max={advise.ttft_ms_max:g}: decode steps without a request stream have no TTFT"
                " (workload.serving.enabled=true gives one; a prefill workload's step is one)")
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in _HELP for a in argv):
        from harness.config.advise import presets

        print(__doc__.strip() + f"\n\nadvise presets: {', '.join(presets())}")
        return 0
    from harness.config.advise import compose_advise

    preset, advise_overrides, base, out_text = split_arguments(argv)
    advise = compose_advise(preset, advise_overrides)
    from harness.advisor.answer import counts_text, p99_note, preset_path, run_command_of, shown_table, status_counts, why, write_answer
    from harness.advisor.candidates import check_space, make_run, value_text
    from harness.advisor.search import advise_runs

    preset_path(advise.name)  # refused now, not after the search
    run = make_run(base)  # the run itself must compose: one line naming the key, before any candidate
    check_space(advise.space, base)  # and every value of the space some run could take: a typo is refused, not a rejection each
    batches = advise.space.get("workload.batch_size", [])
    if run.workload.card is None and len(set(map(str, batches))) > 1:
        # An op list's steps do the same work at any batch_size, which only counts their tokens: tok/s grew with it.
        listed = ",".join(value_text(b) for b in batches)
        raise ConfigError(f"advise.space: workload.batch_size=[{listed}]: an op list's steps do the same work"
                          " whatever the batch (it only counts their tokens); profile or export the batch sizes to compare")
    unmeasured = limit_the_run_cannot_meet(advise, run)
    if unmeasured:  # every candidate would pass it unchecked
        raise ConfigError(unmeasured)
    if advise.baseline:
        try:
            make_run(base + list(advise.baseline))  # and so must the baseline, before a folder is made
        except ConfigError as error:  # named as the baseline's: `strategy=foo` alone reads as the run's own
            raise ConfigError(f"advise.baseline: {error}") from None
    now = datetime.datetime.now()
    out = check_folder("advise.out", out_text or Path("outputs") / "advise" / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S"))
    command = shlex.join(["python", "-m", "harness.advise", *argv])
    advice = advise_runs(base, advise, say=lambda line: print(f"hostbound advise: {line}", file=sys.stderr, flush=True))
    frame, written = write_answer(advice, base, command, out, advise.name)
    shown = shown_table(frame, 10)
    print(shown.to_markdown(index=False, floatfmt=".3f") if len(shown) else "no candidate meets the limits")
    note = p99_note(shown, frame)
    if note:
        print(f"note: {note}")
    print(f"\n{why(advice)}")
    counts = status_counts(frame)
    how = (f"all {advice.space_size:,} combinations" if advice.method == "exhaustive" else
           f"{len(frame)} of {advice.space_size:,} combinations, picked by Optuna's TPE sampler")
    # Counted as advice.md's table of those not ranked counts them (a candidate pruned by a shorter rung
    # is no rejection: it met the limits there).
    print(
        f"\n  searched     {how} in {advice.seconds:.1f} s on {advice.workers} core{'s' if advice.workers > 1 else ''}"
        f" ({len(advice.ranked)} ranked" + (f", {counts_text(counts)}" if counts else "") + "; steps per rung"
        f" {', '.join(f'{steps}: {n} met the limits' for steps, n in advice.rungs)})"
        + (f"; {advice.out_of_time} simulations not run: advise.budget_s={advise.budget_s:g} ran out" if advice.out_of_time else "")
    )
    trimmed = int((frame["note"] != "").sum())
    if trimmed:
        print(f"  trimmed      {trimmed} candidate{'s ask' if trimmed > 1 else ' asks'} for more capture sizes than the stream budget holds:"
              " each runs the sizes kept, as vllm-ascend trims them (advice.md says which)")
    print(f"  results      {out.absolute() / 'advice.md'} (every candidate: candidates.csv)")
    if written is not None:
        print(f"  winner       {written} — run it: {run_command_of(advise.name)}")
    if run.tracking.enabled:
        from harness.advisor.answer import record
        from harness.tracking.advice_runs import log_advice
        from harness.tracking.store import resolve_uri

        try:
            run_id = log_advice(run.tracking, record(advice, advise, base, run.names, command, out, written, advise.leaders))
        except TrackingError as exc:
            fail(str(exc), EXIT_TRACKING_FAILED)
        print(f"  mlflow       run {run_id} in {resolve_uri(run.tracking)} (the {min(advise.leaders, len(advice.ranked))} best as its children)")
    return 0 if advice.ranked else 2
