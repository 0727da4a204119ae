"""Every `python -m harness…` command in the README, and in the docs it sends readers to for the rest of
its old content (configuration, profiles, sweeps and MLflow), runs as shown.

Commands run in-process on a scratch folder (one Numba compilation for all of them): a run command
is composed and checked as the command line would (`preflight`'s checks), then simulated, once for
every combination of a sweep's values. Lines shown with a `$` prompt must print what the README shows.
A command that cannot run here (a placeholder, a remote server) must be listed in ILLUSTRATIVE with the
reason, so a new README line is never skipped silently.
"""
from __future__ import annotations

import itertools
import re
import shlex

import pytest

from harness.cli.command import check_run, preflight
from harness.config.compose import compose_run
from harness.config.paths import REPO_ROOT

# Lines that name something this machine cannot have; each is covered elsewhere as noted.
ILLUSTRATIVE = {
    "python -m harness.profile trace.json.gz --out imported": "a user's own trace (test_profile_import)",
    "python -m harness.profile trace.json.gz --out imported --fit my_box --unprofiled-step-ms 16.0": "a user's own trace (test_profile_fit)",
    "python -m harness.report outputs/sweeps/<date>/<time>_<id>": "placeholders (test_sweeps)",
    "python -m harness.report --tracking-uri sqlite:///outputs/mlflow.db --parent <sweep's parent run id>":
        "placeholders (test_sweeps)",
    "python -m harness tracking.uri=https://mlflow-host": "a remote server behind a login (test_team_auth starts a local one)",
}


DOCUMENTS = ["README.md", "docs/configuration.md", "docs/profiles.md", "docs/sweeps-and-mlflow.md", "docs/outputs.md"]


def readme_commands() -> list[tuple[str, list[str]]]:
    """(command, the lines the document shows it printing) for every harness command in a code block."""
    text = "\n".join((REPO_ROOT / name).read_text() for name in DOCUMENTS)
    commands: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            prompt = line.startswith("$ ")
            command = line[2:] if prompt else line
            if not command.startswith(("python -m harness", "hostbound ")):
                continue
            try:
                command = " ".join(shlex.split(command, comments=True))
            except ValueError:  # prose in a placeholder (an apostrophe): keep the line as written
                command = re.sub(r"\s+#.*$", "", command)
            shown: list[str] = []
            if prompt:
                for after in lines[i + 1:]:
                    if after.startswith("$ "):
                        break
                    shown.append(after)
            if command not in [c for c, _ in commands]:  # a command shown in two documents runs once
                commands.append((command, shown))
    return commands


COMMANDS = readme_commands()


def test_the_readme_has_commands_and_every_illustrative_one_is_still_there():
    shown = {command for command, _ in COMMANDS}
    assert len(shown) > 15
    assert set(ILLUSTRATIVE) <= shown, f"ILLUSTRATIVE names lines the README no longer has: {set(ILLUSTRATIVE) - shown}"


def test_the_readme_stays_short_and_every_document_it_names_exists():
    """A newcomer reads it in five minutes: at most 200 lines; the rest lives in docs/, which it names."""
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    named = set(re.findall(r"`(docs/[\w.-]+\.md)`", text))
    assert len(named) >= 8 and all((REPO_ROOT / doc).is_file() for doc in named), named
    assert {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "docs").glob("*.md")} <= named  # none left unnamed


def test_configuration_md_names_every_preset_and_model_card():
    """docs/configuration.md's tables list what `python -m harness hardware=... workload=...` accepts: a
    preset or card added without a line there is one a newcomer cannot find (five workload presets and
    six cards were missing)."""
    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    shipped = {f"{group}={path.stem}" for group in ("hardware", "workload", "strategy", "engine")
               for path in (REPO_ROOT / "conf" / group).glob("*.yaml")}
    shipped |= {f"card {path.stem}" for path in (REPO_ROOT / "workloads").glob("*.yaml")}
    unnamed = sorted(name for name in shipped if f"`{name.split('=')[-1].split(' ')[-1]}`" not in text)
    assert not unnamed, unnamed


def _sweep_combinations(overrides: list[str]) -> list[list[str]]:
    """Every combination of a multirun's comma-separated values (as Hydra's basic sweeper runs them)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_hydra_override():
            continue
        key = override.input_line.split("=", 1)[0]
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        choices.append([f"{key}={value}" for value in values])
    return [list(combination) for combination in itertools.product(*choices)]


def _run_harness(args: list[str], capsys) -> str:
    """What `python -m harness ARGS` does, in-process: check every job, simulate it, print the summary."""
    from harness.__main__ import main as hydra_main
    import sys

    if "--cfg" in args:
        old_argv = sys.argv
        sys.argv = ["harness", *args]
        try:
            hydra_main()
        finally:
            sys.argv = old_argv
        return capsys.readouterr().out
    from harness.sim.simulate import simulate_run

    multirun = "-m" in args or "--multirun" in args
    overrides = [a for a in args if not a.startswith("-")]
    for launcher in [o.split("=", 1)[1] for o in overrides if o.startswith("hydra/launcher=")]:
        # the launcher the line names is installed (basic is Hydra's own, hostbound the harness's)
        module = {"basic": "hydra._internal.core_plugins.basic_launcher", "hostbound": "hydra_plugins.hostbound_launcher"}
        __import__(module.get(launcher, f"hydra_plugins.hydra_{launcher}_launcher"))
    jobs = _sweep_combinations(overrides) if multirun else [overrides]
    for job in jobs:
        run = compose_run([o for o in job if not o.startswith("hydra")])
        check_run(run)
        outcome = simulate_run(run)
        assert outcome.summary["throughput_tok_s"] > 0, job
        if run.workload.serving.enabled:  # an example of serving serves: enough requests for its percentiles
            from harness.sim.serving import MIN_REQUESTS_FOR_PERCENTILES

            assert outcome.summary["requests_completed"] >= MIN_REQUESTS_FOR_PERCENTILES, job
    return ""


@pytest.mark.slow
@pytest.mark.parametrize("command,shown", COMMANDS, ids=[c for c, _ in COMMANDS])
def test_readme_command_runs_as_shown(command, shown, tmp_path, monkeypatch, capsys):
    if command in ILLUSTRATIVE:
        pytest.skip(ILLUSTRATIVE[command])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    words = command.split()
    module, args = words[2], words[3:]
    if module == "harness.export_ops":
        from harness.cli.export_ops import main

        main(args)
        assert (tmp_path / args[args.index("--out") + 1]).stat().st_size > 0
        # Its companion line reads the file it wrote: run it here too.
        _run_harness(["workload=trace", f"workload.path={args[args.index('--out') + 1]}"], capsys)
        return
    if module == "harness.advise":
        from harness.cli.advise import main

        assert main(args) == 0
        assert "winner       " in capsys.readouterr().out and list((tmp_path / "conf" / "experiment").glob("*.yaml"))
        return
    if module == "harness.profile":
        from harness.cli.profile import main

        for path_arg in [a for a in args if a.startswith("tests/")]:
            args[args.index(path_arg)] = str(REPO_ROOT / path_arg)
        main(args)
        printed = capsys.readouterr()
        assert (printed.err + printed.out).splitlines() == shown
        # The replay line it prints must run too.
        replay = (tmp_path / args[args.index("--out") + 1] / "replay.txt").read_text().split()
        _run_harness(replay[3:], capsys)
        return
    if words[:3] == ["python", "-m", "harness"] and "workload=trace" in args:
        path = next(a.split("=", 1)[1] for a in args if a.startswith("workload.path="))
        if not (tmp_path / path).exists():
            pytest.skip(f"reads {path}, which the line before it writes (run there)")
    if shown and shown[0].startswith("hostbound: error:"):
        with pytest.raises(SystemExit) as refused:
            preflight(args)  # what the command line checks before Hydra starts
        assert refused.value.code == 2 and capsys.readouterr().err.strip() == shown[0]
        return
    printed = _run_harness(args, capsys)
    if "--cfg" in args:
        assert "workload:" in printed and "strategy:" in printed


# The README's table of decode presets under the strategy presets, computed here; `python
# tests/test_readme.py` rewrites it after a model change (then say why the numbers moved).
TABLE_ROWS = [
    ("llama2_7b_decode", s) for s in ("eager", "async", "pipeline", "tiling_cache", "acl_graph", "ge_sink")
] + [("qwen3_30b_decode", s) for s in ("eager", "mindspore", "acl_graph")] + [
    ("deepseek_v3", s) for s in ("eager", "pipeline", "mindspore", "acl_graph")
]
TABLE_EXTRA_NOTES = {("deepseek_v3", "eager"): "fitted to seed 004", ("qwen3_30b_decode", "eager"): "fitted to seed 004"}
TABLE_HEADER = "| workload | strategy | step ms | tok/s | speed-up | bubble | bound | notes |\n|---|---|---|---|---|---|---|---|\n"


def strategy_table() -> str:
    from harness.results.outputs import run_notes
    from harness.sim.simulate import simulate_run

    lines, eager_tok_s = [], {}
    for workload, strategy in TABLE_ROWS:
        s = simulate_run(compose_run([f"workload={workload}", f"strategy={strategy}", "workload.steps=32"])).summary
        eager_tok_s.setdefault(workload, s["throughput_tok_s"])  # each workload's first row is eager
        notes = "; ".join(n for n in (TABLE_EXTRA_NOTES.get((workload, strategy), ""), run_notes(s)) if n)
        lines.append(
            f"| `{workload}` | `{strategy}` | {s['step_ms_mean']:.2f} | {s['throughput_tok_s']:.1f} |"
            f" {s['throughput_tok_s'] / eager_tok_s[workload]:.2f}× | {s['bubble_ratio']:.2f} | {s['bound']} | {notes} |"
        )
    return TABLE_HEADER + "\n".join(lines) + "\n"


def _readme_table_span(text: str) -> tuple[int, int]:
    start = text.index(TABLE_HEADER)
    end = text.index("\n\n", start) + 1
    return start, end


@pytest.mark.slow
def test_the_readme_strategy_table_is_what_the_presets_give():
    text = (REPO_ROOT / "README.md").read_text()
    start, end = _readme_table_span(text)
    assert text[start:end] == strategy_table(), "README strategy table is stale: run `python tests/test_readme.py`"


if __name__ == "__main__":
    readme = REPO_ROOT / "README.md"
    text = readme.read_text()
    start, end = _readme_table_span(text)
    readme.write_text(text[:start] + strategy_table() + text[end:])
    print(f"rewrote the strategy table in {readme}")
