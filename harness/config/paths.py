"""Where the configuration tree (conf/) and the model cards (workloads/) are: a source checkout's top
level, or inside an installed wheel."""
from __future__ import annotations

import functools
import re
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
_PACKAGE = Path(__file__).resolve().parents[1]  # harness/
# A source checkout (or an editable install) keeps conf/ and workloads/ at the top level; a wheel ships
# them inside the package (pyproject.toml maps them to harness/conf, harness/workloads).
CONF_DIR = _PACKAGE / "conf" if (_PACKAGE / "conf").is_dir() else REPO_ROOT / "conf"
WORKLOADS_DIR = _PACKAGE / "workloads" if (_PACKAGE / "workloads").is_dir() else REPO_ROOT / "workloads"


LAUNCH_FOLDER_CONF = "conf"  # relative to the folder a command starts in


def launch_folder_conf() -> Path | None:
    """The conf/ of the folder a command starts in, when it has one of its own (presets a user made, such
    as a machine fitted by `python -m harness.profile TRACE --fit NAME`); None otherwise."""
    folder = Path.cwd() / LAUNCH_FOLDER_CONF
    if folder.is_dir() and folder.resolve() != CONF_DIR.resolve():
        return folder.resolve()
    return None


@functools.cache
def card_preset_names() -> frozenset[str]:
    """The `name` of every workload preset in conf/workload/ that runs a model card: a name that says which
    model and deployment ran, so a run whose card was taken away (workload.card=null) must not keep it."""
    names = set()
    for preset in (CONF_DIR / "workload").glob("*.yaml"):
        text = preset.read_text()
        name = re.search(r"^name:\s*(\S+)", text, re.MULTILINE)
        card = re.search(r"^card:\s*(\S+)", text, re.MULTILINE)
        if name and card and card.group(1) != "null":
            names.add(name.group(1))
    return frozenset(names)
