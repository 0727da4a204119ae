"""The candidates of an advice: every combination of the search space's values as overrides on top of
the user's run, each made into a RunConfig fast (Hydra composes once per combination of presets; the
other keys are merged onto that composition and checked as any run's are), and the limits a candidate
must meet before it is worth simulating.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import typing
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from harness.base.errors import ConfigError, HarnessError
from harness.base.stopping import held, raise_if_stopped
from harness.config.advise import AdviseConfig
from harness.config.compose import compose_config, compose_run, to_run_config
from harness.config.limits import LIMITS, check_number
from harness.config.messages import group_options, not_a_switch, one_line
from harness.config.paths import CONF_DIR, launch_folder_conf
from harness.config.schema import MAX_GRAPH_SIZES, GraphMode, RunConfig
from harness.model.workload import build_workload, run_build_options
from harness.sim.policies import MIB, asked_sizes, graph_budget, kept_sizes, layer_count, trim_note
from harness.sim.simulate import last_step


RUNS_AS = "runs as "  # how a rejection starts when another candidate runs the same thing


@dataclass(eq=False)  # one candidate is itself: comparing field by field (its RunConfig, its summary) was slow and meant nothing
class Candidate:
    overrides: list[str]  # the space's values, as `key=value`
    run: RunConfig | None = None
    rejected: str = ""  # why it was not simulated (or did not meet a limit once simulated)
    pruned: str = ""  # why a shorter rung did not keep it (ranked below the share advise.keep keeps)
    note: str = ""  # what the run does differently from what the candidate asks (capture sizes trimmed to the budget)
    graphs: int = 0  # capture sizes it captures
    graph_mem_gb: float = 0.0
    capture_s: float = 0.0
    memory_gb: float = 0.0  # weights + KV cache + workspace + graphs of one rank, at its largest batch
    summary: dict = field(default_factory=dict)  # of the longest rung it was simulated in
    steps: int = 0  # that rung's steps
    summaries: dict[int, dict] = field(default_factory=dict)  # every rung's: steps → summary (candidates compare at equal steps)

    @property
    def runs_as_another(self) -> bool:
        """Not simulated because another candidate runs the same (`same_run_key`): no limit broken."""
        return self.rejected.startswith(RUNS_AS)

    @property
    def label(self) -> str:
        return " ".join(short_override(o) for o in self.overrides)


def value_text(value: Any) -> str:
    """A space value as an override's value (lists as Hydra writes them: [1,2,4])."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(value_text(v) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def short_override(override: str) -> str:
    """`strategy.graph.buckets=[1,2,4,8,16]` → `buckets=[1..16](5)`: a capture-size list by its span and count."""
    key, _, value = override.partition("=")
    name = key.rsplit(".", 1)[-1]
    if value.startswith("[") and value.count(",") >= 4:
        items = value.strip("[]").split(",")
        return f"{name}=[{items[0]}..{items[-1]}]({len(items)})"
    return f"{name}={value}"


def combinations(space: dict[str, list[Any]]) -> list[list[str]]:
    """Every combination of the space's values, the first key varying slowest."""
    keys = list(space)
    return [[f"{k}={value_text(v)}" for k, v in zip(keys, values)] for values in itertools.product(*(space[k] for k in keys))]


_GROUPS = frozenset(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "advise"))


@lru_cache(maxsize=256)
def _composed(groups: tuple[str, ...], launch_conf: Path | None):
    """Hydra's composition of the run with these preset choices (the expensive part: ~0.2 s). Keyed by the
    launch folder's conf/ too: `hardware=NAME` of a machine fitted there is that folder's."""
    return compose_config(groups)


def make_run(overrides: list[str]) -> RunConfig:
    """The RunConfig `python -m harness <overrides>` would run: presets composed by Hydra (cached), the other
    keys merged onto it and every value checked. A key or preset Hydra refuses is a ConfigError in the
    words a run's refusal has ("workload.batchsize=3: no such key (did you mean ...)"), not a traceback."""
    refused = not_a_switch(overrides)  # the fast path below converts values without compose_config's check
    if refused:
        raise ConfigError(refused)
    with held():  # a stop raised inside OmegaConf leaves its nodes broken (see compose_run)
        try:
            run = _make_run(overrides)
        except HarnessError:
            raise
        except Exception as exc:  # Hydra's and OmegaConf's own errors
            raise ConfigError(one_line(exc, overrides)) from None
    raise_if_stopped()
    return run


@lru_cache(maxsize=256)
def _base_run(groups: tuple[str, ...], launch_conf: Path | None) -> RunConfig:
    """The RunConfig of a preset choice, shared by its candidates: never changed in place (candidates
    differ by `dataclasses.replace`)."""
    return to_run_config(_composed(groups, launch_conf))


def _make_run(overrides: list[str]) -> RunConfig:
    groups = tuple(o for o in overrides if o.lstrip("+").partition("=")[0] in _GROUPS)
    dotted = [o for o in overrides if o not in groups]
    if any(o.startswith(("+", "~")) for o in dotted):  # Hydra's own syntax: compose it all
        return compose_run(overrides)
    launch_conf = launch_folder_conf()
    try:
        base = _base_run(groups, launch_conf)
    except ConfigError:  # a preset valid only with keys given beside it (workload=trace needs workload.path)
        return compose_run(overrides)
    if not dotted:
        return base
    patched = _patched(base, dotted)
    if patched is not None:
        return patched
    try:
        merged = OmegaConf.merge(_composed(groups, launch_conf), OmegaConf.from_dotlist(dotted))
    except Exception:  # a key Hydra would refuse: let it say so, in its words
        return compose_run(overrides)
    return to_run_config(merged)


def _patched(run: RunConfig, dotted: list[str]) -> RunConfig | None:
    """`run` with `dotted` (`a.b.key=value`) applied by `dataclasses.replace` along each key's path: the value
    converted to its field's type by OmegaConf, every dataclass on the path checked again. Merging into a
    copy of the whole composition took ~25 ms a candidate, this ~1 ms. None when a key does not name a
    field holding a value, or a value (or an order of applying them) is refused: the caller then merges the
    whole config, so that the error is worded as any run's. The schema's checks never derive one field from
    another (they only refuse), so a replaced field leaves nothing stale behind."""
    try:
        for override in dotted:
            key, _, text = override.partition("=")
            *path, name = key.split(".")
            chain = [run]
            for part in path:
                chain.append(getattr(chain[-1], part))
            owner = chain[-1]
            if not dataclasses.is_dataclass(owner) or name not in _value_fields(type(owner)):
                return None
            value = OmegaConf.to_object(OmegaConf.merge(_value_fields(type(owner))[name], OmegaConf.from_dotlist([f"value={text}"])))
            changed = dataclasses.replace(owner, **{name: value.value})
            for parent, part in zip(reversed(chain[:-1]), reversed(path)):
                changed = dataclasses.replace(parent, **{part: changed})
            run = changed
    except Exception:
        return None
    return run


@lru_cache(maxsize=None)
def _value_fields(owner: type) -> dict[str, Any]:
    """The fields of dataclass `owner` that hold a value (not a dataclass), each as a one-field structured
    config of its type: merging a value into it converts and checks it as Hydra would."""
    hints = typing.get_type_hints(owner)
    return {
        f.name: OmegaConf.structured(dataclasses.make_dataclass("Value", [("value", hints[f.name])]))
        for f in dataclasses.fields(owner)
        if f.init and not (isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name]))
    }


def check_space(space: dict[str, list[Any]], base: list[str]) -> None:
    """Refuse, before any candidate is made, a key or value of the space that no configuration could take:
    a key no config has, a preset that does not exist, a value of the wrong type or outside its limits.
    One line naming advise.space and the override, in the words `python -m harness` has for it (a sweep
    refuses the same typo before its first job). A value refused only in combination with others (a
    strategy of another platform, memory, a TP that does not divide the heads) stays a candidate's
    rejection, with its reason."""
    for key, values in space.items():
        for value in values:
            override = f"{key}={value_text(value)}"
            if not _refused_by_any_run(override):
                continue
            try:
                make_run(base + [override])
            except ConfigError as exc:
                raise ConfigError(f"advise.space: {exc}") from None
            raise ConfigError(f"advise.space: {override}: no configuration takes this value")  # not reached: the run refuses it too


@lru_cache(maxsize=4096)
def _refused_by_any_run(override: str) -> bool:
    """Whether `key=value` is refused whatever else the run sets (see check_space). Keys Hydra adds or
    deletes (`+`, `~`) and keys inside a dict field (a card's overrides) are Hydra's and the card's to check."""
    key, _, text = override.partition("=")
    if key.startswith(("+", "~")):
        return False
    if key in _GROUPS:
        return text not in group_options(key)
    *path, name = key.split(".")
    owner: type = RunConfig
    for part in path:
        hint = _field_hints(owner).get(part)
        if hint is None:
            return True  # no such key
        inner = _section_type(hint)
        if inner is None:
            return typing.get_origin(hint) is not dict  # a dict takes any key; a value has no keys under it
        owner = inner
    hint = _field_hints(owner).get(name)
    if hint is None:
        return True
    if _section_type(hint) is not None or typing.get_origin(hint) is dict or name not in _value_fields(owner):
        return False  # a whole section or dict: composed and checked with the run
    try:
        value = OmegaConf.to_object(OmegaConf.merge(_value_fields(owner)[name], OmegaConf.from_dotlist([f"value={text}"]))).value
    except Exception:  # of the wrong type (or not one of an enum's values)
        return True
    if key == "strategy.graph.buckets" and not 0 < len(value) <= MAX_GRAPH_SIZES:
        return True  # a graph run lists 1 to MAX_GRAPH_SIZES sizes, whatever else it sets
    limit = LIMITS.get(key)
    if limit is None:
        return False
    try:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None:
                check_number(key, item, limit)
    except ConfigError:
        return True
    return False


@lru_cache(maxsize=None)
def _field_hints(owner: type) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(owner)}
    return {name: hint for name, hint in typing.get_type_hints(owner).items() if name in names}


def _section_type(hint: Any) -> type | None:
    """The dataclass a field holds (Optional[...] unwrapped), else None."""
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def same_run_key(run: RunConfig) -> str:
    """Candidates with equal keys simulate the same thing: the config, less the capture sizes of a run that
    captures no graphs and pads no batches (an eager candidate of each size list). The dataclasses' own
    repr: building an OmegaConf tree of the run for it took ~40 ms a candidate."""
    parts = {f.name: getattr(run, f.name) for f in dataclasses.fields(run)}
    if not graph_sizes(run) and not run.strategy.shape_buckets:
        graph = copy.copy(run.strategy.graph)  # copies: the run's own sections are shared with other candidates
        graph.buckets = []
        parts["strategy"] = copy.copy(run.strategy)
        parts["strategy"].graph = graph
    return repr(parts)


def with_steps(run: RunConfig, steps: int) -> RunConfig:
    return dataclasses.replace(run, workload=dataclasses.replace(run.workload, steps=steps, warmup_steps=0))


def graph_sizes(run: RunConfig, max_graphs: int | None = None) -> list[int]:
    """The capture sizes a candidate captures (none when its strategy replays no graphs in its phase): those
    it asks for (a serving run's, those its start-up captures), and under the platform's budget
    (`max_graphs`) those its run keeps (`kept_sizes`)."""
    graph = run.strategy.graph
    if graph.mode != GraphMode.capture or run.workload.phase not in graph.phases:
        return []
    serving = run.workload.serving
    max_batch = serving.max_batch if serving.enabled else None
    engine = run.engine if run.engine is not None and run.engine.active else None
    return asked_sizes(list(graph.buckets), max_batch, engine) if max_graphs is None else kept_sizes(list(graph.buckets), max_graphs, max_batch, engine)


def largest_batch(run: RunConfig) -> int:
    serving = run.workload.serving
    return serving.max_batch if serving.enabled else run.workload.batch_size


def check_limits_before(candidate: Candidate, advise: AdviseConfig) -> None:
    """Fill the candidate's graph and memory figures and set `rejected` to the first limit it breaks:
    the platform's graph (stream) budget, the largest batch above the largest capture size (it would
    run eagerly), start-up capture time, device memory (weights, KV cache at the last step, workspace,
    graphs)."""
    run = candidate.run
    assert run is not None
    costs = run.hardware.graph
    batch = largest_batch(run)
    serving = run.workload.serving
    try:  # the step that holds the most: the last of the longest rung (its KV cache longest), a serving run's at max_batch sequences
        workload = last_step(with_steps(run, max(advise.steps))) if not serving.enabled else build_workload(
            dataclasses.replace(run.workload, steps=1, warmup_steps=0), devices_per_node=run.hardware.link.devices_per_node,
            batch=np.array([batch]), kv_len=np.array([float(serving.prompt_len_mean + serving.output_len_mean)]),
            **run_build_options(run),
        )
    except HarnessError as exc:
        candidate.rejected = str(exc)
        return
    # The sizes the run keeps: a list longer than the stream budget is trimmed as vllm-ascend trims it, and
    # the candidate runs (and is charged for) what is kept; the note says so.
    layers = layer_count(workload)
    budget = graph_budget(costs, layers, run.workload)
    sizes = graph_sizes(run, budget)
    candidate.note = trim_note(graph_sizes(run), sizes, costs, layers, run.workload) if sizes else ""
    candidate.graphs = len(sizes)
    candidate.graph_mem_gb = len(sizes) * costs.graph_mem_mib * MIB / 1e9
    candidate.capture_s = len(sizes) * costs.capture_ms / 1e3
    memory = workload.memory
    memory.graphs_gb = candidate.graph_mem_gb
    candidate.memory_gb = memory.total_gb
    hbm_gb = min(run.hardware.device.hbm_gb, advise.hbm_gb_max or float("inf"))
    if sizes and batch > sizes[-1]:
        candidate.rejected = f"batch {batch} above the largest capture size {sizes[-1]}: its decode steps would run eagerly"
        return
    if advise.capture_s_max is not None and candidate.capture_s > advise.capture_s_max:
        candidate.rejected = f"capturing {len(sizes)} graphs takes {candidate.capture_s:.1f} s > advise.capture_s_max={advise.capture_s_max:g}"
        return
    if candidate.memory_gb > hbm_gb:
        candidate.rejected = (
            f"needs {candidate.memory_gb:.6g} GB a device (weights {memory.weights_gb:.1f} + KV cache {memory.kv_cache_gb:.1f}"
            f" + workspace {memory.workspace_gb:.1f} + graphs {candidate.graph_mem_gb:.1f}) > {hbm_gb:g} GB"
        )
