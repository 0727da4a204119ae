"""Reading a command-line override as Hydra writes it (`key=value`, `+key=value` to add a key, `++key=value`
to force one, `~key` to delete one): its key without the prefix, and its value. One place, so every command
that asks which keys a user set reads `+workload.steps=4` and `workload.steps=4` alike."""
from __future__ import annotations

HYDRA_PREFIXES = "+~"


def split_override(override: str) -> tuple[str, str, str]:
    """(key, "=", value) of `override` with Hydra's prefix taken off; ("key", "", "") for `~key`."""
    return override.lstrip(HYDRA_PREFIXES).partition("=")


def override_key(override: str) -> str:
    """The key `override` sets (`++strategy.graph.mode=sink` → `strategy.graph.mode`)."""
    return split_override(override)[0]
