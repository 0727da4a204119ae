"""One-line messages for bad input: an OmegaConf or Hydra error as one line naming the key and the
value the user wrote, with "did you mean" for a misspelt key or preset."""
from __future__ import annotations

import difflib
import re
from typing import Optional, Sequence

from omegaconf import OmegaConf

from harness.config.paths import CONF_DIR, launch_folder_conf
from harness.config.schema import RunConfig, flatten


def one_line(exc: BaseException, overrides: Sequence[str] = ()) -> str:
    """An OmegaConf/Hydra error as one line naming the key and the value the user wrote, with "did you
    mean" for a misspelt key or preset; errors it does not know are squeezed (causes included) as they are."""
    parts: list[str] = []
    seen = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for line in str(current).splitlines():
            line = line.strip()
            if not line or line.startswith(("object_type=", "Set the environment", "reference_type=")):
                continue
            if line not in parts:
                parts.append(line)
        current = current.__cause__ or current.__context__
    raw = "; ".join(parts) if parts else type(exc).__name__
    return _explain(raw, overrides) or raw


def _written(key: str, overrides: Sequence[str], fallback: str) -> str:
    """`key=value` as the command line wrote it (`+`/`++` prefixes dropped), else with `fallback`; the last
    one where a key is written twice, as Hydra takes the last."""
    for override in reversed(overrides):
        name, _, value = override.partition("=")
        if name.lstrip("+~") == key:
            return f"{key}={value}"
    return f"{key}={fallback}"


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """The closest choice by spelling, else the only one that holds the word (`a2` → `atlas_a2`)."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if not close and len(word) >= 2:
        close = [c for c in choices if word.lower() in c.lower()]
    return f" (did you mean {close[0]}?)" if len(close) == 1 else ""


def group_options(group: str) -> list[str]:
    """The presets of a config group: shipped, and in the launch folder's conf/."""
    folders = [CONF_DIR, launch_folder_conf()]
    return sorted({p.stem for folder in folders if folder is not None for p in (folder / group).glob("*.yaml")})


def config_keys() -> list[str]:
    """Every key of the run schema (dotted), and the config groups."""
    groups = [p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "advise"]  # advise: python -m harness.advise's
    return sorted(set(flatten(OmegaConf.to_container(OmegaConf.structured(RunConfig)))) | set(groups))


def no_such_key(key: str, value: object = None, overrides: Sequence[str] = (), unknown: str | None = None) -> str:
    """`key=value: no such key` with the key meant (or, for a word at the top, the config groups).
    `unknown`: the part of `key` the schema lacks, where it adds a whole dict (`workload.extra` of
    `workload.extra.a=1`): the key to spell-check."""
    unknown = unknown or key
    keys = config_keys()
    parent, _, leaf = unknown.rpartition(".")
    siblings = [k[len(parent) + 1:] for k in keys if parent and k.startswith(parent + ".") and "." not in k[len(parent) + 1:]]
    if siblings:  # spelt against the keys beside it: engine.x is no misspelt `engine`
        close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
        shown = ", ".join(siblings[:12]) + (", …" if len(siblings) > 12 else "")
        hint = f" (did you mean {parent}.{close[0]}?)" if close else f"; {parent} has {shown}"
    else:
        hint = did_you_mean(unknown, keys)
    if not hint and "." not in unknown:  # a word at the top, like model=...: say what the groups are
        groups = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "experiment", "advise"))
        hint = f"; the config groups are {', '.join(groups)} (e.g. workload=llama2_7b_decode), and +experiment=NAME"
    return f"{_written(key, overrides, '...' if value is None else str(value))}: no such key{hint}"


_TYPE_WORDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "text"}


def _explain(raw: str, overrides: Sequence[str]) -> Optional[str]:
    if "Config group override must be a string or a list. Got NoneType" in raw:
        # `workload=null`: Hydra names neither the group nor the value
        for override in overrides:
            name, equals, value = override.partition("=")
            group = name.lstrip("+~")
            if equals and value.strip().strip("'\"").lower() in ("null", "none", "~") and group_options(group):
                return f"{group}={value}: a config group needs a preset, not null; choose from {', '.join(group_options(group))}"
        return "a config group was given null: name a preset (e.g. workload=llama2_7b_decode)"
    if m := re.search(r"Could not find '(?P<group>[\w/]+)/'", raw):
        # `hardware=`: an empty name (Hydra listed its whole search path)
        group = m["group"]
        options = group_options(group)
        if not options:
            return None
        return f"{group}=: names no {group} preset; choose from {', '.join(options)}"
    if m := re.search(r"Could not find '(?P<group>[\w/]+)/(?P<value>[^']+)'", raw):
        group, value = m["group"], m["value"]
        options = group_options(group)
        if not options:
            return None
        return f"{group}={value}: no such {group} preset{did_you_mean(value, options)}; choose from {', '.join(options)}"
    if m := re.search(r"File name too long: '[^']*/conf/(?P<path>[^']+?)(\.yaml)?'", raw):
        # Hydra looked for a config group of that name: a key too long for a file name is no key at all
        key = m["path"].replace("/", ".")
        written = next((o for o in overrides if o.lstrip("+~").partition("=")[0] == key), f"{key}=...")
        return f"{written[:60]}… ({len(key)} characters): no such key"
    if m := re.search(r"Key '[^']+' not in '\w+'; full_key: (?P<key>\S+)", raw):
        return no_such_key(m["key"], None, overrides)
    if m := re.search(r"Value '(?P<value>.*?)' of type '\w+' could not be converted to (?P<to>\w+); full_key: (?P<key>[^;\s]+)", raw):
        return f"{_written(m['key'], overrides, m['value'])}: must be {_TYPE_WORDS.get(m['to'], m['to'])}"
    if m := re.search(r"Value '(?P<value>.*?)' is not a valid bool \(type \w+\); full_key: (?P<key>[^;\s]+)", raw):
        return f"{_written(m['key'], overrides, m['value'])}: must be true or false"
    if m := re.search(r"Invalid value '(?P<value>.*?)', expected one of \[(?P<options>[^\]]*)\]; full_key: (?P<key>[^;\s]+)", raw):
        options = [o.strip() for o in m["options"].split(",")]
        return f"{_written(m['key'], overrides, m['value'])}: must be one of {', '.join(options)}{did_you_mean(m['value'], options)}"
    if m := re.search(r"Could not override '(?P<key>[^']+)'\. No match in the defaults list", raw):
        key = m["key"]
        return f"{_written(key, overrides, '...')}: {key} is not in the defaults list; add it with +{_written(key, overrides, '...')}"
    return None
