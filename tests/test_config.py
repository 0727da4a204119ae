"""Every preset composes; bad values fail with a message naming the key and the value."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import compose_run
from harness.cli.command import override_variants, preflight
from harness.config.paths import CONF_DIR
from harness.config.schema import Dispatch, Phase, flatten, unflatten
from harness.base.errors import ConfigError

TINY_TRACE = Path(__file__).parent / "data" / "tiny_ops.csv"
GROUPS = {group: sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")) for group in ("hardware", "workload", "strategy")}


@pytest.fixture(autouse=True)
def _launched_from_a_scratch_folder(tmp_path, monkeypatch):
    """preflight probes the run folder's parents (outputs/runs/<date>) under the launch folder: a scratch
    one here, not the checkout."""
    monkeypatch.chdir(tmp_path)


def test_every_group_has_the_issue_presets():
    assert "atlas_a2" in GROUPS["hardware"]
    assert {"llama2_7b_decode", "llama2_7b_prefill"} <= set(GROUPS["workload"])
    assert {"eager", "async", "pipeline"} <= set(GROUPS["strategy"])


def _pairs_of_presets() -> list[tuple[str, str, str]]:
    """Every pair of presets of two groups, the third group at its first preset (which a pair of the
    other two already covers): what composing can get wrong is between two groups (a strategy for another
    platform, a workload's keys under a hardware's), and the full product of six hardware presets, ten
    workloads and eight strategies took minutes of the suite."""
    hardware, workloads, strategies = GROUPS["hardware"], GROUPS["workload"], GROUPS["strategy"]
    combos = {(h, w, "eager") for h in hardware for w in workloads}
    combos |= {(h, "llama2_7b_decode", s) for h in hardware for s in strategies}
    combos |= {("atlas_a2", w, s) for w in workloads for s in strategies} | {("h100", w, s) for w in workloads for s in strategies}
    return sorted(combos)


@pytest.mark.parametrize("hardware,workload,strategy", _pairs_of_presets())
def test_every_pair_of_presets_composes(hardware, workload, strategy):
    extra = [f"workload.path={TINY_TRACE}"] if workload == "trace" else []
    overrides = (f"hardware={hardware}", f"workload={workload}", f"strategy={strategy}", *extra)
    stack_specific = {"ge_sink": "ascend", "mindspore": "ascend", "acl_graph": "ascend", "cuda_graph": "cuda", "cuda_graph_piecewise": "cuda"}
    has = "ascend" if hardware.startswith("atlas") else "cuda"
    if stack_specific.get(strategy, has) != has:
        with pytest.raises(ConfigError, match=rf"^strategy={strategy}: runs on {stack_specific[strategy]} hardware, hardware={hardware} is {has}"):
            compose_run(*overrides)
        return
    run = compose_run(*overrides)
    assert run.hardware.name == hardware
    assert run.workload.name == workload
    assert run.strategy.name == strategy


@pytest.mark.parametrize("engine", sorted(p.stem for p in (CONF_DIR / "engine").glob("*.yaml")))
def test_every_engine_composes_with_serving(engine):
    """Each engine on hardware of its stack; vllm-ascend, an Ascend engine, refused on an H100 in one line
    naming both (it ran there as if vLLM V1 with another name)."""
    hardware = "atlas_a2" if engine == "vllm_ascend" else "h100"
    run = compose_run(f"engine={engine}", f"hardware={hardware}", "workload=llama31_8b_decode", "workload.serving.enabled=true")
    assert run.engine.name == engine
    assert run.engine.active == (engine != "none")
    if engine == "vllm_ascend":
        with pytest.raises(ConfigError, match=r"^engine=vllm_ascend: serves on ascend hardware, hardware=h100 is cuda$"):
            compose_run("engine=vllm_ascend", "hardware=h100", "workload=llama31_8b_decode", "workload.serving.enabled=true")


def test_unfused_kernels_need_a_card_that_lists_them():
    from harness.model.workload import build_workload

    with pytest.raises(ConfigError, match="workload.kernels=unfused: card 'deepseek_v3'"):
        build_workload(compose_run("workload=deepseek_v3", "workload.kernels=unfused").workload)
    hf = build_workload(compose_run("workload=llama31_8b_decode", "workload.kernels=unfused", "workload.steps=2").workload)
    assert hf.n_ops == 7 + 32 * 40 + 15  # HF transformers eager: 40 kernels per layer, 22 around them


def test_unfused_model_code_pays_each_module_calls_python_in_eager_and_not_in_a_replayed_graph():
    """Llama-3.1-8B as HF issues it makes 4 + 32 x 13 + 2 = 422 nn.Module calls a forward: at
    hardware.host.module_us=5 that is 2.11 ms more host time a step, one host op before the layers, one
    in each layer and one after them; a replayed graph runs none of it, and fused kernels (a serving
    engine's model code, engine.layer_overhead_us) never pay it."""
    from harness.model.workload import build_workload, run_build_options
    from harness.sim.simulate import simulate_run

    run = compose_run("hardware=h100", "workload=llama31_8b_decode", "workload.kernels=unfused", "workload.steps=2", "hardware.host.module_us=5")
    hf = build_workload(run.workload, **run_build_options(run))
    assert hf.n_ops == 7 + 32 * 40 + 15 + 1 + 32 + 1
    assert hf.host_us.sum() == pytest.approx(422 * 5.0)
    assert sorted(set(hf.host_us[hf.host_us > 0])) == pytest.approx([2 * 5.0, 4 * 5.0, 13 * 5.0])
    fused = compose_run("hardware=h100", "workload=llama31_8b_decode", "workload.steps=2", "hardware.host.module_us=5")
    assert build_workload(fused.workload, **run_build_options(fused)).host_us.sum() == 0.0

    def host_ms(*overrides):
        s = simulate_run(compose_run("hardware=h100", "workload=llama31_8b_decode", "workload.kernels=unfused", "workload.steps=4", *overrides)).summary
        return s["host_busy_max"] * s["step_ms_mean"], s["step_ms_mean"]

    (with_modules, _), (without, _) = host_ms("hardware.host.module_us=5"), host_ms("hardware.host.module_us=0")
    assert with_modules - without == pytest.approx(422 * 5.0 / 1e3, rel=0.02)
    graph = [host_ms("strategy=cuda_graph", f"hardware.host.module_us={v}")[1] for v in (5, 0)]
    assert graph[0] == graph[1]


def test_an_unfused_kv_cache_is_static_under_graphs_and_grows_by_cat_in_eager_mode():
    """Qwen2.5-7B as HF issues it, one sequence of 2,048 tokens: DynamicCache's torch.cat reads and writes
    the whole K (or V) cache with the new token's, 2 x 2,049 x 4 KV heads x 128 x 2 bytes, every step (its
    shape changes); a static cache (HF StaticCache, gpt-fast; what a captured graph needs) writes the new
    token's 4 x 128 values in place: 2 x 512 x 2 bytes. workload.kv_cache=auto is static exactly when the
    strategy captures or sinks graphs; a serving engine's fused list has no such op."""
    from harness.model.workload import build_workload, run_build_options

    def kv_ops(*overrides, workload="qwen25_7b_decode"):
        run = compose_run("hardware=h200", f"workload={workload}", "workload.kernels=unfused", "workload.steps=1",
                          "workload.context_len=2048", *overrides)
        workload = build_workload(run.workload, **run_build_options(run))
        found = {}
        for j, name in enumerate(workload.op_names):
            if name in ("layers.0.kv_cat", "layers.0.kv_write"):
                found.setdefault(name.split(".")[-1], []).append(float(workload.bytes[0, j]))
        return found

    cat_bytes = 2 * 2049 * 4 * 128 * 2.0
    assert kv_ops() == kv_ops("workload.kv_cache=dynamic") == {"kv_cat": [cat_bytes, cat_bytes]}
    assert kv_ops("workload.kv_cache=static") == kv_ops("strategy=cuda_graph") == {"kv_write": [2048.0, 2048.0]}
    assert kv_ops("strategy=cuda_graph", "workload.kv_cache=dynamic") == {"kv_cat": [cat_bytes, cat_bytes]}
    assert kv_ops("strategy.graph.mode=sink") == {"kv_write": [2048.0, 2048.0]}  # a sunk graph's shapes are fixed too
    # A 2,048-token prompt writes all its tokens' K (or V): 2,048 x 4 x 128 values read and written.
    assert kv_ops("workload.kv_cache=static", workload="qwen25_7b_prefill") == {"kv_write": [2048 * 4 * 128 * 4.0] * 2}
    # A serving engine's fused list has its paged cache's kv_cache_write: a kv_cache that would change nothing
    # is refused rather than run as if it had not been given.
    with pytest.raises(ConfigError, match=r"^workload.kv_cache=static: .*fused kernels write it in place"):
        kv_ops("workload.kernels=fused", "workload.kv_cache=static")
    with pytest.raises(Exception, match="kv_cache"):
        compose_run("workload.kv_cache=growing")


def test_defaults():
    run = compose_run()
    assert (run.hardware.name, run.workload.name, run.strategy.name) == ("atlas_a2", "llama2_7b_decode", "eager")
    assert run.workload.phase == Phase.decode and run.strategy.dispatch == Dispatch.eager
    assert run.tracking.enabled and run.tracking.uri is None


@pytest.mark.parametrize(
    "override,named",
    [
        ("workload.batch_size=0", "workload.batch_size=0"),
        ("workload.steps=-3", "workload.steps=-3"),
        ("hardware.device.hbm_gbps=-1", "hardware.device.hbm_gbps=-1"),
        ("hardware.device.ai_cores=0", "hardware.device.ai_cores=0"),
        ("hardware.link.pcie_gbps=0", "hardware.link.pcie_gbps=0"),
        ("hardware.host.launch_us=-5", "hardware.host.launch_us=-5"),
        ("hardware.host.threads=0", "hardware.host.threads=0"),
        ("strategy.queue_capacity=0", "strategy.queue_capacity=0"),
        ("workload.card=null", "workload.ops=[]"),  # no card and no ops: the empty op list is named
        ("workload.card=gpt5", "workload.card=gpt5"),
        ("workload.warmup_steps=64", "workload.warmup_steps=64"),
        ("engine.api.per_request_us=-1", "engine.api.per_request_us=-1"),
        ("engine.multi_step=0", "engine.multi_step=0"),
        ("hardware.device.hbm_efficiency=1.5", "hardware.device.hbm_efficiency=1.5"),
        ("hardware.device.matmul_efficiency=0", "hardware.device.matmul_efficiency=0"),
    ],
)
def test_invalid_values_name_key_and_value(override, named):
    with pytest.raises(ConfigError) as err:
        compose_run(override)
    message = str(err.value)
    assert message.startswith(named)
    assert "\n" not in message


@pytest.mark.parametrize(
    "override,fragments",
    [
        ("workload.batch_size=abc", ["workload.batch_size", "abc"]),
        ("hardware.device.cores=4", ["hardware.device.cores"]),
        ("strategy.dispatch=turbo", ["strategy.dispatch", "turbo"]),
        ("workload=nope", ["workload", "nope"]),
    ],
)
def test_preflight_turns_hydra_errors_into_one_line_exit_2(override, fragments, capsys):
    with pytest.raises(SystemExit) as exit_info:
        preflight([override])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    for fragment in fragments:
        assert fragment in err


@pytest.mark.parametrize(
    "override,line",
    [
        ("workload=llama2_7b_decod", "workload=llama2_7b_decod: no such workload preset (did you mean llama2_7b_decode?); choose from "),
        ("strategy=cudagraph", "strategy=cudagraph: no such strategy preset (did you mean cuda_graph?); choose from acl_graph, async, cuda_graph,"),
        ("workload.batchsize=8", "workload.batchsize=8: no such key (did you mean workload.batch_size?)"),
        ("wrkload=deepseek_v3", "wrkload=deepseek_v3: no such key (did you mean workload?)"),
        ("workload.steps=1e9", "workload.steps=1e9: must be an integer"),
        ("hardware.device.hbm_gb=lots", "hardware.device.hbm_gb=lots: must be a number"),
        ("strategy.tiling_cache=maybe", "strategy.tiling_cache=maybe: must be true or false"),
        ("strategy.graph.mode=sinc", "strategy.graph.mode=sinc: must be one of none, sink, capture (did you mean sink?)"),
        # ~150 experiments: the closest few and where the rest are, not a line of 4,900 characters listing them all.
        ("+experiment=a2_llama_host", "experiment=a2_llama_host: no such experiment preset; the closest: a2_llama2_host, "),
        ("+experiment=h100_vllm_eager", "experiment=h100_vllm_eager: no such experiment preset; the closest: h100_vllm_llama2_eager_bs1, "),
        ("+experiment=null", "experiment=null: a config group needs a preset, not null; 1"),
        # A value of the wrong shape, an interpolation that names nothing: OmegaConf's own words were printed.
        ("strategy=acl_graph strategy.graph.buckets=8", "strategy.graph.buckets=8: must be a list, e.g. [1,2,4,8]\n"),
        ("strategy.graph.buckets={a:1}", "strategy.graph.buckets={a:1}: must be a list, e.g. [1,2,4,8]\n"),
        ("strategy.graph.phases=decode", "strategy.graph.phases=decode: must be a list, e.g. [decode]\n"),
        ("strategy.heterogeneous=3", "strategy.heterogeneous=3: must be a list in brackets, e.g. [] or [A,B]\n"),
        ("strategy.graph=5", "strategy.graph=5: a group of keys (mode, buckets, phases, dynamic_fallback, …), not a value: set one, e.g. strategy.graph.mode=...\n"),
        ("strategy.graph=[1,2]", "strategy.graph=[1,2]: a group of keys (mode, buckets, phases, dynamic_fallback, …), not a value"),
        ("workload.card_overrides=3",
         "workload.card_overrides=3: must be a mapping, e.g. workload.card_overrides={NAME:VALUE}, or set one entry: +workload.card_overrides.NAME=VALUE\n"),
        ("workload.batch_size=${oops}", "workload.batch_size=${oops}: ${oops} names no key; ${KEY} takes a full key, e.g. ${workload.context_len}\n"),
        ("workload.batch_size=${workload.batchsize}", "workload.batch_size=${workload.batchsize}: ${workload.batchsize} names no key (did you mean ${workload.batch_size}?)\n"),
        ("workload.name=${oc.env:HOSTBOUND_NO_SUCH_VAR}",
         "workload.name=${oc.env:HOSTBOUND_NO_SUCH_VAR}: the environment variable HOSTBOUND_NO_SUCH_VAR is not set (a default: ${oc.env:HOSTBOUND_NO_SUCH_VAR,VALUE})\n"),
        ("workload.name=${env:HOME}", "workload.name=${env:HOME}: no resolver env (did you mean ${oc.env:...}?)\n"),
        ("workload.batch_size=${workload.name}", "workload.batch_size=${workload.name}: must be an integer\n"),
        ("+workload.batch_size=3", "+workload.batch_size=3: workload.batch_size is already set: write workload.batch_size=3 (+ adds a key the config lacks)\n"),
        ("workload.batch_size=${", "workload.batch_size=${: extraneous input '{' expecting <EOF>; close brackets, and quote"),
        # The override that fails, not the whole command line (it named the key twice, every other override once).
        ("workload.steps=4 workload.batch_size=[1", "workload.batch_size=[1: no viable alternative at input '[1'; close brackets, and quote"),
        # A group takes one preset: Hydra merged a list's presets, the last one winning, with no word.
        ("hardware=[a100,h100]", "hardware=[a100,h100]: one hardware preset a run; for a sweep over them write hardware=a100,h100 with -m\n"),
        ("hardware=h100 strategy=ge_sink", "strategy=ge_sink: runs on ascend hardware, hardware=h100 is cuda (graph capture/replay there: strategy=cuda_graph)"),
        ("strategy=cuda_graph", "strategy=cuda_graph: runs on cuda hardware, hardware=atlas_a2 is ascend (graph capture/replay there: strategy=acl_graph)"),
        ("hardware=a2", "hardware=a2: no such hardware preset (did you mean atlas_a2?); choose from a100, atlas_a2,"),
        ("model=llama", "model=llama: no such key; the config groups are engine, hardware, strategy, workload (e.g. workload=llama2_7b_decode), and +experiment=NAME"),
        # A mapping's new entry without + (Hydra: "Could not override …; To append … use +…; Key … is not in struct").
        ("workload.card_overrides.layer_overhead_us=5",
         "workload.card_overrides.layer_overhead_us=5: workload.card_overrides has no such entry yet; add it with +workload.card_overrides.layer_overhead_us=5\n"),
        # A group takes one preset: no "write a list" (which the next check refuses).
        ("seed=1 strategy=eager,async", "strategy=eager,async: several values make a sweep: add -m (python -m harness -m seed=1 strategy=eager,async)\n"),
        ("workload.batch_size=1,2", "workload.batch_size=1,2: several values make a sweep: add -m (python -m harness -m workload.batch_size=1,2); for a list write workload.batch_size=[...]"),
        # MLflow 3.17 refuses to log to a folder: refused before the run, not after it (exit 3).
        ("tracking.uri=file:/srv/runs", "tracking.uri=file:/srv/runs: a folder store, which MLflow 3 no longer writes to"),
        ("tracking.uri=/srv/runs", "tracking.uri=/srv/runs: a folder store, which MLflow 3 no longer writes to"),
        # A sqlite store that is a folder: MLflow would retry it for minutes, past tracking.timeout_s.
        ("tracking.uri=sqlite:////tmp", "tracking.uri=sqlite:////tmp: names a folder: a sqlite store is a file, e.g. sqlite:///PATH/mlflow.db"),
        ("tracking.uri=ftp://host/x", "tracking.uri=ftp://host/x: unknown scheme 'ftp' (use sqlite:///PATH, http(s)://HOST:PORT, postgresql://…, mysql://…)"),
        # Hydra takes a long key for a config group's file name: too long for the file system.
        ("workload." + "x" * 260 + "=1", "workload." + "x" * 51 + "… (269 characters): no such key"),
        # `+` adds a key the schema lacks: it was dropped and the run went on (batch 1).
        ("+workload.batchsize=64", "workload.batchsize=64: no such key (did you mean workload.batch_size?)"),
        ("+hardware.device.ai_core=4", "hardware.device.ai_core=4: no such key (did you mean hardware.device.ai_cores?)"),
        # A leaf like no key beside it: the keys that are there, not the parent's own name (it said "did you mean engine?").
        ("engine=vllm_v1 +engine.x=1", "engine.x=1: no such key; engine has "),
        ("-m +workload.batchsize=1,2", "workload.batchsize=1: no such key (did you mean workload.batch_size?)"),
        # A group given null or nothing: Hydra named neither, or listed its whole search path.
        ("workload=null", "workload=null: a config group needs a preset, not null; choose from deepseek_v3, "),
        ("hardware=null", "hardware=null: a config group needs a preset, not null; choose from a100, atlas_a2,"),
        ("hardware=", "hardware=: names no hardware preset; choose from a100, atlas_a2,"),
        # A bad item of a sweep is named, not the whole list.
        ("-m workload.batch_size=1,abc", "workload.batch_size=abc: must be an integer"),
        # One parent run, one experiment: a sweep of tracking.* put the parent in the first one only.
        ("-m tracking.experiment=expA,expB", "tracking.experiment=expA,expB: tracking.* says where a sweep's runs go"),
        # The basic sweeper has no values for an interval: Hydra's traceback came after the folder was made.
        ("-m workload.batch_size=interval(1,4)",
         "workload.batch_size=interval(1,4): an interval needs an optimising sweeper (hydra/sweeper=optuna); list the values"),
        # Two jobs in one folder overwrote each other: 4 jobs, 2 rows in results.csv, exit 0.
        ("-m hydra.sweep.subdir=${hydra.runtime.choices.strategy} strategy=eager,async workload.batch_size=1,8",
         "hydra.sweep.subdir=${hydra.runtime.choices.strategy}: jobs 0 (strategy=eager workload.batch_size=1) and 1"
         " (strategy=eager workload.batch_size=8) both resolve to eager, where one would overwrite the other"),
    ],
)
def test_errors_say_what_was_written_and_what_was_meant(override, line, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        preflight(override.split())
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"hostbound: error: {line}")
    assert "$VALUE" not in err and "search path" not in err and "full_key" not in err and "hydra.cc" not in err
    assert len(err) < 300 or "choose from" in err  # a group of a few presets is listed whole
    assert list(tmp_path.iterdir()) == []  # refused before a run or sweep folder was made


def test_a_key_added_with_plus_is_checked_on_the_typed_fast_path():
    """`+key=value` puts a key the dataclass lacks into a config composed on run_schema; OmegaConf.to_object
    dropped it without a word. A free-form Dict field (card_overrides) takes any key still."""
    from omegaconf import OmegaConf

    from harness.config.compose import compose_config, to_run_config
    from harness.config.schema import RunConfig

    for override, line in [
        ("+workload.batchsize=64", "workload.batchsize=64: no such key (did you mean workload.batch_size?)"),
        ("+workload.serving.extra.a=1", "workload.serving.extra.a=1: no such key"),
        ("+seeds=3", "seeds=3: no such key (did you mean seed?)"),
    ]:
        cfg = compose_config([override])
        assert OmegaConf.get_type(cfg) is RunConfig  # the fast path
        with pytest.raises(ConfigError) as exc:
            to_run_config(cfg)
        assert str(exc.value).startswith(line), str(exc.value)
    run = to_run_config(compose_config(["+workload.card_overrides.num_hidden_layers=2"]))
    assert run.workload.card_overrides == {"num_hidden_layers": 2}


@pytest.mark.parametrize("subdir", ["${hydra.job.override_dirname}", "${hydra:runtime.choices.strategy}_${hydra.job.override_dirname}", "${hydra.job.num}_x"])
def test_a_sweep_subdir_that_differs_per_job_passes(subdir, capsys):
    preflight(["-m", f"hydra.sweep.subdir={subdir}", "strategy=eager,async", "workload.batch_size=1,8", "workload.steps=2"])
    assert capsys.readouterr().err == ""


def test_experiment_may_be_named_without_the_plus(capsys):
    from harness.cli.command import normalize_argv

    # Already prefixed and other keys stay as written.
    assert normalize_argv(["+experiment=x", "seed=1"]) == ["+experiment=x", "seed=1"]
    argv = normalize_argv(["-m", "experiment=a2_llama2_host,a2_qwen3_eager", "seed=1"])
    assert argv == ["-m", "+experiment=a2_llama2_host,a2_qwen3_eager", "seed=1"]
    preflight(argv)  # both experiments compose: returns
    assert capsys.readouterr().err == ""


def test_every_command_composes_experiment_without_the_plus(tmp_path, capsys):
    """harness.export_ops and harness.advise compose through compose_config: `experiment=x` stopped them
    ("not in the defaults list") where `python -m harness experiment=x` ran."""
    from harness.cli.export_ops import main as export_ops
    from harness.config.compose import compose_run

    assert compose_run(["experiment=a2_qwen3_b12_eager"]) == compose_run(["+experiment=a2_qwen3_b12_eager"])
    assert compose_run(["experiment=a2_qwen3_b12_eager"]).workload.batch_size == 12
    export_ops(["experiment=a2_qwen3_b12_eager", "workload.steps=1", "--out", str(tmp_path / "ops.csv")])
    err = capsys.readouterr().err
    assert "of qwen3_30b_decode to" in err and "experiment=a2_qwen3_b12_eager" in err.splitlines()[-1]
    assert (tmp_path / "ops.csv").stat().st_size > 0


def test_cuda_graph_is_acl_graph_by_its_gpu_name():
    """The same capture and replay; vLLM on CUDA writes the attention metadata before the replay, where
    vllm-ascend refreshes each layer's arguments after launching it."""
    from harness.sim.simulate import simulate_run

    cuda = simulate_run(compose_run("hardware=h100", "strategy=cuda_graph", "workload.steps=8")).summary
    acl = simulate_run(compose_run("hardware=h100", "strategy=acl_graph", "workload.steps=8", "strategy.graph.refresh_after_launch=false",
                                     "strategy.platform=cuda")).summary
    assert cuda["graph_captures"] == acl["graph_captures"] == 1
    assert cuda["step_ms_mean"] == acl["step_ms_mean"] and cuda["throughput_tok_s"] == acl["throughput_tok_s"]


def test_trace_workload_needs_a_path(capsys):
    with pytest.raises(SystemExit):
        preflight(["workload=trace"])
    assert "workload.path" in capsys.readouterr().err


def test_preflight_checks_every_value_of_a_sweep(capsys):
    with pytest.raises(SystemExit):
        preflight(["-m", "strategy=eager,async", "workload.batch_size=1,0"])
    assert "workload.batch_size=0" in capsys.readouterr().err
    preflight(["-m", "strategy=eager,async", "workload.batch_size=1,8"])  # all valid: returns


def test_override_variants_cover_each_sweep_value():
    variants = override_variants(["strategy=eager,async", "seed=3", "workload.batch_size=range(1,4)", "hydra.run.dir=x"])
    flat = {o for v in variants for o in v}
    assert {"strategy=eager", "strategy=async", "seed=3", "workload.batch_size=1", "workload.batch_size=3"} <= flat
    assert all("hydra.run.dir=x" not in v for v in variants)


def test_explicit_op_list_by_override():
    run = compose_run("workload.card=null", "workload.ops=[{name:a,kind:cube,flops:1e9},{name:b,device_us:3.0}]")
    assert [op.name for op in run.workload.ops] == ["a", "b"]
    assert run.workload.ops[1].device_us == 3.0


def test_flatten_keeps_dotted_keys():
    flat = flatten({"a": {"b": 1, "c": [1, 2]}, "d": [{"e": 1}]})
    assert flat == {"a.b": 1, "a.c": [1, 2], "d.0.e": 1}
    assert unflatten(flat) == {"a": {"b": 1, "c": [1, 2]}, "d": [{"e": 1}]}


def test_unflatten_gives_back_a_whole_config():
    """MLflow's resolved_config.yaml is unflatten(params): every value the run had, an op list as a list
    (an empty mapping, which flattens to nothing, aside)."""
    from omegaconf import OmegaConf

    run = compose_run("workload.card=null", "workload.ops=[{name:a,kind:cube,flops:1e9},{name:b,device_us:3.0}]", "seed=3")
    config = OmegaConf.to_container(OmegaConf.structured(run), resolve=True, enum_to_str=True)
    back = unflatten(flatten(config))
    assert back["workload"]["ops"][1]["device_us"] == 3.0 and back["seed"] == 3
    assert flatten(back) == flatten(config)


@pytest.mark.parametrize(
    "workload, start",
    [
        # Prefill steps do not grow: a billion of them would need ~40 TB of arrays.
        ("llama2_7b_prefill", "workload.steps=1000000000: needs about "),
        # Decode steps grow the KV cache a token each: HBM refuses first (tests/test_boundaries.py has the edge).
        ("llama2_7b_decode", "workload.steps=1000000000: the KV cache grows by a token a step, to 1,000,001,024 tokens"),
    ],
)
def test_a_run_too_large_for_memory_is_refused_before_anything_is_built(capsys, workload, start):
    # Refused from one-step builds, naming the key.
    with pytest.raises(SystemExit) as stopped:
        preflight([f"workload={workload}", "workload.steps=1000000000"])
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"hostbound: error: {start}") and "steps fit)" in line


def test_the_memory_limit_is_the_machines(monkeypatch):
    import harness.sim.simulate as run_module

    monkeypatch.setattr(run_module, "available_memory_bytes", lambda: 2e9)
    small = compose_run("workload=deepseek_v3", "workload.steps=32")
    ops_per_step = run_module.check_size(small).op_steps // 32
    big = compose_run("workload=deepseek_v3", "workload.steps=20000")
    fitting = int((2e9 - run_module.BASE_MEMORY_BYTES) / run_module.BYTES_PER_OP_STEP / ops_per_step)
    needed_gb = run_module.estimate_size(big, None, run_module.last_step(big)).memory_bytes / 1e9
    assert 5.5 < needed_gb < 7.0  # 0.8 GB + ~1,750 ops a step x 20,000 steps x 150 bytes (BYTES_PER_OP_STEP)
    expected = (f"workload.steps=20000: needs about {needed_gb:.1f} GB of memory ({ops_per_step} ops/step × 20000 steps),"
                f" 2.0 GB available (about {fitting:,} steps fit)")
    with pytest.raises(ConfigError) as refused:
        run_module.check_size(big)
    assert str(refused.value) == expected


def test_the_memory_estimate_covers_the_arrays_a_run_builds():
    import numpy as np

    from harness.sim.simulate import BYTES_PER_OP_STEP, estimate_size
    from harness.model.workload import build_workload, run_build_options

    for preset in ("llama2_7b_decode", "deepseek_v3", "qwen3_30b_prefill"):
        run = compose_run(f"workload={preset}", "workload.steps=64")
        built = build_workload(run.workload, devices_per_node=run.hardware.link.devices_per_node, **run_build_options(run))
        array_bytes = sum(v.nbytes for v in vars(built).values() if isinstance(v, np.ndarray))
        estimate = estimate_size(run)
        assert estimate.op_steps == built.n_ops * 64
        assert array_bytes < BYTES_PER_OP_STEP * estimate.op_steps


@pytest.mark.parametrize("group", ["hardware", "workload", "strategy", "engine", "experiment"])
def test_the_typed_fast_path_builds_the_same_run_as_merging_into_the_schema(group):
    """to_run_config instantiates a config composed on run_schema directly (~30× faster, for sweeps);
    merging its plain values into a fresh schema, the general path, must give the same RunConfig and
    refuse the same values."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from harness.config.compose import to_run_config
    from harness.config.schema import RunConfig

    def both(overrides):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
        assert OmegaConf.get_type(cfg) is RunConfig  # the fast path applies
        untyped = OmegaConf.create(OmegaConf.to_container(cfg))
        results = []
        for config in (cfg, untyped):
            try:
                results.append(to_run_config(config))
            except ConfigError as exc:
                results.append(str(exc))
        return results

    prefix = "+" if group == "experiment" else ""
    for option in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
        fast, general = both([f"{prefix}{group}={option}"])
        assert fast == general, option
    fast, general = both(["workload.steps=4", "workload.warmup_steps=9"])
    assert fast == general == "workload.warmup_steps=9: must be < workload.steps=4"


# Ranges written down here, not read from harness.config.limits.LIMITS: a wrong limit there (a fraction allowed
# above 1, a capacity allowed at 0) would otherwise pass the tests that derive their cases from it.
PHYSICAL_EDGES = [
    # (key, the last value that makes sense, the first that does not)
    ("workload.batch_size", 1, 0),
    ("workload.batch_size", 1048576, 1048577),
    ("workload.warmup_steps", 0, -1),
    ("workload.ep", 0, -1),  # 0: every device
    ("hardware.host.threads", 1, 0),
    ("hardware.host.framework_us", 0, -0.001),
    ("hardware.host.jitter_cv", 0, -0.01),
    ("hardware.host.stream_pool_speedup", 0.999, 1.0),  # a pool cannot make alloc and free free
    ("hardware.device.ai_cores", 1, 0),
    ("hardware.device.matmul_efficiency", 1.0, 1.001),
    ("hardware.device.hbm_efficiency", 1.0, 1.001),
    ("hardware.device.hbm_efficiency", 0.001, 0),
    ("hardware.link.devices_per_node", 1, 0),
    ("hardware.graph.max_graphs", 1, 0),
    ("strategy.queue_capacity", 1, 0),
    ("strategy.tiling_cache_entries", 1, 0),
    ("strategy.fusion_max_ops", 1, 0),
    ("strategy.kv_block", 1, 0),
    ("strategy.graph.buckets", "[1]", "[0]"),
]


@pytest.mark.parametrize("key, fine, refused", PHYSICAL_EDGES, ids=[f"{k}={r}" for k, _, r in PHYSICAL_EDGES])
def test_physical_edges_of_the_ranges(key, fine, refused):
    compose_run(f"{key}={fine}")
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}(\[0\])?=\S+: must "):
        compose_run(f"{key}={refused}")


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("http://alice:s3cret@mlflow-host:5000", "http://alice:***@mlflow-host:5000"),
        ("postgresql+psycopg2://mlflow:s3cret@db:5432/mlflow", "postgresql+psycopg2://mlflow:***@db:5432/mlflow"),
    ],
)
def test_a_tracking_uri_with_a_password_is_refused_without_showing_it(uri, shown, tmp_path, capsys):
    """summary.json, .hydra/, the logs and MLflow's params would all keep it: refused before anything is
    written, naming MLflow's own variables for credentials."""
    with pytest.raises(SystemExit) as stopped:
        preflight([f"tracking.uri={uri}"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hostbound: error: tracking.uri='{shown}': holds a user name and password") and err.count("\n") == 1
    assert "s3cret" not in err and "MLFLOW_TRACKING_PASSWORD" in err
    assert list(tmp_path.iterdir()) == []


def test_a_tracking_uri_without_a_password_is_taken():
    assert compose_run("tracking.uri=http://alice@mlflow-host:5000").tracking.uri == "http://alice@mlflow-host:5000"


def test_an_error_names_the_value_hydra_took_when_a_key_is_written_twice():
    """Hydra takes a key's last value: the one-line error must quote that one, not the first."""
    from harness.config.messages import _written

    assert _written("workload.phase", ["workload.phase=decode", "workload.phase=prefil"], "?") == "workload.phase=prefil"
    assert _written("workload.batch_size", ["+workload.batch_size=2"], "?") == "workload.batch_size=2"
    assert _written("seed", [], "7") == "seed=7"


def test_an_experiments_recorded_keys_are_those_of_the_file_hydra_runs(tmp_path, monkeypatch):
    """A launch folder's conf/ comes after the shipped presets in Hydra's search path: an experiment file
    there named as a shipped one is not the one that runs, so its keys are not the ones recorded."""
    from harness.config.compose import experiment_keys

    shipped = experiment_keys("a2_llama2_sink")
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "a2_llama2_sink.yaml").write_text("# @package _global_\nhardware:\n  host:\n    threads: 3\n")
    monkeypatch.chdir(tmp_path)
    assert experiment_keys("a2_llama2_sink") == shipped and "hardware.host.threads" not in shipped


@pytest.mark.parametrize("override", ["workload.serving.enabled=2", "strategy.fusion=-1", "tracking.enabled=7", "strategy.tiling_cache='2'"])
def test_a_switch_set_to_a_number_other_than_0_or_1_is_refused(override, capsys):
    """OmegaConf reads any integer as a switch: serving.enabled=2 ran a serving run. Every way in refuses it
    in one line: the command line (preflight), compose_run (export_ops, profile), the advisor's candidates."""
    from harness.advisor.candidates import make_run
    from harness.config.compose import compose_run

    expected = f"{override}: must be true or false"
    with pytest.raises(SystemExit):
        preflight([override])
    assert capsys.readouterr().err.strip() == f"hostbound: error: {expected}"
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        compose_run([override])
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        make_run(["hardware=h100", override])
    for written in ("true", "off", "1", "0", "yes"):  # OmegaConf's words stay
        compose_run([f"{override.split('=')[0]}={written}"])


def test_one_source_of_ops_a_run():
    """workload.path beside the default card ran the card, the header naming the file ("path=ok.csv");
    an op list beside a card or a path was read by nobody. Refused in one line naming what runs instead."""
    from pathlib import Path

    from harness.config.compose import compose_run

    csv = str(Path(__file__).parent / "data" / "tiny_ops.csv")
    with pytest.raises(ConfigError, match=rf"^workload.path={re.escape(csv)}: not read while workload.card=llama2_7b is set: workload=trace"):
        compose_run([f"workload.path={csv}"])
    with pytest.raises(ConfigError, match=r"^workload.card=llama2_7b: is read instead of workload.ops: set workload.card=null"):
        compose_run(["workload.ops=[{name:a,device_us:2}]"])
    with pytest.raises(ConfigError, match=r"is read instead of workload.ops: give one of them$"):
        compose_run(["workload=trace", f"workload.path={csv}", "workload.ops=[{name:a,device_us:2}]"])
    assert compose_run(["workload=trace", f"workload.path={csv}"]).workload.path == csv
    assert len(compose_run(["workload.card=null", "workload.ops=[{name:a,device_us:2}]"]).workload.ops) == 1


@pytest.mark.parametrize("argv, said", [
    (["--cfg", "job", "workload.batch_size=0"], "workload.batch_size=0: must be in 1..1048576 sequences"),
    (["-c", "job", "--resolve", "strategy=cudagraph"], "strategy=cudagraph: no such strategy preset (did you mean cuda_graph?)"),
    (["--cfg", "job", "-p", "workload", "workload.bach_size=1"], "workload.bach_size=1: no such key (did you mean workload.batch_size?)"),
])
def test_printing_the_config_checks_its_overrides_as_a_run(argv, said, capsys):
    """`python -m harness --cfg job` (a README command) printed the config of a batch of 0 and exited 0, and
    an unknown preset took Hydra's many lines: its overrides are checked as a run's."""
    with pytest.raises(SystemExit):
        preflight(argv)
    assert capsys.readouterr().err.startswith(f"hostbound: error: {said}")
    preflight(["--cfg", "job", "workload.batch_size=4"])  # a good one is printed, not refused
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("overrides, named", [
    (("workload.repeat=2",), "workload.repeat=2: plays an op-list file's steps again"),
    (("workload.ops=[{name: a, kind: cube, flops: 1e9}]", "workload.card=null", "workload.repeat=3"), "workload.repeat=3:"),
    (("workload.kv_cache=dynamic",), "workload.kv_cache=dynamic: is how a card's unfused"),
    (("workload.ops=[{name: a, kind: cube, flops: 1e9}]", "workload.card=null", "workload.kernels=unfused", "workload.kv_cache=static"),
     "workload.kv_cache=static:"),
])
def test_a_value_read_by_nothing_on_this_run_is_refused_naming_it(overrides, named):
    """workload.repeat replays an op-list file and workload.kv_cache prices a card's unfused cache update; on
    any other run they changed nothing and the run went on as if they had not been given."""
    with pytest.raises(ConfigError) as refused:
        compose_run(*overrides)
    assert str(refused.value).startswith(named) and "\n" not in str(refused.value)
    compose_run("workload.kernels=unfused", "workload.kv_cache=static")  # where it is read, it is taken


@pytest.mark.parametrize("override, split", [
    ("workload.steps=4", ("workload.steps", "=", "4")),
    ("+workload.card_overrides.x=a=b", ("workload.card_overrides.x", "=", "a=b")),  # the first = splits
    ("++strategy.graph.mode=sink", ("strategy.graph.mode", "=", "sink")),
    ("~tracking.uri", ("tracking.uri", "", "")),
])
def test_an_override_is_read_without_hydras_prefix(override, split):
    from harness.base.overrides import override_key, split_override

    assert split_override(override) == split and override_key(override) == split[0]


def test_an_op_list_run_over_a_card_preset_is_not_named_after_the_card():
    """`workload.card=null` with an op list (docs/configuration.md's example) ran over the default preset
    and kept its name, llama2_7b_decode, in the header, summary.json, reports and MLflow: an op list is
    `ops`, a file `trace` (as workload=trace names it), and a name the user gives stays."""
    ops = "workload.ops=[{name: a, device_us: 2}]"
    assert compose_run("workload.card=null", ops).workload.name == "ops"
    assert compose_run("workload=qwen3_8b_decode", "workload.card=null", ops).workload.name == "ops"
    assert compose_run("workload.card=null", ops, "workload.name=my_list").workload.name == "my_list"
    assert compose_run().workload.name == "llama2_7b_decode"


@pytest.mark.parametrize("argv", [
    ["hardware.device.hbm_gb=8", "workload=deepseek_v3"],  # refused once built: it does not fit
    ["strategy=acl_graph", "strategy.graph.splitting_ops=[foo]"],
    ["--cfg", "job"],  # printed, not run
])
def test_a_run_refused_when_built_or_a_printed_config_writes_no_folder(argv, tmp_path, monkeypatch, capsys):
    """The output folder's check came before the build: a run refused there left outputs/runs/<date>/
    (the probe keeps the parents it makes, which runs started together share), and so did --cfg job."""
    monkeypatch.chdir(tmp_path)
    try:
        preflight(argv)
    except SystemExit as stopped:
        assert stopped.code == 2 and capsys.readouterr().err.startswith("hostbound: error: ")
    assert list(tmp_path.iterdir()) == []
