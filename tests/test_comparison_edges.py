"""The comparison table's edges (harness/results/comparison.py), each expected value worked out by hand:
speed-ups over the eager run of the same setting, rows of one setting, the order, the Markdown, the CSV
and which plots are drawn."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.results.comparison import comparison


def test_an_empty_table_of_runs_is_an_empty_comparison():
    empty = pd.DataFrame()
    assert comparison(empty).empty


def runs_of(rows, **columns):
    """A table of runs: rows of (strategy, throughput, overrides) on hardware a2, workload w, plus columns."""
    frame = pd.DataFrame({
        "hardware": ["a2"] * len(rows), "workload": ["w"] * len(rows),
        "strategy": [r[0] for r in rows], "throughput_tok_s": [float(r[1]) for r in rows], "overrides": [r[2] for r in rows],
    })
    return frame.assign(**columns)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


# ---------------------------------------------------------------- speed-ups and settings


def test_runs_without_a_setting_hash_compare_by_their_overrides_not_all_together():
    """Summaries from before setting_hash (the column NaN, or empty) are matched by the overrides that
    differ: batch 16 40 / 10 = 4.0, batch 64 60 / 20 = 3.0 (not over the mean of both eager runs, 15)."""
    rows = [("eager", 10, "strategy=eager workload.batch_size=16"), ("acl_graph", 40, "strategy=acl_graph workload.batch_size=16"),
            ("eager", 20, "strategy=eager workload.batch_size=64"), ("acl_graph", 60, "strategy=acl_graph workload.batch_size=64")]
    for hashes in ([np.nan] * 4, [""] * 4):
        table = comparison(runs_of(rows, setting_hash=hashes)).set_index(["strategy", "swept"])["speedup_vs_eager"]
        assert table.to_dict() == pytest.approx({
            ("eager", "workload.batch_size=16"): 1.0, ("acl_graph", "workload.batch_size=16"): 4.0,
            ("eager", "workload.batch_size=64"): 1.0, ("acl_graph", "workload.batch_size=64"): 3.0})


def test_a_run_without_a_workload_name_still_compares_with_its_eager_run():
    """A missing workload (NaN) is a setting of its own, not one left out: 30 / 10 = 3.0."""
    runs = runs_of([("eager", 10, "strategy=eager"), ("async", 30, "strategy=async")]).assign(workload=[np.nan, np.nan])
    table = comparison(runs)
    assert table["strategy"].tolist() == ["eager", "async"]
    assert table["speedup_vs_eager"].tolist() == pytest.approx([1.0, 3.0])


def test_the_table_has_its_columns_only_and_no_swept_column_when_nothing_differs():
    """Overrides every run shares leave every swept value empty: no swept column (and no index column)."""
    runs = runs_of([("eager", 10, "workload.steps=4"), ("async", 25, "workload.steps=4")], step_ms_mean=[4.0, 2.0])
    table = comparison(runs)
    assert table.columns.tolist() == ["hardware", "workload", "strategy", "throughput_tok_s", "speedup_vs_eager", "step_ms_mean", "notes"]
    assert table["speedup_vs_eager"].tolist() == pytest.approx([1.0, 2.5])  # 25 / 10
    # Without any overrides column (runs from the store without it): the same, rows eager first.
    bare = comparison(runs.drop(columns=["overrides"]).iloc[::-1])
    assert bare.columns.tolist() == table.columns.tolist() and bare["strategy"].tolist() == ["eager", "async"]


def test_numbers_sort_before_words_and_as_numbers():
    """Swept values x=10, x=2, x=a: 2 before 10 (as numbers), then the word a (after every number)."""
    rows = [(s, t, f"x={v}") for v, s, t in [("a", "eager", 1), ("a", "async", 2), ("10", "eager", 3), ("10", "async", 6),
                                             ("2", "eager", 4), ("2", "async", 12)]]
    table = comparison(runs_of(rows))
    assert table["swept"].tolist() == ["x=2", "x=2", "x=10", "x=10", "x=a", "x=a"]
    assert table["speedup_vs_eager"].tolist() == pytest.approx([1.0, 3.0, 1.0, 2.0, 1.0, 2.0])  # 12/4, 6/3, 2/1


# ---------------------------------------------------------------- one row a setting


def test_a_lone_run_carries_no_note_and_repeats_without_config_hash_are_one_row():
    """First a setting with one run (nothing said), then two runs of another with the same numbers and
    no config_hash (summaries from before it): one row, '2 runs of this configuration'; 40 / 10 = 4.0."""
    rows = [("async", 40, "strategy=async"), ("eager", 10, "strategy=eager"), ("eager", 10, "strategy=eager")]
    table = comparison(runs_of(rows, notes=["", "", ""]))
    assert table["strategy"].tolist() == ["eager", "async"]
    assert table["notes"].tolist() == ["2 runs of this configuration, the same numbers", ""]
    assert table["speedup_vs_eager"].tolist() == pytest.approx([1.0, 4.0])


def test_repeats_from_before_strategy_changes_are_still_one_row():
    """strategy_changes NaN (a summary from before it) groups as one value, not as none."""
    rows = [("eager", 10, "strategy=eager"), ("eager", 10, "strategy=eager"), ("async", 20, "strategy=async")]
    table = comparison(runs_of(rows, strategy_changes=[np.nan] * 3, notes=[""] * 3))
    assert table["strategy"].tolist() == ["eager", "async"]
    assert table["notes"].tolist() == ["2 runs of this configuration, the same numbers", ""]
    assert table["speedup_vs_eager"].tolist() == pytest.approx([1.0, 2.0])


def test_the_kept_row_keeps_its_own_notes():
    rows = [("eager", 10, "strategy=eager")] * 2
    table = comparison(runs_of(rows, notes=["first", "second"]))
    assert table["notes"].tolist() == ["first; 2 runs of this configuration, the same numbers"]


def test_a_number_present_in_one_run_and_missing_in_the_other_differs():
    """bubble_ratio 0.2 and NaN are not the same numbers: two rows, each named, and the eager ones' mean
    (10 + 10) / 2 = 10 is the baseline."""
    rows = [("eager", 10, "strategy=eager"), ("eager", 10, "strategy=eager")]
    runs = runs_of(rows, bubble_ratio=[0.2, np.nan], notes=["", ""], run_dir=["/d/s/0_eager", "/d/s/1_eager"])
    table = comparison(runs)
    assert len(table) == 2
    assert table["notes"].tolist() == [f"one of 2 runs of this setting that differ (s/{j}_eager); the speed-ups of this setting are over their mean"
                                       for j in (0, 1)]


def test_a_run_with_a_config_hash_and_one_without_are_two_configurations():
    rows = [("eager", 10, "strategy=eager"), ("eager", 10, "strategy=eager")]
    table = comparison(runs_of(rows, config_hash=["e", np.nan], notes=["", ""], run_id=["r1", "r2"]))
    assert table["notes"].tolist() == [f"one of 2 runs of this setting that differ (run {r}); the speed-ups of this setting are over their mean"
                                       for r in ("r1", "r2")]


def test_a_run_is_named_by_the_last_two_parts_of_its_folder_or_not_at_all():
    """/data/x/sweep1/0_eager reads sweep1/0_eager; a run with neither folder nor run id (NaN, as read
    from a CSV) reads 'no run folder'. Eager mean (10 + 20) / 2 = 15: async 45 / 15 = 3.0."""
    rows = [("eager", 10, "strategy=eager"), ("eager", 20, "strategy=eager"), ("async", 45, "strategy=async")]
    runs = runs_of(rows, notes=[""] * 3, run_dir=["/data/x/sweep1/0_eager", np.nan, np.nan], run_id=[np.nan, np.nan, np.nan])
    table = comparison(runs)
    mean = "; the speed-ups of this setting are over their mean"
    assert table["notes"].tolist() == [f"one of 2 runs of this setting that differ (sweep1/0_eager){mean}",
                                       f"one of 2 runs of this setting that differ (no run folder){mean}", ""]
    assert table["speedup_vs_eager"].tolist() == pytest.approx([10 / 15, 20 / 15, 3.0])


# ---------------------------------------------------------------- Markdown and missing eager runs


def test_a_note_is_said_under_the_table_only_when_every_row_has_it():
    from harness.results.comparison import to_markdown

    table = pd.DataFrame({"hardware": ["a2", "a2"], "workload": ["w", "w"], "strategy": ["eager", "async"],
                          "speedup_vs_eager": [1.0, 2.0], "notes": ["own; shared", "shared"]})
    markdown = to_markdown(table)
    assert markdown.endswith("\n\nEvery run: shared.")
    assert [line.split("|")[-2].strip() for line in markdown.splitlines()[2:4]] == ["own", ""]


def test_missing_eager_names_each_setting_once_without_empty_values():
    """Rows 2 and 3 lack an eager run (their index is not 0: no row number in the names); an empty swept
    value adds nothing."""
    from harness.results.comparison import missing_eager

    table = pd.DataFrame({"hardware": ["a2"] * 4, "workload": ["w", "w", "v", "v"], "swept": ["", "", "x=1", "x=1"],
                          "strategy": ["eager", "async", "async", "pipeline"], "speedup_vs_eager": [1.0, 2.0, np.nan, np.nan]})
    assert missing_eager(table) == ["a2 v x=1"]
    assert missing_eager(table.assign(swept="")) == ["a2 v"]
    assert missing_eager(table.drop(columns=["swept"])) == ["a2 v"]
    assert missing_eager(table.drop(columns=["speedup_vs_eager"])) == []  # not a comparison: nothing to say
    assert missing_eager(table.iloc[:0]) == []


def test_swept_values_of_no_runs_and_of_runs_without_overrides():
    from harness.results.comparison import swept_values

    assert swept_values(pd.Series([], dtype=object)).tolist() == []
    assert swept_values(pd.Series([np.nan, "workload.steps=4"])).tolist() == ["", "workload.steps=4"]


# ---------------------------------------------------------------- which plots


def test_a_plot_of_a_metric_no_run_has_is_left_out_and_said():
    from harness.results.comparison import unplotted

    table = pd.DataFrame({"strategy": ["eager", "async"], "speedup_vs_eager": [1.0, 2.0]})
    assert unplotted(table) == ["no bubble ratio to plot"]
    assert unplotted(table.assign(bubble_ratio=[np.nan, np.nan])) == ["no bubble ratio to plot"]
    assert unplotted(table.assign(bubble_ratio=[0.1, 0.2])) == []
    # Only eager runs, NaN speed-ups aside: nothing compared.
    assert unplotted(pd.DataFrame({"strategy": ["eager", "eager"], "speedup_vs_eager": [1.0, np.nan], "bubble_ratio": [0.1, 0.2]})) == [
        "no throughput / eager to plot (no run but eager ones with an eager run to compare with)"]


def test_bar_labels_of_keys_without_a_dot_are_the_keys_themselves():
    from harness.results.comparison import _bar_labels

    # Hydra's + is dropped, as run names and headers drop it.
    assert _bar_labels([("w", "a2", "+experiment=x"), ("w", "a2", "+experiment=y")]) == ("w a2", ["experiment=x", "experiment=y"])


# ---------------------------------------------------------------- the plain eager run


def test_a_plain_eager_job_has_no_strategy_changes_and_a_switch_is_named_as_typed():
    """The job compares its flattened resolved config (enums as their names) with conf/strategy/eager.yaml
    over the schema's defaults, read without Hydra. Asked afresh (the plain params are cached)."""
    from omegaconf import OmegaConf

    from conftest import compose_run
    from harness.config.compose import plain_strategy_params
    from harness.config.schema import flatten
    from harness.results.resume import strategy_changes

    def changes(*overrides):
        return strategy_changes(flatten(OmegaConf.to_container(OmegaConf.structured(compose_run(*overrides)), resolve=True, enum_to_str=True)))

    plain_strategy_params.cache_clear()
    assert changes("strategy=eager") == ""
    assert changes("strategy=eager", "strategy.fusion=true", "strategy.queue_capacity=8") == "strategy.fusion=true strategy.queue_capacity=8"
    assert changes("strategy=eager", "strategy.graph.buckets=[1,2]") == "strategy.graph.buckets=[1,2]"
    assert changes("hardware=h100", "strategy=eager", "engine=vllm_v1") == ""  # other groups: not the strategy's


# ---------------------------------------------------------------- reading run folders, writing CSV


def test_run_folders_are_read_without_mlflows_copies_and_with_hydras_overrides(tmp_path):
    """Under a launch folder: a/ (Hydra's overrides.yaml, the summary has none), b/ (its summary's own
    overrides win over Hydra's), two MLflow copies (c/mlartifacts/, o/mlartifacts/1/artifacts/: not runs),
    d/ after them (still read); and a second folder given."""
    import json

    from harness.results.comparison import load_run_dirs

    def summary(folder, **row):
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps(row))

    root, other = tmp_path / "launch", tmp_path / "other"
    summary(root / "a", name="a")
    (root / "a" / ".hydra").mkdir()
    (root / "a" / ".hydra" / "overrides.yaml").write_text("- strategy=eager\n- workload.batch_size=8\n")
    summary(root / "b", name="b", overrides="strategy=async")
    (root / "b" / ".hydra").mkdir()
    (root / "b" / ".hydra" / "overrides.yaml").write_text("- strategy=async\n- resume=True\n")
    summary(root / "c" / "mlartifacts", name="copy")
    summary(root / "d", name="d")
    summary(root / "o" / "mlartifacts" / "1" / "artifacts", name="copy")
    summary(other / "e", name="e")
    runs = load_run_dirs([root, other])
    assert runs["name"].tolist() == ["a", "b", "d", "e"]
    assert runs["run_dir"].tolist() == [str((root / n).absolute()) for n in "abd"] + [str((other / "e").absolute())]
    assert runs["overrides"].tolist()[:2] == ["strategy=eager workload.batch_size=8", "strategy=async"]
    assert runs["overrides"].iloc[2:].isna().all()  # no overrides anywhere: none made up


def test_csv_writes_whole_floats_as_integers_up_to_2_to_the_53(tmp_path):
    """A float column all of whose values are whole (gaps aside) and finite, below 2**53 = 9007199254740992
    (past it not every integer is a float), is written as integers; anything else as it is."""
    from harness.results.comparison import write_csv

    table = pd.DataFrame({
        "count": [1.0, np.nan, 51.0],                  # 1, , 51
        "ratio": [0.5, 1.0, np.nan],                    # not whole: as floats
        "below": [2.0**53 - 1, 0.0, -3.0],              # 9007199254740991: the largest it writes as an integer
        "at": [2.0**53, 1.0, 2.0],                      # 9007199254740992: a float
        "infinite": [1.0, np.inf, 2.0],                 # not finite: floats
        "empty": [np.nan, np.nan, np.nan],
        "name": ["x", "y", "z"],
        "n": [1, 2, 3],
    })
    path = tmp_path / "t.csv"
    write_csv(path, table)
    assert path.read_text().splitlines() == [
        "count,ratio,below,at,infinite,empty,name,n",
        "1,0.5,9007199254740991,9007199254740992.0,1.0,,x,1",
        ",1.0,0,1.0,inf,,y,2",
        "51,,-3,2.0,2.0,,z,3",
    ]


# ---------------------------------------------------------------- plots


@pytest.fixture
def closed_figures(monkeypatch):
    """The figures the plots close once saved, to look at what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or close(fig))
    return figures


def comparison_table(batches, strategies=("eager", "acl_graph")):
    rows = [(b, s) for b in batches for s in strategies]
    return pd.DataFrame({"hardware": ["a2"] * len(rows), "workload": ["w"] * len(rows), "swept": [f"workload.batch_size={b}" for b, _ in rows],
                         "strategy": [s for _, s in rows], "speedup_vs_eager": [1.0 if s == "eager" else 2.0 + b / 100 for b, s in rows],
                         "bubble_ratio": [0.5 if s == "eager" else 0.1 for _, s in rows]})


def test_plots_are_drawn_per_swept_value_in_the_tables_order_with_the_eager_line(tmp_path, closed_figures):
    """Two swept values (8 before 16, the table's numeric order, not the text's), eager before acl_graph
    (the table's order): 6 inches wide at least (1.6 x 2 groups = 3.2), 4.5 high, 110 dpi: 660 x 495
    pixels; a line at 1.0 on the speed-up plot only."""
    from harness.results.comparison import plot

    written = plot(comparison_table([8, 16]), tmp_path)
    assert written == [tmp_path / "speedup.png", tmp_path / "bubble.png"]
    assert [png_size(path) for path in written] == [(660, 495), (660, 495)]
    speedup, bubble = (fig.axes[0] for fig in closed_figures)
    for ax in (speedup, bubble):
        ticks = ax.get_xticklabels()
        assert [t.get_text() for t in ticks] == ["batch_size=8", "batch_size=16"]
        assert all(t.get_fontsize() == 8 and t.get_rotation() == 0 for t in ticks)
        assert ax.get_title() == "w a2" and ax.title.get_fontsize() == 9
        legend = ax.get_legend()
        assert legend.get_title().get_text() == "strategy" and [t.get_text() for t in legend.get_texts()] == ["eager", "acl_graph"]
        assert all(t.get_fontsize() == 8 for t in legend.get_texts())
    assert speedup.get_ylabel() == "throughput / eager" and bubble.get_ylabel() == "bubble ratio"
    # Bars: per strategy, per swept value (2.08 = 2 + 8 / 100).
    assert [round(p.get_height(), 3) for p in speedup.patches] == [1.0, 1.0, 2.08, 2.16]
    lines = [(tuple(line.get_ydata()), line.get_linewidth(), line.get_color()) for line in speedup.get_lines()]
    assert lines == [((1.0, 1.0), 0.8, "black")]
    assert bubble.get_lines() == []


def test_a_plot_of_many_groups_widens_and_one_left_out_leaves_the_others(tmp_path, closed_figures):
    """Five swept values: 1.6 x 5 = 8 inches, 880 pixels at 110 dpi. Eager runs alone: no speed-up plot,
    the bubble plot still (one group: 6 inches, 660 pixels)."""
    from harness.results.comparison import plot

    (tmp_path / "wide").mkdir()
    (tmp_path / "eager").mkdir()
    assert [png_size(p) for p in plot(comparison_table([1, 2, 4, 8, 16]), tmp_path / "wide")] == [(880, 495), (880, 495)]
    written = plot(comparison_table([1], strategies=("eager",)), tmp_path / "eager")
    assert written == [tmp_path / "eager" / "bubble.png"] and png_size(written[0]) == (660, 495)
    assert not (tmp_path / "eager" / "speedup.png").exists()


def test_pareto_front_its_names_and_the_figure(tmp_path, closed_figures):
    """Per user 100, 50, 0 (fastest first: 10, 20, 30 tokens/s per device, each better than the faster
    ones: all on the front); 10 with 20 again (a tie is not better: not on it). The x axis runs -5 to 105
    (5 % margins), its middle 50: a name right of it runs leftwards (-3 points), at or left of it
    rightwards (3 points). 7 x 4.5 inches at 110 dpi: 770 x 495 pixels."""
    from harness.results.comparison import pareto_plot

    path = pareto_plot(np.array([10.0, 20.0, 30.0, 20.0]), np.array([100.0, 50.0, 0.0, 10.0]), ["fast", "middle", "slow", "tie"],
                       tmp_path / "p.png", title="t")
    assert png_size(path) == (770, 495)
    (fig,) = closed_figures
    ax = fig.axes[0]
    (front,) = [line for line in ax.get_lines() if line.get_label() == "Pareto front"]
    assert front.get_xdata().tolist() == [100.0, 50.0, 0.0] and front.get_ydata().tolist() == [10.0, 20.0, 30.0]
    assert ax.get_xlim() == pytest.approx((-5.0, 105.0))
    names = [(t.get_text(), t.get_position(), t.get_fontsize(), t.get_horizontalalignment()) for t in ax.texts]
    assert names == [("fast", (-3, 3), 6, "right"), ("middle", (3, 3), 6, "left"), ("slow", (3, 3), 6, "left")]
    assert ax.collections[0].get_sizes().tolist() == [12]
    assert ax.get_title() == "t" and ax.title.get_fontsize() == 9
    assert all(t.get_fontsize() == 8 for t in ax.get_legend().get_texts())


def test_pareto_names_the_first_twelve_of_the_front(tmp_path, closed_figures):
    """13 points, each slower per user and faster per device than the one before: all 13 on the front,
    the 12 fastest per user named."""
    from harness.results.comparison import pareto_plot

    pareto_plot(np.arange(1.0, 14.0), np.arange(13.0, 0.0, -1.0), [f"p{i}" for i in range(13)], tmp_path / "p.png")
    ax = closed_figures[0].axes[0]
    assert [t.get_text() for t in ax.texts] == [f"p{i}" for i in range(12)]


def test_a_run_folder_under_two_of_the_folders_given_is_read_once(tmp_path):
    """s1/ holds eager (10 tok/s) and a graph run (45), s2/ another eager run (20): the graph is
    45 / ((10 + 20) / 2) = 3.0x. Given s1/0_eager as well, s1's eager run was read twice, the mean
    (10 + 20 + 10) / 3 and the graph 3.375x. And tables put together (pd.concat, repeated row labels)
    compare as one."""
    import json

    from harness.results.comparison import load_run_dirs

    for sweep, name, strategy, tok_s in [("s1", "0_eager", "eager", 10.0), ("s1", "1_graph", "acl_graph", 45.0), ("s2", "0_eager", "eager", 20.0)]:
        (tmp_path / sweep / name).mkdir(parents=True)
        (tmp_path / sweep / name / "summary.json").write_text(json.dumps(
            {"hardware": "a2", "workload": "w", "strategy": strategy, "throughput_tok_s": tok_s, "overrides": f"strategy={strategy}",
             "config_hash": f"c{tok_s}"}))
    runs = load_run_dirs([tmp_path / "s1", tmp_path / "s2", tmp_path / "s1" / "0_eager"])
    assert len(runs) == 3
    graph = comparison(runs).set_index("strategy").loc["acl_graph", "speedup_vs_eager"]
    assert graph == pytest.approx(45 / 15)
    together = pd.concat([load_run_dirs([tmp_path / "s1"]), load_run_dirs([tmp_path / "s2"])])
    assert comparison(together).set_index("strategy").loc["acl_graph", "speedup_vs_eager"] == pytest.approx(45 / 15)


def test_of_two_points_at_one_user_speed_the_faster_per_device_is_on_the_pareto_front(tmp_path, closed_figures):
    """Per device 50 and 100 at one user speed (10): 100 dominates 50, whichever comes first in the input
    (50 first, both were on the front)."""
    from harness.results.comparison import pareto_plot

    for per_device in ([50.0, 100.0], [100.0, 50.0]):
        pareto_plot(np.array(per_device), np.array([10.0, 10.0]), ["a", "b"], tmp_path / "p.png")
        (fig,) = closed_figures[-1:]
        (front,) = [line for line in fig.axes[0].get_lines() if line.get_label() == "Pareto front"]
        assert front.get_ydata().tolist() == [100.0]


def test_the_bubble_plot_hatches_the_front_end_gaps_inside_each_bar(tmp_path, closed_figures):
    """Eager's bubble 0.5 of which 0.3 front-end gaps, acl_graph's 0.1 of which 0.05: each bar carries a
    hatched bar of that height at its own place, and the legend says what the hatching is (an h100 eager
    bar of 0.115 was 0.111 of gaps no host change removes, drawn as one)."""
    from harness.results.comparison import plot

    table = comparison_table([8]).assign(bubble_front_end=lambda t: np.where(t["strategy"] == "eager", 0.3, 0.05))
    plot(table, tmp_path)
    bubble = closed_figures[-1].axes[0]
    bars = [p for p in bubble.patches if p.get_fill()]
    hatched = [p for p in bubble.patches if not p.get_fill() and p.get_height() > 0]
    assert [round(p.get_height(), 3) for p in bars] == [0.5, 0.1]
    assert [(round(p.get_height(), 3), p.get_hatch()) for p in hatched] == [(0.3, "///"), (0.05, "///")]
    assert [p.get_x() for p in hatched] == pytest.approx([p.get_x() for p in bars])
    assert [t.get_text() for t in bubble.get_legend().get_texts()] == ["eager", "acl_graph", "of which front-end gaps"]


def test_a_serving_runs_speed_up_says_it_is_served_throughput_at_one_arrival_rate():
    """At one arrival rate both strategies serve what arrives: cuda_graph's 2034.6 tok/s over eager's 2009.3
    is 1.0126, while its TPOT is 10.7 ms against 11.4. The graph run's row says what its speed-up is; the
    eager run (no speed-up of its own) and a run without request latencies (a step benchmark) do not."""
    from harness.results.comparison import SERVING_SPEEDUP

    serving = runs_of([("eager", 2009.3, "strategy=eager"), ("cuda_graph", 2034.6, "strategy=cuda_graph")],
                      median_tpot_ms=[11.4, 10.7])
    table = comparison(serving).set_index("strategy")
    assert table.loc["cuda_graph", "speedup_vs_eager"] == pytest.approx(2034.6 / 2009.3)
    assert SERVING_SPEEDUP in table.loc["cuda_graph", "notes"]
    assert SERVING_SPEEDUP not in table.loc["eager", "notes"]
    steps = runs_of([("eager", 10, "strategy=eager"), ("cuda_graph", 30, "strategy=cuda_graph")], median_tpot_ms=[np.nan, np.nan])
    assert not comparison(steps)["notes"].str.contains(SERVING_SPEEDUP, regex=False).any()


def test_a_serving_run_with_no_finished_request_yet_is_still_a_serving_run():
    """A serving run short enough that no request finished has first tokens (median_ttft_ms) but no TPOT: its
    speed-up is still served throughput at one arrival rate (advise's 60-step rungs are such runs)."""
    from harness.results.comparison import SERVING_SPEEDUP

    short = runs_of([("eager", 600.0, "strategy=eager"), ("cuda_graph", 790.0, "strategy=cuda_graph")],
                    median_tpot_ms=[np.nan, np.nan], median_ttft_ms=[24.0, 16.0], requests_completed=[0, 0])
    assert SERVING_SPEEDUP in comparison(short).set_index("strategy").loc["cuda_graph", "notes"]
