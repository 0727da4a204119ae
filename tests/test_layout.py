"""The package's layers import downward only, and nothing forms an import cycle.

Every module under harness/ and hydra_plugins/ is read, with the imports inside functions, relative
imports, `import a.b` and `from a import b` alike (a cycle or an upward import hidden in a function
still makes the import order matter and hides which layer owns what). docs/architecture.md draws the
same order.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from harness.config.paths import REPO_ROOT

# Bottom to top: a module may import its own layer and the layers before it, never one after it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("harness.base",)),
    ("config", ("harness.config",)),
    ("model", ("harness.model",)),
    ("sim", ("harness.sim",)),
    ("importers", ("harness.importers",)),
    ("results", ("harness.results",)),
    ("advisor", ("harness.advisor",)),
    ("tracking", ("harness.tracking",)),
    ("sweep", ("harness.sweep", "hydra_plugins.hostbound_launcher")),
    ("cli", ("harness.cli",)),
    # `python -m harness`, `hostbound` and the commands named harness.<command>: they only call cli/.
    ("entry", ("harness", "harness.__main__", "harness.profile", "harness.report", "harness.repro", "harness.export_ops", "harness.advise")),
]
# An importer measures a real trace the way the simulator measures its own run: of sim/ it may use the
# task categories and the metric formulas, nothing that simulates.
IMPORTERS_MAY_USE = {"harness.sim.task_graph", "harness.sim.metrics"}
# Third-party packages only one layer talks to.
OWNED_IMPORTS = {"mlflow": "tracking", "matplotlib": "results", "optuna": "advisor", "ray": "advisor"}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, name: str, is_package: bool) -> set[str]:
    """Every module `source` imports (absolute names; `from a import b` gives a and a.b)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def read_tree(root: Path) -> dict[str, set[str]]:
    """Module → every module it imports, for harness/ and hydra_plugins/ under `root`."""
    paths = [p for top in ("harness", "hydra_plugins") for p in (root / top).rglob("*.py")]
    return {module_name(p, root): imports_of(p.read_text(), module_name(p, root), p.name == "__init__.py") for p in paths}


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the layer a module belongs to (the longest prefix that names it)."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".") and prefix != "harness") and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    return best


def internal_graph(tree: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: {t for t in targets if t in tree and t != m} for m, targets in tree.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle (as a path that returns to its start), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def violations(tree: dict[str, set[str]]) -> list[str]:
    """What breaks the declared order: modules in no layer, imports pointing up, importers reaching into
    the simulation, third-party packages used outside their layer, and a cycle."""
    found = [f"{m}: in no layer of LAYERS" for m in sorted(tree) if layer_of(m) is None]
    graph = internal_graph(tree)
    for module in sorted(graph):
        here = layer_of(module)
        for target in sorted(graph[module]):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                found.append(f"{module} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]}): up the layers")
            if module.startswith("harness.importers") and target.startswith("harness.sim") and target not in IMPORTERS_MAY_USE:
                found.append(f"{module} imports {target}: an importer measures, it does not simulate")
        for target in sorted(tree[module]):
            owner = OWNED_IMPORTS.get(target.partition(".")[0])
            if owner is not None and here is not None and LAYERS[here][0] != owner:
                found.append(f"{module} imports {target}: only {owner}/ does")
    if cycle := find_cycle(graph):
        found.append("import cycle: " + " -> ".join(cycle))
    return found


def test_the_reader_sees_imports_inside_functions_and_relative_ones():
    source = "import os\ndef f():\n    from harness.sim import kernel\n    from . import sibling\n    import harness.base.files as files\n"
    found = imports_of(source, "harness.model.ops", is_package=False)
    assert {"harness.sim", "harness.sim.kernel", "harness.model.sibling", "harness.base.files", "os"} <= found
    assert "harness.sim.simulate" in read_tree(REPO_ROOT)["harness.cli.command"]  # inside check_run()


def test_it_fails_on_the_old_flat_tree_shape(tmp_path):
    """The shape this test was written against (before the layers): a cycle config → the launcher plugin
    → launcher → sweep → run → config, a flat module in no layer, MLflow outside tracking."""
    files = {
        "harness/__init__.py": "",
        "harness/config.py": "def register():\n    from hydra_plugins.hostbound_launcher import L\n",
        "harness/launcher.py": "from harness.sweep import SweepStopped\n",
        "harness/sweep.py": "from harness.run import simulate\n",
        "harness/run.py": "from harness.config import RunConfig\n",
        "harness/base/__init__.py": "",
        "harness/base/errors.py": "from harness.sim.kernel import simulate\n",
        "harness/sim/__init__.py": "",
        "harness/sim/kernel.py": "import mlflow\n",
        "hydra_plugins/hostbound_launcher/__init__.py": "from harness.launcher import L\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = violations(read_tree(tmp_path))
    assert "harness.run: in no layer of LAYERS" in found
    assert "harness.base.errors (base) imports harness.sim.kernel (sim): up the layers" in found
    assert "harness.sim.kernel imports mlflow: only tracking/ does" in found
    assert found[-1] == "import cycle: harness.config -> hydra_plugins.hostbound_launcher -> harness.launcher -> harness.sweep -> harness.run -> harness.config"


def test_layers_point_down_and_nothing_cycles():
    assert violations(read_tree(REPO_ROOT)) == []


def test_the_architecture_map_names_every_module_in_its_layer():
    """docs/architecture.md's map is where a newcomer finds a module: each harness/<layer>/<module>.py is
    named on its layer's lines (advisor/, fit.py, busy.py and advice_runs.py were missing)."""
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```", 2)[1]
    lines_of: dict[str, str] = {}
    layer = None
    for line in block.splitlines():
        head = line[:11].strip(" │")
        if head:
            layer = head
        if layer is not None:
            lines_of[layer] = lines_of.get(layer, "") + line
    missing = []
    for name, _ in LAYERS[:-1]:
        for path in sorted((REPO_ROOT / "harness" / name).glob("*.py")):
            if path.name != "__init__.py" and path.name not in lines_of.get(name, ""):
                missing.append(f"{name}/{path.name}")
    assert not missing, missing


def test_importing_the_package_changes_nothing():
    """No work at import time beyond definitions: importing every module below the entry points leaves
    Hydra's config loader and the environment as they were (the entry point, a sweep's callback and the
    functions that talk to MLflow do that, when they run)."""
    modules = sorted(m for m in read_tree(REPO_ROOT) if m.startswith("harness.") and layer_of(m) < len(LAYERS) - 1)
    script = (
        "import importlib, os, sys\n"
        "from hydra._internal.config_loader_impl import ConfigLoaderImpl\n"
        "before = (dict(os.environ), ConfigLoaderImpl.load_configuration, ConfigLoaderImpl.load_sweep_config)\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "after = (dict(os.environ), ConfigLoaderImpl.load_configuration, ConfigLoaderImpl.load_sweep_config)\n"
        "print(before == after)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"
    assert len(modules) > 40
