"""What `python -m harness.advise` is asked: the objective, the user's limits, the search space and how
long to search. Composed from a preset of conf/advise/ and `advise.*` overrides (harness.cli.advise);
the run the candidates start from is composed by Hydra like any other run."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
import re
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional

import yaml
from omegaconf import OmegaConf

from harness.base.errors import ConfigError
from harness.base.stopping import held, raise_if_stopped
from harness.config.limits import check_field, check_limits
from harness.config.messages import one_line
from harness.config.paths import CONF_DIR

ADVISE_DIR = CONF_DIR / "advise"
OBJECTIVES = ("throughput",)  # tokens per second per device
SEARCHES = ("auto", "exhaustive", "optuna")


@dataclass
class AdviseConfig:
    _key: ClassVar[str] = "advise"
    objective: str = "throughput"
    tpot_ms_max: Optional[float] = None  # decode: median time per output token (a step, or serving's median TPOT)
    ttft_ms_max: Optional[float] = None  # time to first token: serving's median, or a prefill step
    hbm_gb_max: Optional[float] = None  # device memory a candidate may use, below the device's own
    capture_s_max: Optional[float] = None  # start-up time spent capturing graphs
    # Successive halving: every candidate is simulated for steps[0] steps, the best `keep` share of them
    # for steps[1], and so on; the ranking is the last rung's.
    steps: List[int] = field(default_factory=lambda: [8, 32])
    keep: float = 0.34
    budget_s: float = 60.0  # stop simulating new candidates after this long (the ranking says how many ran)
    # exhaustive: every combination; optuna: `trials` of them, picked by Optuna's TPE sampler as it learns;
    # auto: exhaustive up to `exhaustive_max` combinations.
    search: str = "auto"
    exhaustive_max: int = 1500
    trials: int = 300
    workers: Optional[int] = None  # simulations at once on this machine; null: one per core it may use
    ray_address: Optional[str] = None  # simulate on Ray: a cluster's HOST:PORT, auto (this machine's), or local
    # The search space: config key (or group) → the values tried; every combination is a candidate.
    space: Dict[str, List[Any]] = field(default_factory=dict)
    baseline: List[str] = field(default_factory=list)  # the user's current configuration, as overrides
    name: str = "advised"  # the winner is written as conf/experiment/<name>.yaml in the launch folder
    leaders: int = 5  # the best candidates logged as child runs of the advice's MLflow run (tracking.enabled)

    def __post_init__(self) -> None:
        check_limits(self)
        check_field(self, self.objective in OBJECTIVES, "objective", f"must be one of {', '.join(OBJECTIVES)}")
        check_field(self, self.search in SEARCHES, "search", f"must be one of {', '.join(SEARCHES)}")
        check_field(self, 0 < len(self.steps) <= 8 and self.steps == sorted(self.steps), "steps", "must be 1..8 step counts, rising")
        check_field(self, 0 < len(self.space) <= 16, "space", "must name 1..16 keys to search")
        for key, values in self.space.items():
            if not isinstance(values, list) or not 0 < len(values) <= 1000:
                raise ConfigError(f"advise.space.{key}={values!r}: must be a list of 1..1000 values")
        check_field(self, self.name.replace("_", "").isalnum(), "name", "must be letters, digits and _ (a preset's file name)")


def presets() -> list[str]:
    return sorted(p.stem for p in ADVISE_DIR.glob("*.yaml"))


def compose_advise(preset: str, overrides: list[str]) -> AdviseConfig:
    """The preset conf/advise/<preset>.yaml with `advise.KEY=VALUE` overrides on top, checked."""
    from harness.config.messages import closest, did_you_mean

    path = ADVISE_DIR / f"{preset}.yaml"
    if not path.is_file():
        raise ConfigError(f"advise={preset}: no such advise preset{did_you_mean(preset, presets())}; choose from {', '.join(presets())}")
    keys = [f.name for f in fields(AdviseConfig)]
    for override in overrides:  # a misspelt key, named as written, with the advise key meant
        key, _, value = override.partition("=")
        if key.split(".")[0].split("[")[0] not in keys:
            close, near = closest(key, keys, 1)
            hint = f" (did you mean advise.{close[0]}?)" if near else f"; advise has {', '.join(keys)} (and advise.out)"
            raise ConfigError(f"advise.{key}={value}: no such key{hint}")
    # space.KEY=VALUES adds or replaces one axis, KEY being a whole config key (its dots are not nesting).
    axes = {o.partition("=")[0].removeprefix("space."): o.partition("=")[2] for o in overrides if o.startswith("space.")}
    dotted = [o for o in overrides if not o.startswith("space.")]
    # A stop raised inside OmegaConf could leave its nodes broken and come out as an AttributeError,
    # reported as bad input (compose_run holds it the same way): it is taken after the block.
    with held():
        advise = _merged_advise(path, overrides, axes, dotted)
    raise_if_stopped()
    return advise


def _merged_advise(path: Path, overrides: list[str], axes: dict, dotted: list[str]) -> AdviseConfig:
    try:
        chosen = OmegaConf.load(path)
        if any(o.partition("=")[0] == "space" for o in overrides) and "space" in chosen:
            del chosen["space"]  # a space given whole replaces the preset's (a merge would keep its other keys)
        added = OmegaConf.create({"space": {key: _axis_values(key, values) for key, values in axes.items()}})
        merged = OmegaConf.merge(OmegaConf.structured(AdviseConfig), chosen, OmegaConf.from_dotlist(dotted), added)
        advise = OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except Exception as exc:  # a value of the wrong type, in Hydra's words cut to a line, its key as written (advise.…)
        raise ConfigError(_as_written(one_line(exc, overrides), overrides)) from exc
    assert isinstance(advise, AdviseConfig)
    return advise


def _axis_values(key: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"advise.space.{key}={text}: not a list of values ({str(exc).splitlines()[0]})") from None


def _as_written(message: str, overrides: list[str]) -> str:
    """`tpot_ms_max=abc: must be a number` → `advise.tpot_ms_max=abc: …`: OmegaConf names the key inside the
    advise config, the user wrote it with its prefix. A message that names no key as written (OmegaConf's
    `full_key: space…`) is put after the override it is about."""
    key = message.partition("=")[0].partition(":")[0]
    named = key.split(".")[0].split("[")[0]
    if named in {f.name for f in fields(AdviseConfig)} and " " not in key:
        # a message's example written for a run's key (`space={NAME:VALUE}`, `+space.NAME=VALUE`) in advise's words
        message = message.replace(f"e.g. {named}=", f"e.g. advise.{named}=").replace(f"+{named}.", f"advise.{named}.")
        return f"advise.{message}"
    full_key = re.search(r"full_key: ([\w\[\]]*)", message)
    root = full_key[1].split("[")[0] if full_key and full_key[1] else ""
    written = [o for o in overrides if o.partition("=")[0].split(".")[0] == root] if root else overrides[-1:] if len(overrides) == 1 else []
    reason = re.sub(r";?\s*full_key:.*$", "", message)
    return f"advise.{written[-1]}: {reason}" if written else message
