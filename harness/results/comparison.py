"""Comparing runs: speed-up of each strategy over eager, per workload, as a table and plots.

Runs come in as a pandas DataFrame, one row per run: from run or sweep folders (`load_run_dirs`, their
summary.json files) or from an MLflow store (harness.tracking.read). `python -m harness.report`
(harness.cli.report) and a sweep's end (harness.sweep.callbacks) both use it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from harness.base.files import atomic_write
from harness.base.overrides import override_key, split_override
from harness.results.outputs import LATENCY_SHOWN, WHERE_THINGS_GO, run_notes, run_summaries, short_setting

KEYS = ["hardware", "workload", "strategy"]
# The request latencies (a run without them leaves them out) after the step time.
SHOWN = ["throughput_tok_s", "speedup_vs_eager", "step_ms_mean", *LATENCY_SHOWN, "bubble_ratio", "bubble_front_end", "bound"]


def load_run_dirs(paths: list[Path]) -> pd.DataFrame:
    """One row per run folder found under the given directories (a run or a whole sweep): a folder under
    two of them (a sweep and one of its jobs given) is read once, as the MLflow reader reads a run once (it
    was a second eager run in the speed-ups' mean)."""
    rows = []
    seen: set[Path] = set()
    for root in paths:
        for summary in run_summaries(Path(root)):
            if summary.parent.resolve() in seen:
                continue
            seen.add(summary.parent.resolve())
            row = json.loads(summary.read_text())
            row["run_dir"] = str(summary.parent.absolute())
            # The summary's own record (as a single run writes it: a resumed job's `resume=True` and a
            # sweep's `True` are not in it); Hydra's, for a summary from before it held one.
            overrides = summary.parent / ".hydra" / "overrides.yaml"
            if "overrides" not in row and overrides.is_file():
                row["overrides"] = " ".join(OmegaConf.load(overrides))
            rows.append(row)
    return pd.DataFrame(rows)


def write_csv(path: Path, table: pd.DataFrame) -> None:
    """A table of runs as CSV, counts as counts: a column with a gap (the eager jobs have no graph_captures)
    is float in pandas, and its 51 was written 51.0; a float column all of whose values are whole is
    written as integers (MLflow's metrics are floats whatever they count)."""
    whole = {}
    for column in table.columns:
        values = table[column]
        if values.dtype.kind == "f" and values.notna().any():
            present = values.dropna()
            if bool(np.all(np.isfinite(present))) and bool((present == np.round(present)).all()) and float(present.abs().max()) < 2**53:
                whole[column] = "Int64"
    atomic_write(path, lambda tmp: table.astype(whole).to_csv(tmp, index=False))


def comparison(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (hardware, workload, other swept values): each strategy's throughput, speed-up over the eager
    run of the same setting (`_settings`; NaN, and said by `missing_eager`, when there is none), step
    time, request latencies where any run has them, bubble, bound; one row a setting (`_one_row_a_setting`);
    eager first, swept values in numeric order."""
    if runs.empty:
        return runs
    table = runs.reset_index(drop=True)  # its own row labels: two tables put together repeat theirs
    if "overrides" in table.columns:
        table["swept"] = swept_values(table["overrides"])
    table["_setting"] = _settings(table)
    same = ["hardware", "workload", "_setting"]
    if "notes" not in table.columns:  # run folders: from the summaries; MLflow runs carry a notes tag
        table["notes"] = [run_notes(row) for row in table.to_dict("records")]
    baseline = _eager_baselines(table, same)
    table["speedup_vs_eager"] = table["throughput_tok_s"].to_numpy() / np.asarray(baseline, dtype=float)
    # A serving run's throughput is what its arrival rate offers until it saturates: a graph that cuts the
    # TPOT by 6 % showed a speed-up of 1.01 with nothing saying why. A serving run has request latencies, or
    # first tokens only (a short run where no request finished has no TPOT).
    serving = pd.Series(False, index=table.index)
    for column in SERVING_COLUMNS:
        if column in table.columns:
            serving |= table[column].notna()
    compared = serving & table["speedup_vs_eager"].notna() & table["strategy"].ne("eager")
    table.loc[compared, "notes"] = [_joined(n, SERVING_SPEEDUP) for n in table.loc[compared, "notes"]]
    # Eager runs of one setting with other strategy switches (an experiment's task fusion) are other runs,
    # not repeats of one: a summary from before strategy_changes leaves it NaN, grouped as one.
    strategy_keys = ["strategy", "strategy_changes"] if "strategy_changes" in table.columns else ["strategy"]
    table = _one_row_a_setting(table, same + strategy_keys, [c for c in SHOWN if c in table.columns])
    columns = KEYS + [c for c in SHOWN if c in table.columns and (c not in LATENCY_SHOWN or table[c].notna().any())] + ["notes"]
    if "swept" in table.columns and table["swept"].ne("").any():
        columns.insert(len(KEYS), "swept")
    order = table.assign(
        _eager_first=table["strategy"].ne("eager"),
        _swept_key=table["swept"].map(_numeric_key) if "swept" in table.columns else 0,
    ).sort_values(["hardware", "workload", "_swept_key", "_eager_first", "strategy"], key=None)
    return order[columns].reset_index(drop=True)


# Said on a serving run's speed-up (a run with request latencies at an arrival rate).
SERVING_COLUMNS = ("median_tpot_ms", "median_ttft_ms", "requests_completed")
SERVING_SPEEDUP = ("speed-up of served throughput at one arrival rate: below saturation both serve what arrives;"
                   " TPOT and TTFT show what the strategy changes")

# Said on every run of a setting whose eager runs give no one baseline (not "no eager run": there are several).
NO_ONE_EAGER = "eager runs differ in their strategy switches, none in fewer than the others"


def _eager_baselines(table: pd.DataFrame, same: list[str]) -> pd.Series:
    """Per run, the throughput of its setting's eager run (NaN: none). Where the setting's eager runs differ
    in their strategy switches (`strategy_changes`: `experiment=a2_deepseek_eager,a2_deepseek_fusion,…` are
    eager, and eager with task fusion), the one with the fewest switches beyond plain eager is the baseline,
    not their mean (4.90x shown for a 5.05x graph): the plain one, or the one that adds nothing but what
    every run of the sweep adds (`strategy.tiling_cache=true` on the command line). Where no one has the
    fewest, there is none. Either way every run of the setting says so (`notes`)."""
    eager = table["strategy"] == "eager"
    changes = table["strategy_changes"] if "strategy_changes" in table.columns else pd.Series(np.nan, index=table.index)
    baseline = pd.Series(np.nan, index=table.index)
    for _, rows in table.groupby(same, sort=False, dropna=False).indices.items():
        index = table.index[rows]
        candidates = index[eager.loc[index].to_numpy()]
        kinds = changes.loc[candidates].dropna().unique()
        if len(kinds) > 1:
            counts = {kind: len(str(kind).split()) for kind in kinds}
            fewest = [kind for kind in kinds if counts[kind] == min(counts.values())]
            if len(fewest) == 1:
                candidates = candidates[(changes.loc[candidates] == fewest[0]).to_numpy()]
                what = "the plain eager run" if not fewest[0] else f"the eager run with the fewest strategy switches ({fewest[0]})"
                note = f"the speed-ups are over {what}, {_run_name(table.loc[candidates[0]])}: this setting's {len(kinds)} kinds of eager run differ in their strategy switches"
            else:
                candidates = candidates[:0]
                note = f"no speed-up: this setting's {NO_ONE_EAGER} ({' / '.join(str(k) for k in fewest)})"
            table.loc[index, "notes"] = [_joined(n, note) for n in table.loc[index, "notes"]]
        if len(candidates):
            baseline.loc[index] = table.loc[candidates, "throughput_tok_s"].mean()
    return baseline


def _settings(table: pd.DataFrame) -> pd.Series:
    """Per run, the setting its eager run must share: what ran but the strategy (setting_hash) with the
    strategy's own keys that differ between the runs (a sweep over strategy.fusion compares each with the
    eager run of its own value); for a run that has no setting_hash (a summary from before it), the
    overrides that differ, as before. Per row: one old run left the whole table matched by overrides."""
    swept = table["swept"] if "swept" in table.columns else pd.Series("", index=table.index)
    hashes = table["setting_hash"] if "setting_hash" in table.columns else pd.Series(np.nan, index=table.index)
    knobs = swept.map(lambda text: " ".join(o for o in str(text).split() if override_key(o).startswith("strategy.")))
    return pd.Series([f"{h} {k}" if isinstance(h, str) and h else f"overrides: {w}" for h, k, w in zip(hashes, knobs, swept)],
                     index=table.index)


def _one_row_a_setting(table: pd.DataFrame, setting: list[str], numbers: list[str]) -> pd.DataFrame:
    """Runs of one setting (two sweeps read together, a job run twice) were two rows nothing told apart.
    Runs of one configuration with the same numbers are one row that says how many; where they differ
    (another configuration under the same overrides, such as an edited preset, or another version of the
    harness), each row says so and names its run."""
    keep = np.ones(len(table), dtype=bool)
    notes = table["notes"].fillna("").astype(str).tolist()
    for _, rows in table.groupby(setting, sort=False, dropna=False).indices.items():
        if len(rows) < 2:
            continue
        values = table.iloc[rows][numbers]
        same_numbers = all(values[c].nunique(dropna=False) == 1 for c in numbers)
        same_config = "config_hash" not in table or table.iloc[rows]["config_hash"].nunique(dropna=False) == 1
        if same_numbers and same_config:
            keep[rows[1:]] = False
            notes[rows[0]] = _joined(notes[rows[0]], f"{len(rows)} runs of this configuration, the same numbers")
            continue
        mean = "; the speed-ups of this setting are over their mean" if (table.iloc[rows]["strategy"] == "eager").all() else ""
        for row in rows:
            notes[row] = _joined(notes[row], f"one of {len(rows)} runs of this setting that differ ({_run_name(table.iloc[row])}){mean}")
    return table.assign(notes=notes)[keep]


def _joined(notes: object, note: str) -> str:
    """`note` after a row's notes (an MLflow run without a notes tag has NaN)."""
    return f"{notes}; {note}" if isinstance(notes, str) and notes else note


def _run_name(row: pd.Series) -> str:
    """A run as a user finds it: its folder (sweep folder / job folder), or its MLflow run id."""
    run_dir = row.get("run_dir")
    if isinstance(run_dir, str) and run_dir:
        return "/".join(Path(run_dir).parts[-2:])
    run_id = row.get("run_id")
    return f"run {run_id}" if isinstance(run_id, str) and run_id else "no run folder"


def to_markdown(table: pd.DataFrame) -> str:
    """The comparison as Markdown: fixed decimals (not 1.21e+03), the notes column as text, and under it why
    a speed-up is empty (no eager run with the same values)."""
    table = table.fillna({"notes": ""}) if "notes" in table else table
    latency = [c for c in LATENCY_SHOWN if c in table]
    if latency:  # a decode run has no first-token time: empty there, not "nan" (a speed-up's nan is explained below)
        table = table.assign(**{c: table[c].astype(object).where(table[c].notna(), None) for c in latency})
    lacking = missing_eager(table)  # from each row's own notes, before those every row shares are said once
    shared = _notes_of_every_row(table)
    if shared:  # said once, under the table: repeated on every row it hid the numbers (MLflow's preview)
        table = table.assign(notes=[_without(notes, shared) for notes in table["notes"]])
    markdown = table.to_markdown(index=False, floatfmt=".3f", missingval="")
    if shared:
        markdown += "\n\nEvery run: " + "; ".join(shared) + "."
    if lacking:
        markdown += "\n\nNo speed-up (nan) where no eager run has the same values: " + "; ".join(lacking) + "."
    return markdown


def _notes_of_every_row(table: pd.DataFrame) -> list[str]:
    """The notes (`; `-separated) that every row of a table of two or more rows carries."""
    if "notes" not in table or len(table) < 2:
        return []
    per_row = [[n for n in str(notes).split("; ") if n] for notes in table["notes"]]
    return [note for note in per_row[0] if all(note in notes for notes in per_row[1:])]


def _without(notes: str, shared: list[str]) -> str:
    return "; ".join(n for n in str(notes).split("; ") if n and n not in shared)


def missing_eager(table: pd.DataFrame) -> list[str]:
    """The (hardware, workload, swept values) with no eager run to compare with (not those with several, none
    of them the baseline: their notes say so)."""
    if table.empty or "speedup_vs_eager" not in table:
        return []
    lacking = table[table["speedup_vs_eager"].isna() & ~table.get("notes", pd.Series("", index=table.index)).fillna("").str.contains(NO_ONE_EAGER, regex=False)]
    keys = ["hardware", "workload"] + (["swept"] if "swept" in lacking else [])
    return [" ".join(str(v) for v in row if v) for row in lacking[keys].drop_duplicates().itertuples(index=False)]


def _numeric_key(swept: str) -> tuple:
    """Sort key of a swept-values string: numbers compare as numbers (batch 1, 8, 32, not 1, 32, 8)."""
    parts = []
    for item in str(swept).split():
        key, _, value = item.partition("=")
        try:
            parts.append((key, 0, float(value), ""))
        except ValueError:
            parts.append((key, 1, 0.0, value))
    return tuple(parts)


def swept_values(overrides: pd.Series) -> pd.Series:
    """Per run, its overrides that not every run shares, leaving out the config groups already shown
    (a sweep over `+workload.card_overrides.x=1,2` shows `…x=1` and `…x=2`) and where files and runs
    went (a run tracked and one not are the same run)."""
    per_run = [{o for o in str(o_all).split() if not override_key(o).startswith(WHERE_THINGS_GO)} if isinstance(o_all, str) else set()
               for o_all in overrides]
    common = set.intersection(*per_run) if per_run else set()
    return pd.Series(
        [" ".join(sorted(o for o in run - common if override_key(o) not in KEYS)) for run in per_run], index=overrides.index
    )


# (column, file, axis label) of each plot a comparison draws.
PLOTS = (("speedup_vs_eager", "speedup.png", "throughput / eager"), ("bubble_ratio", "bubble.png", "bubble ratio"))


def _plottable(table: pd.DataFrame, metric: str) -> bool:
    if metric not in table or table[metric].isna().all():
        return False
    # A speed-up plot of eager runs over themselves alone is bars of 1.0: nothing compared.
    compared = (table["strategy"] != "eager") | (table[metric] != 1.0)
    return metric != "speedup_vs_eager" or bool(compared[table[metric].notna()].any())


def unplotted(table: pd.DataFrame) -> list[str]:
    """Why each plot `plot` leaves out is left out."""
    return [
        f"no {label} to plot" + (" (no run but eager ones with an eager run to compare with)" if metric == "speedup_vs_eager" else "")
        for metric, _, label in PLOTS if not _plottable(table, metric)
    ]


def _bar_labels(keys: list) -> tuple[str, list[str]]:
    """(what every bar group shares, for the title; each group's own values, one a line, for its tick):
    the whole (workload, hardware, swept) tuples ran into each other under the bars. Swept keys are
    shortened as run names and headers shorten them (`batch_size=8`, `serving` for serving.enabled=true)."""
    keys = [key if isinstance(key, tuple) else (key,) for key in keys]

    def short(value: object) -> str:
        def item_short(item: str) -> str:  # the value whole (speed=0.5, path=a.csv)
            key, eq, val = split_override(item)
            return short_setting(key, val) if eq else item
        return " ".join(item_short(item) for item in str(value).split())

    varying = [i for i in range(len(keys[0])) if len({key[i] for key in keys}) > 1] if keys else []
    shared = " ".join(short(v) for i, v in enumerate(keys[0]) if i not in varying and str(v)) if keys else ""
    labels = ["\n".join(short(key[i]) for i in varying if str(key[i])) or shared for key in keys]
    return shared, labels


def plot(table: pd.DataFrame, out: Path) -> list[Path]:
    """Bar charts of a comparison (PLOTS) in `out`, those with something to show (`unplotted` says why not)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for metric, name, label in PLOTS:
        if not _plottable(table, metric):
            continue
        index = ["workload", "hardware"] + (["swept"] if "swept" in table else [])  # one bar per swept value
        pivot = table.pivot_table(index=index, columns="strategy", values=metric, aggfunc="mean", sort=False)
        ax = pivot.plot.bar(figsize=(max(6, 1.6 * len(pivot)), 4.5), rot=0)
        shared, labels = _bar_labels(list(pivot.index))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_title(shared, fontsize=9)
        ax.set_ylabel(label)
        ax.set_xlabel("")
        if metric == "speedup_vs_eager":
            ax.axhline(1.0, color="black", linewidth=0.8)
        if metric == "bubble_ratio" and "bubble_front_end" in table and table["bubble_front_end"].notna().any():
            _hatch_front_end(ax, table.pivot_table(index=index, columns="strategy", values="bubble_front_end", aggfunc="mean", sort=False)
                             .reindex(index=pivot.index, columns=pivot.columns))
        ax.legend(title="strategy", fontsize=8)
        ax.figure.tight_layout()
        path = out / name
        try:
            atomic_write(path, lambda tmp: ax.figure.savefig(tmp, dpi=110))
        finally:
            plt.close(ax.figure)
        written.append(path)
    return written


def _hatch_front_end(ax, front_end: pd.DataFrame) -> None:
    """The part of each bubble bar that is the device's front-end gaps between queued kernels, hatched from
    its base: idle time no host-side change removes, where the rest of the bubble is the host's (a bar of
    0.115 on an h100 eager step was 0.111 of gaps, drawn as one)."""
    label = "of which front-end gaps"  # the legend's entry, once
    for container, strategy in zip(list(ax.containers), front_end.columns):  # the bars pandas drew, one set a strategy
        for bar, value in zip(container.patches, front_end[strategy].to_numpy()):
            if np.isfinite(value) and value > 0:
                ax.bar(bar.get_x() + bar.get_width() / 2, value, width=bar.get_width(), fill=False, hatch="///",
                       edgecolor="black", linewidth=0.0, label=label)
                label = "_nolegend_"


def pareto_plot(per_device: np.ndarray, per_user: np.ndarray, labels: list[str], path: Path, title: str = "") -> Path:
    """Throughput per device against tokens per second per user (1000 / TPOT), one point per candidate, the
    Pareto front (no other point better on both) joined and its points named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # By user speed, fastest first, and at equal user speed by throughput: a point is on the front if it beats
    # every point before it on throughput (of two at one user speed the slower one stayed on it, by input order).
    order = np.lexsort((-per_device, -per_user))
    front, best = [], -np.inf
    for i in order:
        if per_device[i] > best:
            front.append(i)
            best = per_device[i]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(per_user, per_device, s=12, color="0.6", label="candidates")
    ax.plot(per_user[front], per_device[front], "o-", color="C0", label="Pareto front")
    low, high = ax.get_xlim()
    for i in front[:12]:  # names in the right half run leftwards: they were cut at the plot's edge
        right = per_user[i] > (low + high) / 2
        ax.annotate(labels[i], (per_user[i], per_device[i]), fontsize=6, xytext=(-3 if right else 3, 3), textcoords="offset points",
                    ha="right" if right else "left")
    ax.set_xlabel("tokens/s per user (1000 / TPOT p50)")
    ax.set_ylabel("tokens/s per device")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110))
    finally:
        plt.close(fig)
    return path
