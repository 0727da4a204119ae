"""Composition: register the schema with Hydra, compose a RunConfig from conf/ (as `python -m harness`
would), and turn a composed config into checked dataclasses."""
from __future__ import annotations

import os
import time
import warnings

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, OmegaConf

from harness.base.errors import ConfigError
from harness.base.stopping import held, raise_if_stopped
from harness.config.messages import one_line
from harness.config.paths import CONF_DIR, launch_folder_conf
from harness.config.schema import RunConfig, flatten


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


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Hydra's composition of conf/ with `overrides`, as `python -m harness` makes it (values not yet checked)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def compose_run(overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """The RunConfig `python -m harness <overrides>` would run (composed from conf/, values checked)."""
    with held():  # a stop raised inside OmegaConf left its nodes broken: the next call failed with AttributeError
        run = to_run_config(compose_config(overrides))
    raise_if_stopped()
    return run


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Turn a composed config into dataclasses, running every value check (raises ConfigError)."""
    if OmegaConf.get_type(cfg) is RunConfig and "hydra" not in cfg:
        # Composed on run_schema (conf/config.yaml's first default): already typed and key-checked, so
        # instantiating it runs the same checks ~30× faster than merging into a fresh schema (a sweep's jobs
        # paid ~70 ms each for that).
        try:
            run = OmegaConf.to_object(cfg)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(one_line(exc)) from exc
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
        raise ConfigError(one_line(exc)) from exc
    assert isinstance(run, RunConfig)
    return run


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
