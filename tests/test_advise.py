"""python -m harness.advise: its winner is brute force's, every limit is honoured and each rejected
candidate says why, the three pitfalls of graph capture are caught (the stream budget, a largest batch
above the largest capture size, coarse capture sizes), the written preset runs as ranked, the same
question gives the same answer, and bad input is one line."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from harness.advisor import candidates
from harness.advisor.candidates import make_run, with_steps
from harness.advisor.search import advise_runs, figures
from harness.base.errors import ConfigError
from harness.config.advise import AdviseConfig, compose_advise
from harness.config.compose import compose_run
from harness.sim.outcome import without_wall_clock
from harness.sim.policies import layer_count
from harness.sim.simulate import one_step, simulate_run

H100 = ["hardware=h100", "workload=llama31_8b_decode"]
A2 = ["hardware=atlas_a2", "workload=qwen3_30b_decode"]
VLLM_SIZES = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 513, 16))  # vLLM's default capture sizes: 51


def question(**kw) -> AdviseConfig:
    return AdviseConfig(**{"steps": [4], **kw})


def test_the_winner_is_brute_forces_on_a_small_space():
    space = {"strategy": ["eager", "async", "cuda_graph"], "workload.batch_size": [1, 8, 32]}
    advice = advise_runs(H100, question(space=space))
    best = {}
    for strategy in space["strategy"]:
        for batch in space["workload.batch_size"]:
            run = with_steps(compose_run(H100 + [f"strategy={strategy}", f"workload.batch_size={batch}"]), 4)
            summary = simulate_run(run).summary
            best[(strategy, batch)] = summary["throughput_tok_s"] / summary["devices"]
    winner = max(best, key=best.get)
    assert advice.ranked[0].overrides == [f"strategy={winner[0]}", f"workload.batch_size={winner[1]}"]
    assert figures(advice.ranked[0].summary)["tok_s_per_device"] == best[winner]
    assert [figures(c.summary)["tok_s_per_device"] for c in advice.ranked] == sorted(best.values(), reverse=True)


@pytest.mark.parametrize("overrides", [
    ["strategy=cuda_graph", "workload.batch_size=24", "strategy.graph.buckets=[1,8,16,32]"],
    ["engine=vllm_v1", "engine.async_scheduling=true", "engine.multi_step=4", "engine.schedule.per_step_us=55.5"],
    ["workload.tp=8", "hardware.link.devices_per_node=4", "workload.serving.enabled=true", "workload.serving.max_batch=16", "seed=3"],
    ["workload.batch_size=8", "workload.batch_size=16", "hardware.device.hbm_gb=80"],  # the last value wins, as in Hydra
], ids=["graph", "engine", "serving", "twice"])
def test_a_candidate_is_the_run_its_overrides_compose(overrides):
    """Candidates are made by replacing the fields their keys name on a preset's composed run, not by
    composing each: the result must be the RunConfig Hydra composes."""
    assert make_run(H100 + overrides) == compose_run(H100 + overrides)
    groups = [o for o in overrides if o.partition("=")[0] in ("strategy", "engine")]
    dotted = [o for o in overrides if o not in groups]
    assert candidates._patched(make_run(H100 + groups), dotted) is not None  # made the fast way, not composed


def test_a_candidate_of_an_imported_op_list_is_the_run_it_composes():
    """workload=trace is valid only with workload.path beside it: the advisor checked the preset alone
    first and refused ("empty op list") what python -m harness runs."""
    from pathlib import Path

    path = Path(__file__).parent / "data" / "tiny_ops.csv"
    overrides = ["hardware=h100", "workload=trace", f"workload.path={path}", "strategy=async"]
    assert make_run(overrides) == compose_run(overrides)
    assert make_run(overrides).workload.path == str(path)


@pytest.mark.parametrize("bad", ["workload.batch_size=x", "workload.batch_size=0", "strategy.graph.bucket=[1]", "engine.multi_step=-1"])
def test_a_refused_candidate_is_refused_in_the_words_of_any_run(bad):
    """A candidate's refusal is the one line `python -m harness` prints for the same value (ConfigError as
    it is; Hydra's own errors through the command line's `one_line`), not a traceback."""
    from harness.config.messages import one_line

    with pytest.raises(Exception) as composed:
        compose_run(H100 + [bad])
    with pytest.raises(ConfigError) as made:
        make_run(H100 + [bad])
    expected = str(composed.value) if isinstance(composed.value, ConfigError) else one_line(composed.value, H100 + [bad])
    assert str(made.value) == expected and "\n" not in expected


def test_successive_halving_keeps_the_leaders_and_ranks_them_at_the_longest_rung():
    space = {"strategy": ["eager", "cuda_graph"], "workload.batch_size": [1, 4, 16, 64]}
    advice = advise_runs(H100, question(space=space, steps=[2, 6], keep=0.25))
    assert advice.rungs == [(2, 8), (6, 2)]
    assert all(c.steps == 6 for c in advice.ranked) and len(advice.ranked) == 2
    brute = max(
        (simulate_run(with_steps(make_run(H100 + c.overrides), 6)).summary["throughput_tok_s"], c.label) for c in advice.candidates
    )
    assert advice.ranked[0].label == brute[1]


def test_the_latency_limit_is_honoured_and_misses_say_by_how_much():
    space = {"strategy": ["eager", "cuda_graph"], "workload.batch_size": [1, 16, 64, 256]}
    free = advise_runs(H100, question(space=space))
    tpots = sorted(figures(c.summary)["tpot_ms_p50"] for c in free.ranked)
    limit = (tpots[len(tpots) // 2 - 1] + tpots[len(tpots) // 2]) / 2  # about half of them meet it
    bound = advise_runs(H100, question(space=space, tpot_ms_max=limit))
    assert bound.ranked and all(figures(c.summary)["tpot_ms_p50"] <= limit for c in bound.ranked)
    missed = [c for c in bound.candidates if c.rejected.startswith("TPOT p50")]
    assert len(missed) == len(free.ranked) - len(bound.ranked) > 0
    assert all(f"> advise.tpot_ms_max={limit:g}" in c.rejected for c in missed)
    assert figures(bound.ranked[0].summary)["tok_s_per_device"] < figures(free.ranked[0].summary)["tok_s_per_device"]


def test_the_memory_limit_is_checked_before_simulating():
    space = {"workload.batch_size": [1, 256]}
    advice = advise_runs(H100, question(space=space, hbm_gb_max=17.0))
    small, large = advice.candidates
    assert small.memory_gb < 17.0 < large.memory_gb
    assert large.rejected.startswith(f"needs {large.memory_gb:.6g} GB a device (weights ") and large.rejected.endswith("> 17 GB")
    assert not large.summary and advice.ranked == [small]


def test_the_graph_budget_pitfall_is_caught_on_ascend():
    """48 layers × 51 capture sizes do not fit Atlas A2's 1,800 streams (49 a graph: 36 graphs). vllm-ascend
    (update_aclgraph_sizes) keeps 36 of them spread evenly, positions rint(i × 50 / 35): 1, 2, 8, 16, 32, …,
    dropping 4 and 24. The candidate runs what the run runs, is charged for 36 graphs, and says so; at batch
    24 it pads to 32, so a list holding 24 wins."""
    space = {"strategy": ["acl_graph"], "workload.batch_size": [24], "strategy.graph.buckets": [VLLM_SIZES, [8, 16, 24, 32]]}
    advice = advise_runs(A2, question(space=space))
    full, short = advice.candidates
    run = make_run(A2 + ["strategy=acl_graph"])
    layers = layer_count(one_step(run))
    assert layers == 48 and run.hardware.graph.max_graphs == 1800  # Qwen3-30B-A3B's card; the atlas_a2 preset
    assert not full.rejected and full.graphs == 36
    assert full.note == ("36 of 51 capture sizes kept (1, 2, 8, 16, 32, 40, …, 512), trimmed evenly as vllm-ascend does: 1,800 streams"
                         " (hardware.graph.max_graphs) hold 36 graphs of 48 layers + 1 = 49 streams")
    alone = simulate_run(with_steps(make_run(A2 + ["strategy=acl_graph", "workload.batch_size=24",
                                                   f"strategy.graph.buckets={VLLM_SIZES}".replace(" ", "")]), full.steps)).summary
    assert without_wall_clock(full.summary) == {**without_wall_clock(alone), "serving": False}  # the advice's figures are the run's
    assert alone["graph_buckets"] == 36 and alone["graph_note"] == full.note
    # 24 pads to 32 in the trimmed list (a third more rows); with 24 kept only the experts' token counts pad
    assert full.summary["padding_waste"] > 0.05 > 0.001 > short.summary["padding_waste"]
    assert advice.ranked[0] is short and short.graphs == 4 and not short.note


def test_a_serving_candidate_is_charged_for_the_graphs_its_run_captures():
    """A serving run captures at start-up every size up to the first that holds max_batch (the run's own
    rule): of vLLM's 51 sizes, max_batch 20 captures 1, 2, 4, 8, 16 and 24, so the advice counts 6 graphs,
    their memory and capture time, not 51."""
    from harness.advisor.candidates import graph_sizes

    run = make_run(H100 + ["strategy=cuda_graph", f"strategy.graph.buckets={VLLM_SIZES}".replace(" ", ""),
                           "workload.serving.enabled=true", "workload.serving.max_batch=20"])
    assert graph_sizes(run) == [1, 2, 4, 8, 16, 24]
    assert len(graph_sizes(make_run(H100 + ["strategy=cuda_graph", f"strategy.graph.buckets={VLLM_SIZES}".replace(" ", "")]))) == 51

def test_a_batch_above_the_largest_capture_size_is_caught():
    """vLLM PR 12920: a max batch off the capture list leaves the largest batch without a graph; decode runs
    eagerly, several times slower."""
    advice = advise_runs(A2, question(space={"strategy": ["acl_graph"], "workload.batch_size": [32, 48], "strategy.graph.buckets": [[8, 16, 32]]}))
    fits, above = advice.candidates
    assert above.rejected == "batch 48 above the largest capture size 32: its decode steps would run eagerly"
    assert advice.ranked == [fits]


def test_finer_capture_sizes_beat_coarse_ones_at_a_batch_between_them():
    """vllm-ascend #16049: a batch of 40 padded to 64 pays for 24 sequences that are not there."""
    space = {"strategy": ["acl_graph"], "workload.batch_size": [40], "strategy.graph.buckets": [[16, 64], [8, 16, 24, 32, 40, 48, 56, 64]]}
    advice = advise_runs(A2, question(space=space))
    coarse, fine = advice.candidates
    assert advice.ranked[0] is fine
    # What padding is left: the batch padded to its capture size (the coarse grid's sizes lie further apart).
    assert figures(coarse.summary)["padding_waste"] > figures(fine.summary)["padding_waste"] + 0.03
    from harness.advisor.answer import why

    waste = figures(fine.summary)["padding_waste"], figures(coarse.summary)["padding_waste"]
    assert (f"Its capture sizes [8,16,24,32,40,48,56,64] cut padding waste to {waste[0]:.1%} from {waste[1]:.1%} with [16,64] (4 steps)."
            in why(advice))


def test_the_why_compares_the_winner_with_the_best_of_another_strategy_at_equal_steps():
    """The answer says what the winning strategy buys: the best candidate of another strategy, compared at
    the first rung, where both were simulated for the same steps (not the winner's longer run)."""
    from harness.advisor.answer import why

    space = {"strategy": ["eager", "cuda_graph"], "workload.batch_size": [1, 4, 16, 64]}
    advice = advise_runs(H100, question(space=space, steps=[2, 6], keep=0.25))
    winner = advice.ranked[0]
    others = [c for c in advice.candidates if c.run.strategy.name != winner.run.strategy.name]
    best = max(others, key=lambda c: figures(c.summaries[2])["tok_s_per_device"])
    mine, theirs = figures(winner.summaries[2])["tok_s_per_device"], figures(best.summaries[2])["tok_s_per_device"]
    assert (f"The best candidate with another strategy, {best.label}, gives {theirs:.1f} tok/s per device against the winner's"
            f" {mine:.1f} ({mine / theirs:.2f}×, both over 2 steps)") in why(advice)
    # Where the winner's device idles, how much of it is the front end's gaps (h100: 0.58 µs a graph node).
    s = winner.summary
    assert s["bubble_front_end"] >= 0.005
    assert f"the device idle {s['bubble_ratio']:.0%} of the time ({s['bubble_front_end']:.0%} in kernels' front-end gaps)" in why(advice)


def test_the_same_question_gives_the_same_answer():
    space = {"strategy": ["eager", "async"], "workload.batch_size": [1, 8]}
    first, second = (advise_runs(H100, question(space=space, steps=[2, 4], keep=0.5)) for _ in range(2))
    assert [(c.label, without_wall_clock(c.summary)) for c in first.ranked] == [(c.label, without_wall_clock(c.summary)) for c in second.ranked]


def test_the_command_writes_a_preset_that_runs_as_ranked(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "harness.advise", *H100, "advise=max_throughput", "advise.steps=[4]", "advise.space={strategy:[eager,cuda_graph],workload.batch_size:[1,8]}",
         "advise.baseline=[strategy=eager,workload.batch_size=1]", "advise.name=my_advice", "advise.out=adv", "output.trace_steps=0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # What ran, not where the advising user's files went (output.*, tracking.*: it wrote output: {trace_steps: 0})
    import yaml

    assert "output" not in yaml.safe_load((tmp_path / "conf" / "experiment" / "my_advice.yaml").read_text())
    assert "the baseline (strategy=eager batch_size=1:" in proc.stdout
    assert (tmp_path / "adv" / "advice.md").is_file() and (tmp_path / "adv" / "candidates.csv").is_file()
    assert (tmp_path / "adv" / "pareto.png").read_bytes()[:4] == b"\x89PNG" and "(pareto.png)" in (tmp_path / "adv" / "advice.md").read_text()
    preset = tmp_path / "conf" / "experiment" / "my_advice.yaml"
    assert f"winner       {preset} — run it: python -m harness experiment=my_advice" in proc.stdout
    ran = subprocess.run([sys.executable, "-m", "harness", "experiment=my_advice", "tracking.enabled=false", "hydra.run.dir=run"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    import json

    import pandas as pd

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    table = pd.read_csv(tmp_path / "adv" / "candidates.csv")
    assert summary["throughput_tok_s"] / summary["tp"] == pytest.approx(table.loc[0, "tok_s_per_device"], rel=1e-12)
    assert summary["strategy"] == "cuda_graph" and summary["steps"] == 4
    _check_advice_runs(tmp_path, table)


def _check_advice_runs(launch, table) -> None:
    """The advice's MLflow parent run holds the question, the winner's figures, the answer's files and its
    description; the leaders are its children, named by what they set, ranked as in candidates.csv."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{launch / 'outputs' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("hostbound").experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "advice"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.info.run_name == "advise: llama31_8b_decode on h100"
    assert parent.data.params["advise.space.strategy"] == "[eager,cuda_graph]" and parent.data.params["hardware"] == "h100"
    assert parent.data.params["advise.search"] == "exhaustive" and "advise.trials" not in parent.data.params  # defaults left out
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"advice.md", "candidates.csv", "pareto.png", "my_advice.yaml"}
    assert "gives" in parent.data.tags["mlflow.note.content"] and "| rank |" in parent.data.tags["mlflow.note.content"].replace("   ", " ")
    children = sorted((r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id), key=lambda r: r.data.metrics["advice/rank"])
    ranked = table[table["rank"].notna()]
    assert [r.info.run_name for r in children] == [f"#{i + 1} {c}" for i, c in enumerate(ranked["candidate"][:5])]
    # The parent's tags are the winner's choices, whose numbers it holds (it was tagged with the base run's
    # strategy); its params ask the question, not where it was logged; the winner is the newest child
    # (MLflow lists it first); the parent's duration is the search's.
    assert parent.data.tags["strategy"] == children[0].data.tags["strategy"]
    assert not any(k.startswith(("tracking.", "hydra")) or k in ("advise.workers", "advise.out") for k in parent.data.params)
    assert children[0].info.start_time == max(r.info.start_time for r in children)
    assert parent.info.end_time - parent.info.start_time >= 1000 * parent.data.metrics["advice/seconds"] - 1
    assert {r.info.status for r in children} == {"FINISHED"}
    assert children[0].data.metrics["headline/throughput_tok_s"] == pytest.approx(ranked["tok_s_per_device"].iloc[0], rel=1e-12)
    assert parent.data.metrics["headline/throughput_tok_s"] == children[0].data.metrics["headline/throughput_tok_s"]
    assert children[0].data.params == dict(o.split("=", 1) for o in children[0].data.tags["overrides"].split())


def test_an_advice_whose_store_fails_keeps_its_files_and_says_so(tmp_path):
    (tmp_path / "store").write_text("")  # a file where the store's folder should be
    proc = subprocess.run(
        [sys.executable, "-m", "harness.advise", *H100, "advise.steps=[2]", "advise.space={strategy:[eager]}", "advise.out=adv",
         f"tracking.uri=sqlite:///{tmp_path / 'store' / 'mlflow.db'}", "tracking.timeout_s=5"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("hostbound: error: tracking failed, the advice's files are kept (tracking.uri=sqlite:///")
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "adv" / "advice.md").is_file() and (tmp_path / "adv" / "candidates.csv").is_file()


@pytest.mark.parametrize(
    "args, says",
    [
        (["advise=max_troughput"], "advise=max_troughput: no such advise preset (did you mean max_throughput?)"),
        (["advise.tpot_ms_max=-1"], "advise.tpot_ms_max=-1"),
        (["advise.keep=2"], "advise.keep=2"),
        (["advise.nope=1"], "nope"),
        (["advise.name=a2_qwen3_eager"], "advise.name=a2_qwen3_eager: a shipped experiment preset has that name"),
        (["workload.batch_size=0"], "workload.batch_size=0: must be in"),
        (["strategy"], "strategy: not an override (KEY=VALUE)"),
        # named as the baseline's (a bare `strategy=foo: no such strategy preset` read as the run's own strategy)
        (["advise=max_throughput", "advise.baseline=[workload.batch_size=0]"], "hostbound: error: advise.baseline: workload.batch_size=0: must be in"),
        (["advise=max_throughput", "advise.baseline=[strategy=foo]"], "hostbound: error: advise.baseline: strategy=foo: no such strategy preset"),
        # A limit the run has no figure for passed every candidate unchecked ('2 met the limits').
        (["advise=max_throughput", "advise.ttft_ms_max=0.001"], "advise.ttft_ms_max=0.001: decode steps without a request stream have no TTFT"),
        (["workload=llama2_7b_prefill", "advise=decode_slo"], "advise.tpot_ms_max=50: a prefill has no time per output token"),
        # A value of the space no run could take is the user's mistake, refused as a run (or a sweep) refuses it:
        # it was a rejected candidate (exit 0, a preset written), or every candidate was ('no candidate meets the limits').
        (["advise.space={strategy:[eager,cudagraph]}"], "hostbound: error: advise.space: strategy=cudagraph: no such strategy preset (did you mean cuda_graph?)"),
        (["advise.space={workload.batch_size:[1,-2]}"], "hostbound: error: advise.space: workload.batch_size=-2: must be in 1..1048576 sequences\n"),
        (["advise.space={workload.bach_size:[1,2]}"], "hostbound: error: advise.space: workload.bach_size=1: no such key (did you mean workload.batch_size?)\n"),
        (["advise.space.strategy.graph.buckets=[[1,2],[1,x]]"], "hostbound: error: advise.space: strategy.graph.buckets[1]=x: must be an integer"),
        # a list no graph run takes (it was every candidate's rejection, advice.md and candidates.csv written, exit 2)
        (["advise.space.strategy.graph.buckets=[[]]"], "hostbound: error: advise.space: strategy.graph.buckets=[]: must be a list of 1..10000 sizes"),
        # An advise key is named as written, with the advise key meant (it was `tpot_max=...: no such key; the config groups are ...`)
        (["advise.tpot_max=30"], "hostbound: error: advise.tpot_max=30: no such key (did you mean advise.tpot_ms_max?)\n"),
        (["advise.tpot_ms_max=abc"], "hostbound: error: advise.tpot_ms_max=abc: must be a number\n"),
        # The example is advise's own syntax (it showed a run's `+space.NAME=VALUE`, which advise refuses).
        (["advise.space=5"], "hostbound: error: advise.space=5: must be a mapping, e.g. advise.space={NAME:VALUE}, or set one entry: advise.space.NAME=VALUE\n"),
        (["advise.space.workload.batch_size=[1,"], "hostbound: error: advise.space.workload.batch_size=[1,: not a list of values"),
    ],
)
def test_bad_input_is_one_line_and_nothing_is_written(args, says, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "harness.advise", *H100, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_op_list_base_refuses_a_batch_axis_whose_runs_differ_only_in_their_token_count(tmp_path):
    """An op list's steps do the same work at any workload.batch_size, which only counts their tokens: the
    advisor ranked batch 128 of a profile at 128x the tok/s of batch 1, at one TPOT. Refused in one line,
    nothing written."""
    (tmp_path / "ops.csv").write_text("name,kind,device_us\nmatmul,cube,20\nadd,vector,3\n")
    args = ["hardware=h100", "workload=trace", "workload.path=ops.csv", "advise=max_throughput", "tracking.enabled=false"]
    proc = subprocess.run([sys.executable, "-m", "harness.advise", *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("hostbound: error: advise.space: workload.batch_size=[1,8,32,64,128]: an op list's steps do the same work")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.csv"]


@pytest.mark.parametrize("preset, base", [
    ("max_throughput", H100), ("decode_slo", A2), ("ascend_graph_limited", A2),
    ("engine_options", ["hardware=h100", "workload=llama31_8b_decode", "engine=vllm_v1", "workload.serving.enabled=true"]),
    ("host_options", ["hardware=atlas_a2", "workload=llama2_7b_decode", "strategy=async"]),
])
def test_every_preset_asks_about_keys_a_run_has(preset, base):
    """Each axis of each shipped preset makes a run on a platform it is meant for: its first and last values."""
    from harness.config.advise import presets

    assert preset in presets()
    advise = compose_advise(preset, [])
    for key, values in advise.space.items():
        if key == "strategy":
            continue  # a preset choice, not a key: cuda_graph and acl_graph each run on their own platform
        for value in (values[0], values[-1]):
            override = f"{key}={candidates.value_text(value)}"
            assert make_run(base + [override]) == compose_run(base + [override]), override


def test_a_bad_baseline_is_refused_before_any_candidate_is_simulated(monkeypatch):
    import harness.advisor.search as search

    def no_search(*args, **kwargs):
        raise AssertionError("the search started with a baseline that does not compose")

    monkeypatch.setattr(search, "prepare", no_search)
    monkeypatch.setattr(search, "model_search", no_search)
    with pytest.raises(ConfigError, match="workload.batch_size=0"):
        advise_runs(H100, question(space={"strategy": ["eager", "cuda_graph"]}, steps=[2], baseline=["workload.batch_size=0"]))


def test_a_baseline_that_cannot_run_is_said_not_left_out():
    """A baseline that composes but cannot run (batch 100000 does not fit an H100) left no margin in the answer
    and no word on why: the user's own configuration vanished from it. The answer says why it has none."""
    from harness.advisor.answer import why

    advice = advise_runs(H100, question(space={"strategy": ["eager", "cuda_graph"]}, steps=[2], baseline=["workload.batch_size=100000"]))
    assert advice.ranked and advice.baseline is not None and not advice.baseline.summary
    text = why(advice)
    assert "The baseline (batch_size=100000) has no figures to compare with: hardware.device.hbm_gb=" in text
    assert "does not fit on one rank" in text


def test_the_presets_compose():
    for name in ("max_throughput", "decode_slo", "ascend_graph_limited", "engine_options", "host_options"):
        assert compose_advise(name, []).space
    with pytest.raises(ConfigError, match="advise.steps="):
        compose_advise("max_throughput", ["steps=[8,4]"])
    assert dataclasses.asdict(compose_advise("decode_slo", ["tpot_ms_max=20"]))["tpot_ms_max"] == 20.0


def test_a_stop_while_the_advise_preset_composes_waits_for_the_composition(monkeypatch):
    """A stop that arrives inside OmegaConf (here: in its merge) is taken once the preset is composed, as
    compose_run takes it: raised inside, it could leave OmegaConf's nodes broken and read as bad input."""
    import signal

    import harness.config.advise as advise_module
    from harness.base.stopping import Stopped, forget, stop_with

    merged = []

    def merge_then_stop(*configs):
        stop_with(Stopped(signal.SIGINT))
        merged.append(advise_module.OmegaConf.structured(AdviseConfig))  # after the stop: the composition goes on
        return real_merge(*configs)

    real_merge = advise_module.OmegaConf.merge
    monkeypatch.setattr(advise_module.OmegaConf, "merge", merge_then_stop)
    try:
        with pytest.raises(Stopped):
            compose_advise("decode_slo", [])
    finally:
        forget()
    assert len(merged) == 1


def test_an_advise_key_given_to_a_run_says_which_command_takes_it(capsys):
    from harness.cli.command import preflight

    with pytest.raises(SystemExit) as stopped:
        preflight(["advise=decode_slo"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "hostbound: error: advise=decode_slo: a question for python -m harness.advise (the best configuration under limits), not a run's key\n"
    )


def test_a_space_given_whole_replaces_the_presets():
    assert compose_advise("max_throughput", ["space={strategy:[eager]}"]).space == {"strategy": ["eager"]}
    assert set(compose_advise("max_throughput", ["space.hardware.host.threads=[4]"]).space) == {"strategy", "workload.batch_size", "hardware.host.threads"}


def test_a_search_that_runs_out_of_time_says_so_first(monkeypatch):
    """A clock past advise.budget_s after the limits are checked: no candidate is simulated, and the answer
    says so before anything else (the clock is the search's own, made to jump, not this machine's speed)."""
    import itertools

    from harness.advisor import search
    from harness.advisor.answer import why

    ticks = itertools.chain([0.0], itertools.repeat(1000.0))
    monkeypatch.setattr(search.time, "perf_counter", lambda: next(ticks))
    advice = advise_runs(H100, question(space={"workload.batch_size": [1, 8, 32]}, budget_s=60))
    assert advice.out_of_time == 3 and advice.ranked == [] and all(not c.summary for c in advice.candidates)
    assert why(advice).startswith("advise.budget_s ran out: 3 simulations were not run, and the ranking is of the candidates that were")


def test_a_winner_without_latency_figures_is_still_described():
    """A serving run that finished no request has no TPOT or TTFT: the answer leaves them out instead of failing."""
    from harness.advisor.answer import _latency_text

    assert _latency_text({"tpot_ms_p50": None, "ttft_ms": None, "ttft_without_prefill": False}) == ""
    assert _latency_text({"tpot_ms_p50": 7.0871, "ttft_ms": None, "ttft_without_prefill": False}) == " at TPOT p50 7.09 ms"
    assert _latency_text({"tpot_ms_p50": 7.0871, "ttft_ms": 10.93, "ttft_without_prefill": False}) == " at TPOT p50 7.09 ms, TTFT 10.9 ms"


def test_a_serving_runs_ttft_is_named_for_what_it_leaves_out():
    """A serving run's requests arrive prefilled: its TTFT (the wait for the first decode token) has no
    prefill in it, and a TTFT limit checked against it says so, in the answer and in a rejection."""
    from harness.advisor.answer import _latency_text
    from harness.advisor.rung import figures, latency_miss

    summary = {"serving": True, "median_tpot_ms": 7.0871, "p99_tpot_ms": 7.4, "median_ttft_ms": 10.93, "throughput_tok_s": 100.0,
               "bubble_ratio": 0.1, "bound": "device", "ttft_note": "requests arrive prefilled: ..."}
    assert _latency_text(figures(summary)) == " at TPOT p50 7.09 ms, TTFT 10.9 ms (without prefill: the requests arrive prefilled)"
    limit = question(space={"workload.batch_size": [1, 8]}, ttft_ms_max=10.0)
    assert latency_miss(summary, limit) == "TTFT without prefill 10.93 ms > advise.ttft_ms_max=10"  # enough digits to see it is over
    step = {"step_ms_p50": 7.0, "step_ms_p99": 7.5, "ttft_ms": 12.0, "throughput_tok_s": 100.0, "bubble_ratio": 0.1, "bound": "device"}
    assert latency_miss(step, limit) == "TTFT 12 ms > advise.ttft_ms_max=10"


def test_the_answer_does_not_depend_on_where_it_is_simulated():
    """In this process or on two forked workers: the same candidates, the same figures, the same ranking."""
    from harness.advisor.evaluate import ForkedWorkers, InProcess

    space = {"strategy": ["eager", "cuda_graph"], "workload.batch_size": [1, 8, 64]}
    here = advise_runs(H100, question(space=space, steps=[2, 4], keep=0.5), where=InProcess())
    forked = advise_runs(H100, question(space=space, steps=[2, 4], keep=0.5), where=ForkedWorkers(2))
    assert (here.workers, forked.workers) == (1, 2)
    assert [(c.label, c.steps, without_wall_clock(c.summary)) for c in forked.candidates] == [
        (c.label, c.steps, without_wall_clock(c.summary)) for c in here.candidates]
    assert [c.label for c in forked.ranked] == [c.label for c in here.ranked]


OPTUNA_SPACE = {"strategy": ["eager", "async", "cuda_graph"], "workload.batch_size": list(range(1, 65))}


@pytest.fixture(scope="module")
def brute_force_192():
    return advise_runs(H100, question(space=OPTUNA_SPACE, search="exhaustive", tpot_ms_max=8))


def test_a_large_space_is_searched_by_optuna_near_brute_force(brute_force_192):
    """24 of 192 candidates, picked by TPE, find a winner within 10 % of the best of all 192 (measured: 97.8 %
    at seed 0; 92-98 % at seeds 0-3), and it meets the limit."""
    picked = advise_runs(H100, question(space=OPTUNA_SPACE, exhaustive_max=100, trials=24, tpot_ms_max=8))
    assert picked.method == "optuna" and brute_force_192.method == "exhaustive"
    assert len(picked.candidates) == 24 and len({c.label for c in picked.candidates}) == 24
    best = figures(brute_force_192.ranked[0].summary)["tok_s_per_device"]
    found = figures(picked.ranked[0].summary)
    assert found["tok_s_per_device"] >= 0.9 * best and found["tpot_ms_p50"] <= 8
    assert all(figures(c.summary)["tpot_ms_p50"] <= 8 for c in picked.ranked)
    again = advise_runs(H100, question(space=OPTUNA_SPACE, search="optuna", trials=24, tpot_ms_max=8))
    assert [c.label for c in again.candidates] == [c.label for c in picked.candidates]  # seeded: the same picks



def test_an_advice_whose_worker_dies_ends_in_one_line(tmp_path):
    """A worker killed from outside (SIGKILL, the out-of-memory killer) loses the simulation it ran: the
    advice ends with exit status 5 and one line instead of waiting for it for ever."""
    import os
    import signal
    import time
    from pathlib import Path

    space = "{strategy:[eager,async,pipeline,cuda_graph],workload.batch_size:[" + ",".join(map(str, range(1, 101))) + "]}"
    proc = subprocess.Popen([sys.executable, "-m", "harness.advise", *H100, f"advise.space={space}", "advise.workers=2", "advise.out=adv",
                             "tracking.enabled=false"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "simulating on 2 worker processes" in line:
            time.sleep(0.5)
            workers = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat") if _parent_of(p) == proc.pid]
            assert len(workers) == 2
            os.kill(workers[0], signal.SIGKILL)
            break
    _, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    assert proc.returncode == 5, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("hostbound: error: an advice's worker process died (killed by a signal, or out of memory)")
    assert "Traceback" not in err


def _parent_of(stat) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):  # ended meanwhile
        return None


def test_the_why_says_when_no_other_strategy_meets_the_limits():
    from harness.advisor.answer import why

    space = {"strategy": ["eager", "cuda_graph"], "workload.batch_size": [1]}
    free = advise_runs(H100, question(space=space))
    tpot = {c.run.strategy.name: figures(c.summary)["tpot_ms_p50"] for c in free.candidates}
    assert tpot["cuda_graph"] < tpot["eager"]  # replay never slower than eager at equal batch
    limit = (tpot["cuda_graph"] + tpot["eager"]) / 2
    limited = advise_runs(H100, question(space=space, tpot_ms_max=limit))
    assert [c.run.strategy.name for c in limited.ranked] == ["cuda_graph"]
    assert why(limited).endswith(f"No candidate with another strategy meets the limits: the best of them, strategy=eager batch_size=1, has"
                                 f" TPOT p50 {tpot['eager']:.6g} ms > advise.tpot_ms_max={limit:g}.")


def test_per_device_is_per_device_of_the_dp_group_that_made_the_throughput():
    """batch_size is per DP group, and throughput one group's (docs/outputs.md): a group of tp devices
    makes it. TP 1 × DP 2 at the same step does the same work a device as DP 1: 157.3 tok/s a device
    both (it was divided by tp × dp, so a dp of 2 ranked half as high); TP 2 halves it."""
    base = {"throughput_tok_s": 157.3, "step_ms_p50": 6.357, "step_ms_p99": 6.4, "bubble_ratio": 0.1, "bound": "device"}
    assert figures({**base, "tp": 1, "dp": 2, "devices": 2})["tok_s_per_device"] == 157.3
    assert figures({**base, "tp": 1, "dp": 1, "devices": 1})["tok_s_per_device"] == 157.3
    assert figures({**base, "tp": 2, "dp": 1, "devices": 2})["tok_s_per_device"] == 157.3 / 2
    # A simulated summary carries tp (the advice's summaries are the simulator's, not summary.json's)
    deepseek = advise_runs(["hardware=atlas_a2", "workload=deepseek_v3"], question(space={"strategy": ["acl_graph"]}, steps=[4]))
    summary = deepseek.ranked[0].summary
    assert (summary["tp"], summary["devices"]) == (4, 16)
    assert figures(summary)["tok_s_per_device"] == summary["throughput_tok_s"] / 4


def test_a_prefill_has_no_tpot_to_miss():
    """A prefill step is its TTFT, not a time per output token: a TPOT limit does not reject it (it had
    rejected both prefill candidates with their step time as "TPOT")."""
    from harness.advisor.rung import latency_miss

    prefill = {"throughput_tok_s": 1e4, "step_ms_p50": 51.6, "step_ms_p99": 52.0, "ttft_ms": 51.6, "bubble_ratio": 0.1, "bound": "device", "tp": 1}
    assert figures(prefill)["tpot_ms_p50"] is None and figures(prefill)["ttft_ms"] == 51.6
    space = {"workload.batch_size": [1]}
    assert latency_miss(prefill, question(space=space, tpot_ms_max=1.0)) == ""
    assert latency_miss(prefill, question(space=space, ttft_ms_max=50.0)) == "TTFT 51.6 ms > advise.ttft_ms_max=50"
    simulated = advise_runs(["workload=llama2_7b_prefill", "workload.context_len=128"], question(space=space, steps=[2], tpot_ms_max=0.001))
    assert [c.rejected for c in simulated.candidates] == [""] and simulated.ranked


def test_memory_is_checked_at_the_steps_the_advice_ranks():
    """The KV cache is largest at the last step the candidates run: advise.steps' longest rung, whatever
    workload.steps the base run says (it was the base's: 1 step ranked at 64 fitted HBM the ranked run
    does not)."""
    space = {"workload.batch_size": [64]}
    one, many = (advise_runs(H100 + [f"workload.steps={steps}"], question(space=space, steps=[64])).candidates[0] for steps in (1, 64))
    assert one.memory_gb == many.memory_gb > 0


def test_an_advice_with_no_candidate_simulated_writes_its_answer(tmp_path):
    """Every candidate rejected before simulating (none fits 1 GB): the answer and candidates.csv are
    written, with no Pareto plot, instead of a KeyError after candidates.csv."""
    from harness.advisor.answer import write_answer

    advice = advise_runs(H100, question(space={"workload.batch_size": [1, 8]}, hbm_gb_max=1.0))
    assert advice.ranked == [] and all(c.rejected.startswith("needs ") for c in advice.candidates)
    frame, preset = write_answer(advice, H100, "python -m harness.advise", tmp_path, "none_fits")
    assert preset is None and len(frame) == 2 and (tmp_path / "candidates.csv").is_file() and not (tmp_path / "pareto.png").exists()
    assert "No candidate meets the limits" in (tmp_path / "advice.md").read_text()


def test_a_winner_on_an_experiment_is_written_as_a_preset_that_builds_on_it(tmp_path, monkeypatch):
    """A base `+experiment=…` is a defaults entry of the written preset (it had been a top-level key, and
    the preset failed to compose): composed again, it is the run that was ranked."""
    from harness.advisor.answer import preset_text

    base = ["+experiment=a2_qwen3_b12_eager"]
    advice = advise_runs(base, question(space={"workload.batch_size": [8]}, steps=[2]))
    winner = advice.ranked[0]
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "on_experiment.yaml").write_text(preset_text(base, winner, "python -m harness.advise"))
    monkeypatch.chdir(tmp_path)
    assert compose_run(["+experiment=on_experiment"]) == with_steps(make_run(base + winner.overrides), 2)


def test_a_rung_that_prunes_serving_runs_before_their_requests_finish_says_so():
    """A request stream's throughput before its requests finish is its batches' alone: a first rung of 4
    steps finishes no 24-token request, so pruning there rests on too little, and the answer says so
    (a review saw max_batch 64 dropped at 20 steps that was 1.36x the winner at 200)."""
    from harness.advisor.answer import why

    space = {"workload.serving.max_batch": [8, 64]}
    serving = ["workload.serving.enabled=true", "workload.serving.output_len_mean=24"]
    advice = advise_runs(H100 + serving, question(space=space, steps=[4, 8], keep=0.5))
    assert len(advice.notes) == 2 and advice.notes[0].startswith("the 4-step rung dropped 1 of 2 candidates while 2 of them")
    assert f"Note: {advice.notes[0]}. " in why(advice)
    # The last rung too: the winner's TPOT, which the limits read, rests on no finished request (unsaid before).
    winner_done = int(advice.ranked[0].summaries[8]["requests_completed"])
    assert winner_done < 20 and advice.notes[1] == (
        f"1 of the 1 ranked candidates finished fewer than 20 requests in 8 steps (the winner {winner_done}):"
        " their latency figures and the limits checked on them rest on few requests; raise advise.steps")
    assert f"Note: {advice.notes[1]}. " in why(advice)
    assert advise_runs(H100, question(space={"workload.batch_size": [1, 8]}, steps=[4, 8], keep=0.5)).notes == []


def test_candidates_that_run_as_another_are_not_counted_as_rejected(tmp_path):
    """An eager candidate of a second capture-size list runs what the first runs: it is not simulated
    again, and the search line counts it apart from the candidates that broke a limit."""
    proc = subprocess.run([sys.executable, "-m", "harness.advise", *H100, "advise.steps=[2]", "advise.out=adv", "tracking.enabled=false",
                           "advise.space={strategy:[eager],strategy.graph.buckets:[[1,2],[4,8]]}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(1 ranked, 1 the same run as another candidate; steps per rung 2: 1 met the limits)" in proc.stdout
    # The terminal's table leaves out a p99 over 2 steps as advice.md and candidates.csv do, and says so.
    assert "\nnote: tpot_ms_p99 is left out of 1 of the 1 rows: it would rest on 2 measured steps, fewer than 20" in proc.stdout
    assert "tpot_ms_p99" not in proc.stdout.split("note:")[0]
    # The progress line on stderr counts them the same way (it called the duplicate "rejected before simulating").
    assert "hostbound advise: 2 candidates (1 the same run as another candidate); simulating on" in proc.stderr, proc.stderr


def test_the_shown_table_leaves_out_a_serving_flag_no_row_has():
    """`ttft_without_prefill` flags a serving run's TTFT; every decode table showed it as a column of False."""
    import pandas as pd

    from harness.advisor.answer import shown_table

    frame = pd.DataFrame({"rank": [1.0, 2.0], "candidate": ["a", "b"], "tok_s_per_device": [2.0, 1.0], "ttft_ms": [None, None],
                          "ttft_without_prefill": [False, False], "status": ["ranked", "ranked"], "p99_samples": [20, 20],
                          "reason": ["", ""], "note": ["", ""]})
    assert list(shown_table(frame, 10).columns) == ["rank", "candidate", "tok_s_per_device"]
    served = frame.assign(ttft_ms=[5.0, 6.0], ttft_without_prefill=[True, True])
    assert "ttft_without_prefill" in shown_table(served, 10).columns


def test_pareto_names_in_the_right_half_run_leftwards(tmp_path, monkeypatch):
    """The front's names were drawn rightwards from every point: the fastest-per-user ones were cut at the
    plot's right edge ('...max_batch=3' for 32)."""
    import matplotlib.axes
    import numpy as np

    from harness.results.comparison import pareto_plot

    drawn = []
    annotate = matplotlib.axes.Axes.annotate
    monkeypatch.setattr(matplotlib.axes.Axes, "annotate", lambda self, text, xy, **kw: drawn.append((text, kw["ha"])) or annotate(self, text, xy, **kw))
    pareto_plot(np.array([100.0, 80.0, 60.0]), np.array([10.0, 50.0, 100.0]), ["slow", "middle", "fast"], tmp_path / "p.png")
    assert dict(drawn) == {"slow": "left", "middle": "left", "fast": "right"}



def test_an_advice_over_a_key_added_with_plus_is_logged_without_the_plus(tmp_path):
    """MLflow refuses a param key with `+`: `advise.space.+workload.card_overrides.num_hidden_layers` failed
    the advice's logging (exit 3, its parent run FAILED)."""
    import mlflow

    from harness.advisor.answer import param_key

    assert param_key("+workload.card_overrides.num_hidden_layers") == "workload.card_overrides.num_hidden_layers"
    assert param_key("~a.+b") == "a.b" and param_key("strategy") == "strategy"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.advise", "hardware=h100", "workload=llama2_7b_decode", "advise=max_throughput", "advise.steps=[2]",
         'advise.space={strategy:[eager],"+workload.card_overrides.num_hidden_layers":[2,4]}', "advise.workers=1", "advise.out=adv",
         f"tracking.uri={store}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    client = mlflow.MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("hostbound").experiment_id])
    parent = next(r for r in runs if r.data.tags.get("kind") == "advice")
    assert parent.info.status == "FINISHED" and parent.data.params["advise.space.workload.card_overrides.num_hidden_layers"] == "[2,4]"
    children = [r for r in runs if r.data.tags.get("kind") == "advice_candidate"]
    assert children and {r.info.status for r in children} == {"FINISHED"}
    assert all("workload.card_overrides.num_hidden_layers" in r.data.params for r in children)


def test_a_value_refused_only_in_combination_stays_a_candidates_rejection():
    """cuda_graph is a preset, refused on Ascend hardware only (a space may pair it with hardware=h100): the
    space is not refused, the candidate is, with the run's reason; a typo is refused whole, before any candidate."""
    from harness.advisor.candidates import check_space

    advice = advise_runs(A2, question(space={"strategy": ["acl_graph", "cuda_graph"]}, steps=[2]))
    graph, cuda = advice.candidates
    assert cuda.rejected.startswith("strategy=cuda_graph: runs on cuda hardware") and advice.ranked == [graph]
    check_space({"strategy": ["cuda_graph"], "workload.tp": [3], "+workload.card_overrides.num_hidden_layers": [2]}, A2)  # none refused
    with pytest.raises(ConfigError, match=r"^advise.space: workload.batch_size=abc: must be an integer$"):
        advise_runs(H100, question(space={"workload.batch_size": [1, "abc"]}, steps=[2]))


SERVING = ["engine=vllm_v1", "workload.serving.enabled=true", "workload.serving.max_batch=32"]


def test_a_serving_candidate_that_finished_no_request_is_not_scored_as_decode_steps():
    """A serving run that finished no request has no TPOT, but it served: its TTFT is its first tokens'
    median (it was NaN, its TPOT the step p50, because serving was told by `median_tpot_ms`)."""
    from harness.advisor.rung import latency_miss, unmeasured

    run = make_run(H100 + SERVING)
    summary = simulate_run(with_steps(run, 8)).summary
    assert summary["requests_completed"] == 0 and "median_tpot_ms" not in summary and summary["median_ttft_ms"] > 0
    advice = advise_runs(H100 + SERVING, question(space={"strategy": ["eager"]}, steps=[8]))
    f = figures(advice.candidates[0].summary)
    assert f["tpot_ms_p50"] is None and f["tpot_ms_p99"] is None
    assert f["ttft_ms"] == summary["median_ttft_ms"] and f["ttft_without_prefill"]
    # A limit with no figure to check is not met silently: the last rung rejects it and says why.
    limit = question(space={"strategy": ["eager"]}, tpot_ms_max=1000.0)
    assert latency_miss(advice.candidates[0].summary, limit) == ""
    assert unmeasured(advice.candidates[0].summary, limit, 8) == (
        "not measured: TPOT (0 requests finished in 8 steps), so advise.tpot_ms_max=1000 could not be checked: raise advise.steps")
    limited = advise_runs(H100 + SERVING, question(space={"strategy": ["eager"]}, steps=[8], tpot_ms_max=1000.0))
    assert limited.ranked == [] and limited.candidates[0].rejected.startswith("not measured: TPOT (0 requests finished in 8 steps)")
    # Its TTFT is checked (it was skipped: no figure, no check).
    tight = advise_runs(H100 + SERVING, question(space={"strategy": ["eager"]}, steps=[8], ttft_ms_max=0.001))
    assert tight.candidates[0].rejected.startswith("TTFT without prefill ")
    # A shorter rung passes it on unchecked, and says so.
    two = advise_runs(H100 + SERVING, question(space={"strategy": ["eager"]}, steps=[4, 8], tpot_ms_max=1000.0))
    assert two.rungs == [(4, 1), (8, 0)] and two.notes[0].startswith(
        "the 4-step rung had no TPOT for 1 of 1 candidates (no request finished there: strategy=eager), so it ranked them on throughput alone")


def test_a_p99_over_fewer_than_20_steps_is_left_out_and_the_table_says_so(tmp_path, monkeypatch):
    """A p99 over 4 measured steps is about their maximum: candidates.csv, advice.md and the terminal leave
    it out, and the tables say why (they showed it without a word)."""
    import pandas as pd

    from harness.advisor.answer import write_answer

    monkeypatch.chdir(tmp_path)  # the winner's preset goes to the launch folder's conf/experiment

    short = advise_runs(H100, question(space={"workload.batch_size": [1, 8]}, steps=[4]))
    assert all(figures(c.summary)["tpot_ms_p99"] is None and figures(c.summary)["tpot_ms_p50"] > 0 for c in short.candidates)
    write_answer(short, H100, "python -m harness.advise", tmp_path, "p99_short")
    table = pd.read_csv(tmp_path / "candidates.csv")
    assert table["tpot_ms_p99"].isna().all() and list(table["p99_samples"]) == [4, 4]
    assert ("Note: tpot_ms_p99 is left out of 2 of the 2 rows: it would rest on 4 measured steps, fewer than 20, about their maximum,"
            " not a tail (raise advise.steps for one).") in (tmp_path / "advice.md").read_text()
    long = advise_runs(H100, question(space={"workload.batch_size": [1]}, steps=[24]))
    summary = long.ranked[0].summary
    assert summary["steps_measured"] >= 20 and figures(summary)["tpot_ms_p99"] == summary["step_ms_p99"]


def test_every_candidate_has_a_status_and_the_counts_agree(tmp_path):
    """Candidates pruned by the first rung had no rank and no reason in candidates.csv and were not in
    advice.md; the terminal counted 'rejected' without the duplicates advice.md's 'Rejected (N)' counted."""
    import re

    import pandas as pd

    proc = subprocess.run([sys.executable, "-m", "harness.advise", *H100, "advise.steps=[2,4]", "advise.keep=0.5", "advise.out=adv",
                           "tracking.enabled=false", "advise.hbm_gb_max=40",
                           "advise.space={strategy:[eager,cuda_graph],workload.batch_size:[1,8,1024],strategy.graph.buckets:[[1,8],[1,2,8]]}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pd.read_csv(tmp_path / "adv" / "candidates.csv", keep_default_na=False)
    assert set(table["status"]) == {"ranked", "rejected", "same run", "pruned"}
    assert (table["reason"] != "").sum() == (table["status"] != "ranked").sum()
    pruned = table[table["status"] == "pruned"]
    assert all(re.fullmatch(r"pruned after the 2-step rung: ranked \d+ of \d+ there, the best \d+ went on \(advise.keep=0.5\)", r)
               for r in pruned["reason"])
    counts = (f"{(table['status'] == 'rejected').sum()} rejected, {(table['status'] == 'same run').sum()} the same run as another"
              f" candidate, {len(pruned)} pruned by a shorter rung")
    assert f"({(table['status'] == 'ranked').sum()} ranked, {counts}; steps per rung" in proc.stdout
    advice = (tmp_path / "adv" / "advice.md").read_text()
    assert f"## Not ranked ({(table['status'] != 'ranked').sum()}: {counts})" in advice
    assert all(c in advice for c in pruned["candidate"])
