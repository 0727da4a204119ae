"""What an advice tells the user: the ranked table, the winner's margins, why it wins (from the critical
path), the rejected candidates with their reasons, the winner as an `experiment=` preset that
`python -m harness` runs as is, and what its MLflow runs hold (`record`)."""
from __future__ import annotations

import dataclasses
import datetime
import shlex
from pathlib import Path

import pandas as pd
import yaml

from harness.advisor.candidates import Candidate, value_text
from harness.advisor.rung import p99_samples
from harness.advisor.search import Advice, figures
from harness.sim.metrics import MIN_SAMPLES_FOR_P99
from harness.config.advise import AdviseConfig
from harness.base.errors import ConfigError
from harness.base.files import write_text
from harness.config.paths import CONF_DIR, LAUNCH_FOLDER_CONF
from harness.config.schema import unflatten
from harness.results.comparison import pareto_plot
from harness.results.outputs import WHERE_THINGS_GO
from harness.base.overrides import override_key, split_override

WRITTEN_MARK = "# Written by python -m harness.advise"
_GROUP_KEYS = ("hardware", "workload", "strategy", "engine")


def row(candidate: Candidate, rank: int | None) -> dict:
    f = figures(candidate.summary) if candidate.summary else {}
    samples = p99_samples(candidate.summary) if candidate.summary else None
    status, reason = _status(candidate, rank)
    return {
        "rank": rank, "status": status, "candidate": candidate.label, **f, "graphs": candidate.graphs,
        "graph_mem_gb": round(candidate.graph_mem_gb, 3),
        "capture_s": round(candidate.capture_s, 3), "memory_gb": round(candidate.memory_gb, 2), "steps": candidate.steps,
        "p99_samples": samples, "reason": reason, "note": candidate.note,
    }


# Why a candidate is not ranked, as the table's `status` says it; in this order the counts are given.
STATUSES = {
    "rejected": "rejected",  # broke a limit (before simulating or once simulated), or refused in this combination
    "same run": "the same run as another candidate",  # runs what an earlier candidate runs: not simulated again
    "pruned": "pruned by a shorter rung",  # met the limits there, ranked below the share advise.keep keeps
    "not simulated": "not simulated: advise.budget_s ran out",
}


def _status(candidate: Candidate, rank: int | None) -> tuple[str, str]:
    """(status, reason): every candidate has one, the ranked ones with no reason to give."""
    if rank is not None:
        return "ranked", ""
    if candidate.runs_as_another:
        return "same run", candidate.rejected
    if candidate.rejected:
        return "rejected", candidate.rejected
    if candidate.pruned:
        return "pruned", candidate.pruned
    after = f"after its {candidate.steps}-step run" if candidate.steps else "before its first run"
    return "not simulated", f"advise.budget_s ran out {after}"


def status_counts(frame: pd.DataFrame) -> dict[str, int]:
    """Candidates not ranked, by status (those with none left out), in STATUSES' order."""
    counts = frame["status"].value_counts() if len(frame) else {}
    return {status: int(counts[status]) for status in STATUSES if status in counts}


def counts_text(counts: dict[str, int]) -> str:
    """`8 rejected, 16 the same run as another candidate, 15 pruned by a shorter rung`: the terminal's words
    and advice.md's, for the same candidates."""
    return ", ".join(f"{n} {STATUSES[status]}" for status, n in counts.items())


def rejected_counts(frame: pd.DataFrame) -> tuple[int, int]:
    """(candidates that broke a limit, candidates not simulated because another runs the same) of a table."""
    counts = status_counts(frame)
    return counts.get("rejected", 0), counts.get("same run", 0)


def table(advice: Advice) -> pd.DataFrame:
    """Every candidate: the ranked ones first (rank 1 = the winner), then the others, each with its status
    and the reason."""
    ranked = [row(c, i + 1) for i, c in enumerate(advice.ranked)]
    others = [row(c, None) for c in advice.candidates if c not in advice.ranked]
    return pd.DataFrame(ranked + others)


def p99_note(shown: pd.DataFrame, frame: pd.DataFrame) -> str:
    """Where a table leaves tpot_ms_p99 out, why ("" where it leaves none out): over fewer than 20 steps
    (a serving run: finished requests) a p99 is about their maximum, as a run's own note says."""
    rows = frame.loc[shown.index]
    out = rows[rows["p99_samples"].notna() & (rows["p99_samples"] < MIN_SAMPLES_FOR_P99) & rows["tpot_ms_p50"].notna()] \
        if "tpot_ms_p50" in rows and len(rows) else rows.iloc[:0]
    if not len(out):
        return ""
    low, high = int(out["p99_samples"].min()), int(out["p99_samples"].max())
    span = f"{low}" if low == high else f"{low}-{high}"
    # A serving run's p99 is over its finished requests (ttft_without_prefill: set on every serving run's row)
    serving = out["ttft_without_prefill"].fillna(False).astype(bool) if "ttft_without_prefill" in out else pd.Series(False, index=out.index)
    unit = "finished requests" if serving.all() else "measured steps" if not serving.any() else "measured steps (a serving run: finished requests)"
    return (f"tpot_ms_p99 is left out of {len(out)} of the {len(rows)} rows: it would rest on {span} {unit}, fewer than"
            f" {MIN_SAMPLES_FOR_P99}, about their maximum, not a tail (raise advise.steps for one)")


def margin_text(winner: Candidate, other: Candidate | None, what: str) -> str:
    if other is None:
        return ""
    if not other.summary:  # a baseline that could not run (it does not fit the device): said, not left out unsaid
        return f"{what} ({other.label or 'as set'}) has no figures to compare with: {other.rejected}" if other.rejected else ""
    mine, theirs = figures(winner.summary)["tok_s_per_device"], figures(other.summary)["tok_s_per_device"]
    return f"{mine / theirs:.2f}× the throughput per device of {what} ({other.label or 'as set'}: {theirs:.1f} tok/s)"


def _latency_text(f: dict) -> str:
    """` at TPOT p50 … ms, TTFT … ms`, each where the run measured it (a serving run with no request done has neither)."""
    prefill = " (without prefill: the requests arrive prefilled)" if f["ttft_without_prefill"] else ""
    parts = ([f"TPOT p50 {f['tpot_ms_p50']:.2f} ms"] if f["tpot_ms_p50"] is not None else []) + (
        [f"TTFT {f['ttft_ms']:.1f} ms{prefill}"] if f["ttft_ms"] is not None else [])
    return " at " + ", ".join(parts) if parts else ""


def why(advice: Advice) -> str:
    """One paragraph on the winner: its figures, its margins, and what its critical path says."""
    unfinished = (
        f"advise.budget_s ran out: {advice.out_of_time} simulations were not run, and the ranking is of the candidates"
        " that were (raise advise.budget_s, or narrow advise.space). " if advice.out_of_time else ""
    ) + "".join(f"Note: {note}. " for note in advice.notes)
    if not advice.ranked:
        return unfinished + "No candidate meets the limits: candidates.csv and advice.md's table of those not ranked say why each is out."
    winner = advice.ranked[0]
    f = figures(winner.summary)
    parts = [
        f"{winner.label} gives {f['tok_s_per_device']:.1f} tok/s per device{_latency_text(f)}.",
        f"It is {f['bound']}-bound (critical path: {_path_text(winner.summary)}), the device idle {f['bubble_ratio']:.0%} of the time"
        + _front_end_text(winner.summary)
        + (f", padding waste {f['padding_waste']:.1%}" if f["padding_waste"] else "") + ".",
    ]
    different = [c for c in advice.ranked[1:] if figures(c.summary)["tok_s_per_device"] != f["tok_s_per_device"]]
    ties = len(advice.ranked) - 1 - len(different)
    if ties:
        parts.append(f"{ties} other candidate{'s' if ties > 1 else ''} match{'es' if ties == 1 else ''} it with more graphs, capture time or memory, or in values that do not change the figures.")
    runner_up = margin_text(winner, different[0] if different else None, "the runner-up")
    baseline = margin_text(winner, advice.baseline, "the baseline")
    parts += [f"{m[0].upper()}{m[1:]}." for m in (runner_up, baseline) if m]
    if winner.graphs:
        parts.append(f"It captures {winner.graphs} graphs ({winner.graph_mem_gb:.2f} GB, {winner.capture_s:.1f} s at start-up)"
                     + (f": {winner.note}." if winner.note else "."))
    parts += _against_other_strategies(advice, winner) + _against_other_sizes(advice, winner)
    return unfinished + " ".join(parts)


def _front_end_text(summary: dict) -> str:
    """Where the idle time is kernels' front-end gaps, how much: no host change removes that part."""
    front_end = summary.get("bubble_front_end", 0.0)
    return f" ({front_end:.0%} in kernels' front-end gaps)" if front_end >= 0.005 else ""


def _path_text(summary: dict) -> str:
    """The three largest shares of the critical path ("launch 26%, framework 22%, tiling 22%")."""
    shares = sorted(((k.removeprefix("breakdown_"), v) for k, v in summary.items() if k.startswith("breakdown_") and v > 0.02), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {share:.0%}" for name, share in shares[:3])


def _rivals(advice: Advice, winner: Candidate, differs) -> tuple[int, list[Candidate]]:
    """Candidates simulated at the winner's first rung, meeting every limit there, for which `differs` holds:
    compared at equal steps only (a short rung's figures are not a long one's)."""
    steps = min(winner.summaries)
    return steps, [c for c in advice.candidates if c is not winner and not c.rejected and steps in c.summaries and c.run is not None and differs(c)]


def _against_other_strategies(advice: Advice, winner: Candidate) -> list[str]:
    """What the winner's strategy buys: the best candidate of another strategy, at the same steps."""
    assert winner.run is not None
    steps, rivals = _rivals(advice, winner, lambda c: c.run.strategy.name != winner.run.strategy.name)
    if not rivals:
        missed = [c for c in advice.candidates if c.run is not None and steps in c.summaries and c.run.strategy.name != winner.run.strategy.name]
        if not missed:
            return []
        closest = max(missed, key=lambda c: figures(c.summaries[steps])["tok_s_per_device"])
        return [f"No candidate with another strategy meets the limits: the best of them, {closest.label}, has {closest.rejected}."]
    best = max(rivals, key=lambda c: figures(c.summaries[steps])["tok_s_per_device"])
    mine, theirs = (figures(c.summaries[steps]) for c in (winner, best))
    if theirs["tok_s_per_device"] <= 0:
        return []
    return [f"The best candidate with another strategy, {best.label}, gives {theirs['tok_s_per_device']:.1f} tok/s per device against"
            f" the winner's {mine['tok_s_per_device']:.1f} ({mine['tok_s_per_device'] / theirs['tok_s_per_device']:.2f}×, both over {steps}"
            f" steps): {theirs['bound']}-bound, critical path {_path_text(best.summaries[steps])}."]


def _against_other_sizes(advice: Advice, winner: Candidate) -> list[str]:
    """What the winner's capture sizes buy: the same candidate with another size list, at the same steps."""
    sizes_key = "strategy.graph.buckets="
    rest = [o for o in winner.overrides if not o.startswith(sizes_key)]
    if not winner.graphs or len(rest) == len(winner.overrides):
        return []
    steps, rivals = _rivals(advice, winner, lambda c: c.graphs > 0 and [o for o in c.overrides if not o.startswith(sizes_key)] == rest)
    mine = figures(winner.summaries[steps])["padding_waste"]
    worse = [c for c in rivals if figures(c.summaries[steps])["padding_waste"] > mine]
    if not worse:
        return []
    most = max(worse, key=lambda c: figures(c.summaries[steps])["padding_waste"])

    def sizes(candidate: Candidate) -> str:
        return next(o for o in candidate.overrides if o.startswith(sizes_key)).removeprefix(sizes_key)

    return [f"Its capture sizes {sizes(winner)} cut padding waste to {mine:.1%} from {figures(most.summaries[steps])['padding_waste']:.1%}"
            f" with {sizes(most)} ({steps} steps)."]


def preset_text(base: list[str], winner: Candidate, command: str) -> str:
    """The winner as an experiment preset: the experiment it builds on (a base `+experiment=…`), the presets
    it chose, then every value set on top (Hydra's `+` dropped), with the steps it was ranked at (so that
    it runs exactly as ranked)."""
    # What ran, not where its files and runs went (tracking.uri, output.*): a preset another user runs
    # would log to the advising user's store.
    written = [split_override(o) for o in base + winner.overrides if not o.startswith("~") and not override_key(o).startswith(WHERE_THINGS_GO)]
    experiments = [value for key, _, value in written if key == "experiment"]
    choices = {key: value for key, _, value in written if key in _GROUP_KEYS}
    dotted = written + [("workload.steps", "=", str(winner.steps)), ("workload.warmup_steps", "=", "0")]
    values = unflatten({key: yaml.safe_load(value) for key, _, value in dotted if key not in (*_GROUP_KEYS, "experiment")})
    f = figures(winner.summary)
    head = [
        "# @package _global_",
        f"{WRITTEN_MARK} on {datetime.date.today().isoformat()}: {command}",
        f"# ranked first: {f['tok_s_per_device']:.1f} tok/s per device{_latency_text(f)}, {f['bound']}-bound",
        "defaults:",
        *(f"  - {name}" for name in experiments),  # an experiment of the same group it builds on
        *(f"  - override /{key}: {name}" for key, name in choices.items()),
    ]
    return "\n".join(head) + "\n" + yaml.safe_dump(values, sort_keys=False)


def preset_path(name: str) -> Path:
    """conf/experiment/<name>.yaml of the launch folder (Hydra's search path has it), refused when the name
    is a shipped preset's or the file is not one an advice wrote."""
    if (CONF_DIR / "experiment" / f"{name}.yaml").exists():
        raise ConfigError(f"advise.name={name}: a shipped experiment preset has that name; choose another")
    path = Path.cwd() / LAUNCH_FOLDER_CONF / "experiment" / f"{name}.yaml"
    if path.exists() and WRITTEN_MARK not in path.read_text():
        raise ConfigError(f"advise.name={name}: {path} exists and was not written by an advice; choose another name")
    return path


def shown_table(frame: pd.DataFrame, rows: int) -> pd.DataFrame:
    """The ranked rows, as a reader wants them: ranks as integers, columns that hold nothing left out."""
    shown = frame[frame["rank"].notna()].head(rows).drop(columns=["status", "p99_samples", "reason", "note"], errors="ignore")
    shown = shown.astype({"rank": int}).dropna(axis="columns", how="all")
    if "ttft_without_prefill" in shown and not shown["ttft_without_prefill"].fillna(False).astype(bool).any():
        shown = shown.drop(columns=["ttft_without_prefill"])  # a flag of serving runs' TTFT: without one, 'False' says nothing
    return shown


def write_answer(advice: Advice, base: list[str], command: str, out: Path, name: str) -> tuple[pd.DataFrame, Path | None]:
    """candidates.csv, advice.md and (with a winner) the experiment preset; returns the table and the preset."""
    out.mkdir(parents=True, exist_ok=True)
    frame = table(advice)
    frame.to_csv(out / "candidates.csv", index=False)
    shown = shown_table(frame, 20)
    lines = [f"# Advice: {command}", "", why(advice), "",
             shown.to_markdown(index=False, floatfmt=".3f") if len(shown) else "No candidate meets the limits."]
    note = p99_note(shown, frame)
    if note:
        lines += ["", f"Note: {note}."]
    trimmed = frame[frame["note"] != ""]
    if len(trimmed):
        lines += ["", f"## Capture sizes trimmed to the stream budget ({len(trimmed)})", "",
                  "Each runs, and is charged for, the sizes kept, as the run itself would.", "",
                  trimmed[["candidate", "note"]].to_markdown(index=False)]
    others = frame[frame["rank"].isna()]
    if len(others):  # every candidate not ranked, counted as the terminal counts them
        lines += ["", f"## Not ranked ({len(others)}: {counts_text(status_counts(frame))})", "",
                  others[["candidate", "status", "reason"]].to_markdown(index=False)]
    # every candidate of the last rung, limits met or not (none, where every candidate was rejected unsimulated)
    simulated = frame[frame["steps"] == frame["steps"].max()].dropna(subset=["tpot_ms_p50"]) if "tpot_ms_p50" in frame else frame.iloc[:0]
    if len(simulated):
        pareto_plot(simulated["tok_s_per_device"].to_numpy(float), 1000.0 / simulated["tpot_ms_p50"].to_numpy(float),
                    list(simulated["candidate"]), out / "pareto.png",
                    f"the {len(simulated)} candidates simulated {int(simulated['steps'].iloc[0])} steps (the last rung)")
        lines += ["", "![throughput per device against tokens per second per user](pareto.png)"]
    write_text(out / "advice.md", "\n".join(lines) + "\n")
    preset = None
    if advice.ranked:
        preset = preset_path(name)
        preset.parent.mkdir(parents=True, exist_ok=True)
        write_text(preset, preset_text(base, advice.ranked[0], command))
    return frame, preset


@dataclasses.dataclass
class LeaderRecord:
    """A leader of the advice, as its MLflow child run holds it."""

    name: str  # what it sets ("strategy=acl_graph batch_size=64")
    rank: int
    overrides: list[str]
    summary: dict  # its simulation's, at the last rung
    tags: dict


@dataclasses.dataclass
class AdviceRecord:
    """What the advice's MLflow parent run holds (harness.tracking.advice_runs logs it)."""

    name: str
    params: dict  # the question: the run's overrides and the advise.* values set
    metrics: dict  # advice/…: candidates, rejected, seconds
    winner_summary: dict  # its numbers become the parent's headline metrics
    tags: dict
    description: str  # Markdown: the why and the ranked table
    artifacts: list[Path]
    leaders: list[LeaderRecord]


def record(advice: Advice, advise: AdviseConfig, base: list[str], names: dict[str, str], command: str, out: Path,
           preset: Path | None, leaders: int) -> AdviceRecord:
    """The advice as an MLflow parent run with its `leaders` best candidates as children."""
    frame = table(advice)
    # The question, as a run's params hold one: not where files and runs go, nor how the search ran.
    question = {param_key(key): value for key, _, value in (o.partition("=") for o in base) if not param_key(key).startswith(WHERE_THINGS_GO)}
    for f in dataclasses.fields(advise):  # the values that ask something: the objective, and any not left at its default
        value = getattr(advise, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name == "space":
            question.update({f"advise.space.{param_key(key)}": value_text(values) for key, values in value.items()})
        elif (value != default or f.name == "objective") and f.name not in ("name", "out", "workers", "ray_address"):
            question[f"advise.{f.name}"] = value_text(value)
    question["advise.search"] = advice.method  # auto, resolved
    winner = advice.ranked[0] if advice.ranked else None
    shown = shown_table(frame, 20)
    note = p99_note(shown, frame)
    description = "\n\n".join([f"`{command}`", why(advice), shown.to_markdown(index=False, floatfmt=".3f") if len(shown) else "",
                                 *([f"Note: {note}."] if note else [])])
    artifacts = [out / "advice.md", out / "candidates.csv", *([out / "pareto.png"] if (out / "pareto.png").exists() else []),
                 *([preset] if preset is not None else [])]
    return AdviceRecord(
        name=f"advise: {names['workload']} on {names['hardware']}",
        params=question,
        metrics={"advice/candidates": len(frame), "advice/rejected": rejected_counts(frame)[0], "advice/seconds": advice.seconds,
                 "advice/space_size": advice.space_size},
        winner_summary=winner.summary if winner else {},
        # The winner's choices (strategy, engine) with its numbers: the question's base run is not what they measure.
        tags={**names, **(winner.run.names if winner and winner.run else {}), "advice_dir": str(out.absolute()), "command": command,
              **({"bound": winner.summary["bound"]} if winner else {})},
        description=description,
        artifacts=artifacts,
        leaders=[LeaderRecord(name=f"#{i + 1} {c.label}", rank=i + 1, overrides=c.overrides, summary=c.summary, tags={**c.run.names, "bound": c.summary["bound"]})
                 for i, c in enumerate(advice.ranked[:leaders]) if c.run is not None],
    )


def param_key(key: str) -> str:
    """An override's key as an MLflow param's: Hydra's `+`/`~` (add, delete) taken off each part. MLflow
    refuses a key with `+` in it (`advise.space.+workload.card_overrides.num_hidden_layers` failed the whole
    advice's logging, exit 3)."""
    return ".".join(part.strip().lstrip("+~") for part in key.split("."))


def run_command_of(name: str) -> str:
    return shlex.join(["python", "-m", "harness", f"experiment={name}"])
