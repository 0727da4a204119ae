"""Composing a sweep's jobs from a cache: the same config Hydra composes, in a tenth of the time.

Hydra composes every job of a multirun from scratch: it parses the YAML files again, builds the defaults
tree and merges it (~0.1 s a job here, more than a simulation). But a job's overrides come in two kinds:
those that choose presets (`strategy=async`, `hydra/launcher=joblib`, a search path), which decide what
is merged, and those that set values (`workload.batch_size=4`, `+x=1`, `~y`), which Hydra applies to the
merged config afterwards. So the merge is made once per distinct choice of presets and kept; each job
unpickles a copy of it and has Hydra's own code apply its value overrides and fill in the `hydra` node as Hydra's
`_load_configuration_impl` does (task/hydra override lists, `override_dirname`).

`install()` puts this behind `ConfigLoaderImpl.load_sweep_config`, the one call every launcher makes
per job (the basic launcher in this process, joblib's workers in theirs: unpickling the sweep's callback
installs it there), and behind `load_configuration` for a single configuration, so that one
`python -m harness` composes once: the checks before Hydra starts, Hydra's look at `hydra.mode` and the
run itself each composed it from scratch before (4 × ~0.1 s). hydra-core is pinned below 1.4, and
tests/test_sweeps.py checks job configs equal Hydra's own for group, value, `+`/`~`, hydra and
experiment overrides.
"""
from __future__ import annotations

import copy
import os
import pickle
import sys
from collections import OrderedDict
from typing import Optional

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.errors import ConfigCompositionException
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.utils import JobRuntime
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

_JOB_NAME_PLACEHOLDER = "\x00hostbound: the composing job's name"
MAX_CACHED_COMPOSITIONS = 256  # distinct preset choices kept per process (~30 kB pickled each)

# Kept pickled: a job's copy is unpickled from bytes (~3 ms), 3x faster than copy.deepcopy of a DictConfig.
_compositions: "OrderedDict[tuple, bytes | DictConfig]" = OrderedDict()
_hydra_load_sweep_config = ConfigLoaderImpl.load_sweep_config  # Hydra's own (tests compare against it)
_hydra_load_configuration = ConfigLoaderImpl.load_configuration


def _chooses_presets(loader: ConfigLoaderImpl, override: Override) -> bool:
    """Whether the override changes what Hydra merges (Hydra's own test, defaults_list.Overrides: a config
    group's key with a non-dict value), or where it looks (hydra.searchpath)."""
    key = override.key_or_group
    if key.startswith("hydra.searchpath"):
        return True
    return not isinstance(override.value(), dict) and loader.repository.group_exists(key)


_parsed: dict[str, Override] = {}  # an override's text → Hydra's parse of it (read, never changed, by what follows)
MAX_PARSED_OVERRIDES = 100_000


def parse_overrides(overrides: list[str]) -> list[Override]:
    """OverridesParser.parse_overrides, each text parsed once per process: a sweep's jobs share most of
    their overrides, and Hydra's ANTLR parser took ~0.4 ms an override, twice a job."""
    new = list(dict.fromkeys(o for o in overrides if o not in _parsed))
    if new:
        if len(_parsed) + len(new) > MAX_PARSED_OVERRIDES:
            _parsed.clear()
        _parsed.update(zip(new, OverridesParser.create().parse_overrides(overrides=new)))
    return [_parsed[o] for o in overrides]


def compose_job(loader: ConfigLoaderImpl, config_name: Optional[str], overrides: list[str]) -> DictConfig:
    """What `loader.load_configuration(config_name, overrides, RunMode.RUN)` returns, from the cache."""
    parsed = parse_overrides(overrides)
    loader.validate_sweep_overrides_legal(overrides=parsed, run_mode=RunMode.RUN, from_shell=True)
    chooses = [_chooses_presets(loader, o) for o in parsed]
    choosing = [o for o, c in zip(parsed, chooses) if c]
    values = [o for o, c in zip(parsed, chooses) if not c]
    # Keyed by where configs are found too (a joblib worker gets a new loader, unpickled, for every job), and
    # by the working folder, which Hydra records in the composition (hydra.runtime.cwd).
    key = (os.getcwd(), repr(loader.config_search_path.get_path()), config_name, tuple(o.input_line for o in choosing))
    base = _compositions.get(key)
    if base is None:
        # Hydra names the job after whoever composes (JobRuntime's name) unless the config names it: kept
        # as a placeholder, filled in below with the name of the composition asking.
        job_name = JobRuntime.instance().get("name")
        JobRuntime.instance().set("name", _JOB_NAME_PLACEHOLDER)
        try:
            composed = _hydra_load_configuration(loader, config_name=config_name, overrides=[o.input_line for o in choosing], run_mode=RunMode.RUN)
        finally:
            JobRuntime.instance().set("name", job_name)
        base = _pickled(composed)
        _compositions[key] = base
        if len(_compositions) > MAX_CACHED_COMPOSITIONS:
            _compositions.popitem(last=False)
    cfg = _unpickled(base)
    ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
    app_overrides = [o for o in parsed if not o.is_hydra_override()]
    with open_dict(cfg.hydra):
        if cfg.hydra.job.name == _JOB_NAME_PLACEHOLDER:
            cfg.hydra.job.name = JobRuntime.instance().get("name")
        cfg.hydra.overrides.task = [o.input_line for o in app_overrides]
        cfg.hydra.overrides.hydra = [o.input_line for o in parsed if o.is_hydra_override()]
        dirname = cfg.hydra.job.config.override_dirname
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=app_overrides, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys
        )
    return cfg


def _pickled(cfg: DictConfig) -> "bytes | DictConfig":
    try:
        return pickle.dumps(cfg)
    except pickle.PicklingError:
        # A plugin's schema class defined twice (Hydra's plugin scan executes modules again that a joblib
        # or Ray worker had imported to unpickle its job): kept as is, and deep-copied.
        return cfg


def _unpickled(base: "bytes | DictConfig") -> DictConfig:
    return pickle.loads(base) if isinstance(base, bytes) else copy.deepcopy(base)


def copy_config(cfg: DictConfig) -> DictConfig:
    """A deep copy of a config, by pickling (~3 ms for a job's config against ~8 ms for copy.deepcopy)."""
    return _unpickled(_pickled(cfg))


def load_sweep_config(self: ConfigLoaderImpl, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
    """ConfigLoaderImpl.load_sweep_config, composed from the cache."""
    overrides = OmegaConf.to_container(master_config.hydra.overrides.hydra)
    assert isinstance(overrides, list)
    sweep_config = compose_job(self, master_config.hydra.job.config_name, overrides + list(sweep_overrides))
    # As Hydra does: the same resolved values (timestamps, ...) as the sweep's own config.
    OmegaConf.copy_cache(from_config=master_config, to_config=sweep_config)
    return sweep_config


def load_configuration(
    self: ConfigLoaderImpl,
    config_name: Optional[str],
    overrides: list[str],
    run_mode: RunMode,
    from_shell: bool = True,
    validate_sweep_overrides: bool = True,
) -> DictConfig:
    """ConfigLoaderImpl.load_configuration, composed from the cache when it composes one configuration:
    a run (RUN), or Hydra reading `hydra.mode` (MULTIRUN without checks) of a command line that sweeps
    nothing. A sweep's own configuration, and anything else, Hydra composes itself."""
    single = run_mode == RunMode.RUN and validate_sweep_overrides
    reading_mode = run_mode == RunMode.MULTIRUN and not validate_sweep_overrides
    if single or reading_mode:
        try:
            parsed = parse_overrides(list(overrides))
        except Exception:  # Hydra says what is wrong with it, in its own words
            parsed = None
        if parsed is not None and not any(o.is_sweep_override() for o in parsed):
            try:
                return compose_job(self, config_name, list(overrides))
            except OmegaConfBaseException as e:
                raise ConfigCompositionException().with_traceback(sys.exc_info()[2]) from e
    return _hydra_load_configuration(
        self, config_name=config_name, overrides=overrides, run_mode=run_mode, from_shell=from_shell,
        validate_sweep_overrides=validate_sweep_overrides,
    )


def install() -> None:
    ConfigLoaderImpl.load_sweep_config = load_sweep_config  # type: ignore[method-assign]
    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]
