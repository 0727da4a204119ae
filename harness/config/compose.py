"""Composition: register the schema with Hydra, compose a RunConfig from conf/ (as `python -m harness`
would), and turn a composed config into checked dataclasses."""
from __future__ import annotations

import dataclasses
import functools
import os
import time
import warnings

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, ListConfig, OmegaConf

from harness.base.errors import ConfigError
from harness.base.stopping import held, raise_if_stopped
from harness.config.messages import no_such_key, not_a_run_key, not_a_switch, one_line
from harness.config.paths import CONF_DIR, launch_folder_conf
from harness.config.schema import RunConfig, StrategyConfig, flatten


_PROCESS_ID = f"{os.getpid()}{time.time_ns() // 1000 % 1000:03d}"  # unique among processes started together


class LaunchFolderConfigs(SearchPathPlugin):
    """The launch folder's own conf/ (a machine fitted by `python -m harness.profile TRACE --fit NAME`
    writes conf/hardware/NAME.yaml there), searched after the shipped presets: `hardware=NAME` finds it
    wherever the command starts."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        folder = launch_folder_conf()
        if folder is not None:
            search_path.append("hostbound-launch-folder", f"file://{folder}")


def register_configs() -> None:
    """Register the schema so conf/config.yaml's defaults list starts from `run_schema`, the
    `hostbound_id` resolver that makes run and sweep folders unique (two runs started in the same second
    used to share one), and the launch folder's conf/ in the search path."""
    Plugins.instance().register(LaunchFolderConfigs)
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    if not OmegaConf.has_resolver("hostbound_id"):
        OmegaConf.register_new_resolver("hostbound_id", lambda: _PROCESS_ID)
    # conf/hydra/launcher/ray.yaml replaces hydra-ray-launcher's preset of that name on purpose (it says
    # why); Hydra then checks it against the plugin's schema, as wanted, and warns that it does so.
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/ray' is validated against ConfigStore schema", category=UserWarning)


# Groups not in conf/config.yaml's defaults list that may be named without Hydra's `+`
# (lightning-hydra-template's convention: `experiment=name`).
OPTIONAL_GROUPS = ("experiment",)


def with_optional_groups_added(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """`experiment=x` → `+experiment=x`, so every command takes the README's spelling as well as Hydra's
    (`python -m harness.export_ops experiment=x` and `harness.advise` refused it where `python -m harness`
    ran it)."""
    return [f"+{o}" if o.split("=", 1)[0] in OPTIONAL_GROUPS and "=" in o else o for o in overrides]


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Hydra's composition of conf/ with `overrides`, as `python -m harness` makes it (values not yet checked)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    refused = not_a_run_key(overrides) or not_a_switch(overrides)
    if refused:
        raise ConfigError(refused)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=with_optional_groups_added(overrides))


def compose_run(overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """The RunConfig `python -m harness <overrides>` would run (composed from conf/, values checked)."""
    with held():  # a stop raised inside OmegaConf left its nodes broken: the next call failed with AttributeError
        run = to_run_config(compose_config(overrides))
    raise_if_stopped()
    return run


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Turn a composed config into dataclasses, running every value check (raises ConfigError)."""
    if OmegaConf.get_type(cfg) is RunConfig and "hydra" not in cfg:
        # Composed on run_schema (conf/config.yaml's first default): already typed, so instantiating it runs
        # the same checks ~30× faster than merging into a fresh schema (a sweep's jobs paid ~70 ms each for
        # that). But not key-checked: Hydra's `+key=value` adds a key the dataclass lacks, and to_object
        # drops it without a word (`+workload.batchsize=64` ran batch 1), so the keys are checked here.
        extra = _first_unknown_key(cfg)
        if extra is not None:
            key, value, unknown = extra
            raise ConfigError(no_such_key(key, value, unknown=unknown))
        try:
            run = OmegaConf.to_object(cfg)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(one_line(exc, _as_written(cfg, exc))) from exc
        assert isinstance(run, RunConfig)
        return run
    plain = OmegaConf.to_container(cfg, resolve=True)
    if isinstance(plain, dict):
        plain.pop("hydra", None)
    schema = OmegaConf.structured(RunConfig)
    try:
        merged = OmegaConf.merge(schema, plain)
        run = OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except Exception as exc:  # OmegaConf validation: unknown key or wrong type
        raise ConfigError(one_line(exc, _as_written(cfg, exc))) from exc
    assert isinstance(run, RunConfig)
    return run


def _as_written(cfg: DictConfig, exc: BaseException) -> list[str]:
    """The key an OmegaConf error names, as `key=value` with its value unresolved (`${foo:bar}`), for
    the one-line message: resolving it is what failed, and its resolved value is not what was written."""
    current: BaseException | None = exc
    while current is not None:
        key = getattr(current, "full_key", None)
        if isinstance(key, str) and key and "[" not in key:
            node: object = cfg
            for part in key.split("."):
                node = node._get_node(part) if isinstance(node, DictConfig) and part in node else None  # type: ignore[union-attr]
            if node is not None and not isinstance(node, (DictConfig, ListConfig)):
                return [f"{key}={node._value()}"]  # type: ignore[union-attr]
            return []
        current = current.__cause__ or current.__context__
    return []


@functools.lru_cache(maxsize=None)
def _field_names(schema: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(schema))


def _first_unknown_key(node: object, prefix: str = "") -> tuple[str, object, str] | None:
    """The first key of a typed config that its dataclass has no field for, as (dotted key down to its
    value, the value, the key the schema lacks), else None. Free-form Dict fields (workload.card_overrides)
    are typed dict, not a dataclass: any key goes. Only the nodes are read (no interpolation resolved):
    ~0.7 ms for a whole RunConfig."""
    if isinstance(node, DictConfig):
        schema = OmegaConf.get_type(node)
        fields = _field_names(schema) if dataclasses.is_dataclass(schema) else None
        for key in node.keys():
            child = node._get_node(key)
            if fields is not None and key not in fields:
                return (*_first_leaf(child, f"{prefix}{key}"), f"{prefix}{key}")
            if isinstance(child, (DictConfig, ListConfig)):
                found = _first_unknown_key(child, f"{prefix}{key}.")
                if found is not None:
                    return found
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            found = _first_unknown_key(node._get_node(i), f"{prefix}{i}.")
            if found is not None:
                return found
    return None


def _first_leaf(node: object, key: str) -> tuple[str, object]:
    """`+workload.extra.a=1` adds a dict: named by its first value, as it was written (workload.extra.a=1)."""
    while isinstance(node, DictConfig) and len(node) > 0:
        first = next(iter(node.keys()))
        key, node = f"{key}.{first}", node._get_node(first)
    value = OmegaConf.to_container(node) if isinstance(node, (DictConfig, ListConfig)) else node._value()  # type: ignore[union-attr]
    return key, value


def experiment_keys(name: str) -> set[str]:
    """The config keys an experiment preset sets (those of the presets it builds on included; its group
    choices, `override /workload: …`, are named by the run anyway), so that what it changed is recorded
    beside what the command line changed: three experiments that differ only in their engine keys had
    logged the same params. The shipped presets first, as Hydra's search path finds them (the launch
    folder's conf/ comes after them, and a file of the same name there is not the one that runs)."""
    folders = [f for f in (CONF_DIR, launch_folder_conf()) if f is not None]
    keys: set[str] = set()
    pending, seen = [name], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        path = next((f / "experiment" / f"{current}.yaml" for f in folders if (f / "experiment" / f"{current}.yaml").is_file()), None)
        if path is None:
            continue
        content = OmegaConf.to_container(OmegaConf.load(path)) or {}
        for entry in content.pop("defaults", None) or []:
            if isinstance(entry, str) and entry != "_self_":
                pending.append(entry)  # another experiment this one builds on
        keys.update(flatten(content))
    return keys


@functools.cache
def plain_strategy_params() -> dict[str, object]:
    """strategy.* of `strategy=eager` with no switch changed, flattened as a run's params are: its preset
    over the schema's defaults (eager.yaml has no defaults list of its own), read without Hydra, whose app
    is running where a sweep's end or a job asks."""
    merged = OmegaConf.merge(OmegaConf.structured(StrategyConfig), OmegaConf.load(CONF_DIR / "strategy" / "eager.yaml"))
    return flatten({"strategy": OmegaConf.to_container(merged, resolve=True, enum_to_str=True)})
