"""Reading runs back from an MLflow store, as the rows `harness.results.comparison` compares."""
from __future__ import annotations

import difflib

import pandas as pd

from harness.results.comparison import KEYS
from harness.sim.outcome import WHAT_RAN_PARAMS
from harness.tracking.store import OLD_SERIES, mlflow_module, summary_key


def load_mlflow(uri: str, experiment: str = "hostbound", parent: str | None = None) -> pd.DataFrame:
    """Finished child runs (or all harness runs) of an experiment, with the summary's names."""
    mlflow = mlflow_module()

    mlflow.set_tracking_uri(uri)
    found = mlflow.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"hostbound report: error: no experiment {experiment!r} in {uri}")
    # FINISHED only: a run that failed while logging (kept FAILED, then logged again whole) was a second row.
    query = "attributes.status = 'FINISHED'" + (f" and tags.mlflow.parentRunId = '{parent}'" if parent else "")
    runs = mlflow.search_runs([found.experiment_id], filter_string=query, order_by=["attributes.start_time DESC"])
    if runs.empty:
        return runs
    # A sweep's or an advice's parent run holds no run of its own (an advice's was a row with speedup nan).
    runs = runs[~runs.get("tags.kind", pd.Series(index=runs.index, dtype=object)).isin(["sweep", "advice"])]
    # One row per run folder, its newest run: a folder logged twice (by hand, or a store that lost track) is one run.
    run_dirs = runs.get("tags.run_dir", pd.Series(index=runs.index, dtype=object))
    runs = runs[run_dirs.isna() | ~run_dirs.duplicated(keep="first")]
    if runs.empty:
        return runs
    # setting_hash: what the run simulates but its strategy, strategy_changes: its strategy switches beyond plain eager (tags: the params
    # hold only the values chosen)
    out = pd.DataFrame({k: runs.get(f"tags.{k}") for k in KEYS + ["bound", "overrides", "notes", "run_dir", "setting_hash", "strategy_changes"]})
    out["notes"] = out["notes"].fillna("")
    # What ran (batch, steps, seed, ...) is in the params, as text: the same columns a run folder's table has.
    for key, param in WHAT_RAN_PARAMS.items():
        if f"params.{param}" in runs.columns:
            out[key] = runs[f"params.{param}"].map(_param_value)
    for column in runs.columns:  # grouped names (headline/throughput_tok_s) and an older store's alike
        metric = column.removeprefix("metrics.")
        if column.startswith("metrics.") and not metric.startswith("series/") and metric not in OLD_SERIES:  # a series' last value is no figure of the run
            key = summary_key(metric)
            # A store with runs of both kinds has both columns, each holding its own runs' values.
            out[key] = out[key].combine_first(runs[column]) if key in out else runs[column]
    out["run_id"] = runs["run_id"]
    return out.reset_index(drop=True)


def _param_value(text: object) -> object:
    """An MLflow param (text) back as the number or boolean the config held."""
    if not isinstance(text, str):
        return text
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def not_in_store(uri: str, experiment: str, parent: str | None) -> str | None:
    """What the store at `uri` lacks of what a report asks for (an experiment, a parent run of it), as a line
    naming the report's flag and the value, else None."""
    client = mlflow_module().MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = sorted(e.name for e in client.search_experiments())
        close = difflib.get_close_matches(experiment, names, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        shown = ", ".join(names[:8]) + (", …" if len(names) > 8 else "")
        return f"--experiment={experiment}: no such experiment in {uri}{hint}; it holds {shown or 'none'}"
    if parent is None:
        return None
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(parent)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return f"--parent={parent}: no run of that id in {uri}"
        raise
    if run.info.experiment_id != found.experiment_id:
        other = client.get_experiment(run.info.experiment_id).name
        return f"--parent={parent}: a run of experiment {other!r}, not {experiment!r}: add --experiment {other}"
    return None
