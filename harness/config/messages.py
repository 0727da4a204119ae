"""One-line messages for bad input: an OmegaConf or Hydra error as one line naming the key and the
value the user wrote, with "did you mean" for a misspelt key or preset."""
from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from harness.config.paths import CONF_DIR, launch_folder_conf
from harness.config.schema import RunConfig, flatten
from harness.base.overrides import override_key, split_override


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
        name, _, value = split_override(override)
        if name == key:
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


LISTED_PRESETS = 20  # a group with more (experiment: ~150) is not listed in an error line: the closest few and where they are


def choose_from(group: str) -> str:
    """"choose from a, b, c" for a group of a few presets; for a long one (experiment: ~150 presets, ~4,900
    characters) where they are: the folder, and the --help that lists them."""
    options = group_options(group)
    if len(options) <= LISTED_PRESETS:
        return f"choose from {', '.join(options)}"
    folders = [f / group for f in (CONF_DIR, launch_folder_conf()) if f is not None and any((f / group).glob("*.yaml"))]
    return f"{len(options)} presets in {' and '.join(_shown(f) + '/' for f in folders)} (python -m harness --help lists them)"


def _shown(path: Path) -> str:
    """A folder relative to the working directory where it is under it, else in full."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit]}…"


def no_such_preset(group: str, value: str) -> str:
    """`group=value: no such group preset` with the one meant, or the closest few where the group is long."""
    options = group_options(group)
    if len(options) <= LISTED_PRESETS:
        return f"{group}={value}: no such {group} preset{did_you_mean(value, options)}; {choose_from(group)}"
    close, near = closest(value, options, 4)
    while len(close) > 1 and len(", ".join(close)) > 140:  # the line stays short whatever the names
        close.pop()
    hint = f" (did you mean {close[0]}?)" if near and len(close) == 1 else f"; the closest: {', '.join(close)}" if close else ""
    return f"{group}={_short(value)}: no such {group} preset{hint}; {choose_from(group)}"


def closest(word: str, choices: Sequence[str], n: int) -> tuple[list[str], bool]:
    """Up to `n` choices like `word`, and whether they are close: those holding each of its words
    (`h100_vllm_eager` → h100_vllm_llama2_eager_bs1), or spelt alike; else, not close, the least unlike."""
    words = [w for w in re.split(r"[\W_]+", word.lower()) if w]
    holding = [c for c in choices if words and all(w in c.lower() for w in words)]
    spelt = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
    found = list(dict.fromkeys(holding + spelt))[:n]
    if found:
        return found, True
    return difflib.get_close_matches(word, list(choices), n=min(n, 3), cutoff=0.4), False


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


def _schema_node(key: str) -> object:
    """The run schema's node at a dotted key (its default), else None."""
    node: object = OmegaConf.structured(RunConfig)
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return None
        node = node._get_node(part)
    return node


# What a switch may be written as (OmegaConf's words); OmegaConf also reads any integer as a switch
# (`workload.serving.enabled=2` ran serving, `-1` too), which nobody writing 2 means.
_SWITCH_WORDS = frozenset({"true", "false", "yes", "no", "y", "n", "on", "off", "1", "0", "null", "none", "~"})


@functools.lru_cache(maxsize=1)
def _switch_keys() -> frozenset[str]:
    """The schema's boolean keys, dotted (walked once: a schema node costs ~20 ms to find)."""
    from omegaconf.nodes import BooleanNode

    keys = set()

    def walk(node: DictConfig, prefix: str) -> None:
        for name in node:
            child = node._get_node(name)
            if isinstance(child, DictConfig):
                walk(child, f"{prefix}{name}.")
            elif isinstance(child, BooleanNode):
                keys.add(f"{prefix}{name}")

    walk(OmegaConf.structured(RunConfig), "")
    return frozenset(keys)


def not_a_run_key(overrides: Sequence[str]) -> Optional[str]:
    """The one-line refusal of `advise=…` / `advise.*` given to a run: a question for harness.advise.
    Composed, it read "not in the defaults list; add it with +advise=…", which then failed as no such key."""
    for override in overrides:
        if override_key(override).split(".")[0] == "advise":
            return f"{override}: a question for python -m harness.advise (the best configuration under limits), not a run's key"
    return None


def not_a_switch(overrides: Sequence[str]) -> Optional[str]:
    """The one-line refusal of the first override that sets a switch to a number other than 0 or 1 (or to
    another word than OmegaConf's), None when there is none. Null and interpolations are left to the
    checks after composition."""
    for override in overrides:
        key, equals, value = split_override(override)
        word = value.strip().strip("'\"").lower()
        if equals and key in _switch_keys() and word not in _SWITCH_WORDS and not word.startswith("${"):
            return f"{override}: must be true or false"
    return None


def _plain(value: object) -> str:
    value = getattr(value, "value", value)  # an enum: as it is written
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def must_be_list(key: str, overrides: Sequence[str], fallback: str = "...") -> str:
    """`key=value: must be a list`, with the schema's default as the example (`[1,2,4,8]`)."""
    node = _schema_node(key)
    items = [] if not isinstance(node, ListConfig) else [node._get_node(i) for i in range(len(node))]
    scalars = [_plain(i._value()) for i in items[:4] if not isinstance(i, (DictConfig, ListConfig))]
    example = f", e.g. [{','.join(scalars)}]" if scalars else " in brackets, e.g. [] or [A,B]" if not items else " in brackets"
    return f"{_written(key, overrides, fallback)}: must be a list{example}"


def must_be_mapping(key: str, overrides: Sequence[str], fallback: str = "...") -> str:
    """`key=value: must be a mapping`: a group of keys (the schema's) or a free-form dict."""
    node = _schema_node(key)
    fields = list(node.keys()) if isinstance(node, DictConfig) else []
    if fields and dataclass_node(node):
        shown = ", ".join(str(f) for f in fields[:4]) + (", …" if len(fields) > 4 else "")
        return f"{_written(key, overrides, fallback)}: a group of keys ({shown}), not a value: set one, e.g. {key}.{fields[0]}=..."
    return f"{_written(key, overrides, fallback)}: must be a mapping, e.g. {key}={{NAME:VALUE}}, or set one entry: +{key}.NAME=VALUE"


def dataclass_node(node: object) -> bool:
    import dataclasses

    return isinstance(node, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(node))


def _resolvers() -> list[str]:
    from omegaconf.basecontainer import BaseContainer

    return sorted(BaseContainer._resolvers)  # the names ${NAME:...} can call (OmegaConf's, Hydra's, the harness's)


def _takes_entries(key: str) -> bool:
    """Whether the schema's field at `key` is a free-form mapping (a card's overrides), which takes new
    entries with +, rather than a group of fixed keys."""
    node = _schema_node(key)
    return isinstance(node, DictConfig) and not dataclass_node(node)


def _explain(raw: str, overrides: Sequence[str]) -> Optional[str]:
    m = re.search(r"Could not override '(?P<key>[^']+)'\.; To append to your config use \+", raw)
    if m and _takes_entries(m["key"].rsplit(".", 1)[0]):
        # a new entry of a mapping (a card's overrides) written without +: Hydra's three sentences and full_key
        key = m["key"]
        return f"{_written(key, overrides, '...')}: {key.rsplit('.', 1)[0]} has no such entry yet; add it with +{_written(key, overrides, '...')}"
    if "Config group override must be a string or a list. Got NoneType" in raw:
        # `workload=null`: Hydra names neither the group nor the value
        for override in overrides:
            group, equals, value = split_override(override)
            if equals and value.strip().strip("'\"").lower() in ("null", "none", "~") and group_options(group):
                return f"{group}={value}: a config group needs a preset, not null; {choose_from(group)}"
        return "a config group was given null: name a preset (e.g. workload=llama2_7b_decode)"
    if m := re.search(r"Could not find '(?P<group>[\w/]+)/'", raw):
        # `hardware=`: an empty name (Hydra listed its whole search path)
        group = m["group"]
        options = group_options(group)
        if not options:
            return None
        return f"{group}=: names no {group} preset; {choose_from(group)}"
    if m := re.search(r"Could not find '(?P<group>[\w/]+)/(?P<value>[^']+)'", raw):
        group, value = m["group"], m["value"]
        options = group_options(group)
        if not options:
            return None
        return no_such_preset(group, value)
    if m := re.search(r"File name too long: '[^']*/conf/(?P<path>[^']+?)(\.yaml)?'", raw):
        # Hydra looked for a config group of that name: a key too long for a file name is no key at all
        key = m["path"].replace("/", ".")
        written = next((o for o in overrides if override_key(o) == key), f"{key}=...")
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
    if m := re.search(r"is not a ListConfig, list or tuple\.?; full_key: (?P<key>[^;\s]+)", raw):
        # `strategy.graph.buckets=8`: OmegaConf's "Invalid value assigned: int is not a ListConfig"
        return must_be_list(m["key"], overrides)
    if m := re.search(r"Cannot merge (?P<value>\w+)Config with (?P<into>\w+)Config; full_key: (?P<key>[^;\s]+)", raw):
        # a dict where a list goes (`buckets={a:1}`) or a list where a dict goes (`strategy.graph=[1,2]`)
        node = _schema_node(m["key"])
        return must_be_list(m["key"], overrides) if isinstance(node, ListConfig) else must_be_mapping(m["key"], overrides)
    if m := re.search(r"Invalid type assigned: \w+ is not a subclass of \w+\. value: (?P<value>.*?); full_key: (?P<key>[^;\s]+)", raw):
        return must_be_mapping(m["key"], overrides, m["value"])  # `strategy.graph=5`: a value for a group of keys
    if m := re.search(r"Cannot assign \w+ to Dict\[[^;]*; full_key: (?P<key>[^;\s]+)", raw):
        return must_be_mapping(m["key"], overrides)  # `workload.card_overrides=3`
    if m := re.search(r"Interpolation key '(?P<ref>[^']*)' not found; full_key: (?P<key>[^;\s]+)", raw):
        ref = m["ref"]
        close = difflib.get_close_matches(ref, config_keys(), n=1, cutoff=0.6)
        hint = f" (did you mean ${{{close[0]}}}?)" if close else "; ${KEY} takes a full key, e.g. ${workload.context_len}"
        return f"{_written(m['key'], overrides, '${' + ref + '}')}: ${{{ref}}} names no key{hint}"
    if m := re.search(r"Environment variable '(?P<var>[^']*)' not found\"?; full_key: (?P<key>[^;\s]+)", raw):
        var = m["var"]
        return f"{_written(m['key'], overrides, '${oc.env:' + var + '}')}: the environment variable {var} is not set (a default: ${{oc.env:{var},VALUE}})"
    if m := re.search(r"Unsupported interpolation type (?P<name>\S+?); full_key: (?P<key>[^;\s]+)", raw):
        name = m["name"]
        close = difflib.get_close_matches(name, _resolvers(), n=1, cutoff=0.5) or [r for r in _resolvers() if r.endswith("." + name)][:1]
        hint = f"did you mean ${{{close[0]}:...}}?" if close else "e.g. ${oc.env:NAME}, ${oc.select:KEY,DEFAULT}"
        return f"{_written(m['key'], overrides, '${' + name + ':...}')}: no resolver {name} ({hint})"
    if m := re.search(r"Could not append to config\. An item is already at '(?P<key>[^']+)'", raw):
        written = _written(m["key"], overrides, "...")
        return f"+{written}: {m['key']} is already set: write {written} (+ adds a key the config lacks)"
    if m := re.search(r"Could not override '(?P<key>[^']+)'\. No match in the defaults list", raw):
        key = m["key"]
        return f"{_written(key, overrides, '...')}: {key} is not in the defaults list; add it with +{_written(key, overrides, '...')}"
    if m := re.search(r"^(Error parsing override '(?P<written>.*?)'; )?(?P<why>.+?); See https://hydra\.cc\S* for details", raw):
        # Hydra's override grammar: `workload.batch_size=${`, `x=[1` (a value holding $ { } [ ] , or a space needs quotes)
        where = f"{m['written']}: " if m["written"] else ""
        return f"{where}{m['why']}; close brackets, and quote a value holding $, {{}}, [], a comma or a space: 'KEY=\"VALUE\"'"
    if m := re.search(r"Error merging override (?P<written>[^;]+?); (?P<why>.+?)(; full_key: \S+)?$", raw):
        return f"{m['written']}: {m['why']}"  # another kind: still the key and the value first, once
    return None
