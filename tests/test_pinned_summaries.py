"""The README's commands give the same summary.json, byte for byte (wall-clock keys aside), before and
after a change that must not change behaviour (a refactor, a speed-up).

Each job below is a single run or one job of a sweep from the README; its summary.json is written as
`python -m harness` writes it (composed from conf/, checked, simulated, written by `execute`) and
compared with tests/data/pinned_summaries.json. A model change that moves numbers on purpose rewrites
that file with `python tests/test_pinned_summaries.py` and says why in its commit.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

PINNED_FILE = Path(__file__).parent / "data" / "pinned_summaries.json"
WALL_CLOCK_KEYS = ("compile_s", "sim_wall_s")

# The README's run commands and sweeps (each sweep's jobs one by one), tracking off: files only.
JOBS: list[list[str]] = [
    [],
    ["strategy=pipeline"],
    ["workload=llama2_7b_prefill"],
    ["workload.batch_size=16", "workload.context_len=4096", "hardware.host.threads=2"],
    ["strategy=acl_graph", "workload=deepseek_v3"],
    ["hardware=h100", "workload=llama31_8b_decode", "strategy=cuda_graph", "engine=vllm_v0_5", "workload.serving.enabled=true"],
    *[[f"strategy={s}", f"workload={w}"] for s in ("eager", "acl_graph") for w in ("llama2_7b_decode", "qwen3_30b_decode")],
    *[[f"strategy={s}"] for s in ("async",)],
    *[[f"workload.batch_size={b}", "strategy=pipeline"] for b in (1, 8, 32, 64)],
    *[[f"hardware.link.pcie_gbps={g}", "workload=llama2_7b_prefill"] for g in (16, 32, 64)],
    ["+experiment=a2_deepseek_acl_graph"],
]


def summary_text(overrides: list[str], run_dir: Path) -> str:
    """summary.json of `python -m harness OVERRIDES tracking.enabled=false`, wall-clock keys dropped."""
    from omegaconf import OmegaConf

    from harness.config.compose import register_configs, to_run_config
    from harness.config.paths import CONF_DIR
    from harness.config.schema import flatten
    from harness.cli.job import execute
    from hydra import compose, initialize_config_dir

    overrides = [*overrides, "tracking.enabled=false"]
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    run = to_run_config(cfg)
    run.output.timeline_steps = run.output.steps_drawn()
    params = flatten(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    params["output.timeline_steps"] = run.output.timeline_steps
    execute(run, run_dir, params, tuple(overrides))
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in WALL_CLOCK_KEYS:
        assert key in summary, key  # a renamed wall-clock key would otherwise be compared as a number
        del summary[key]
    return json.dumps(summary, indent=1, sort_keys=True)


def pinned() -> dict[str, str]:
    return json.loads(PINNED_FILE.read_text())


@pytest.mark.parametrize("overrides", JOBS, ids=[" ".join(j) or "defaults" for j in JOBS])
def test_summary_json_is_what_it_was(overrides, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expected = pinned()[" ".join(overrides)]
    assert summary_text(overrides, tmp_path / "run") == expected


def test_every_job_is_pinned_and_every_pin_is_a_job():
    assert sorted(pinned()) == sorted(" ".join(j) for j in JOBS)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        texts = {" ".join(j): summary_text(j, Path(scratch) / str(i)) for i, j in enumerate(JOBS)}
    PINNED_FILE.write_text(json.dumps(texts, indent=1, sort_keys=True) + "\n")
    print(f"pinned {len(texts)} summaries in {PINNED_FILE}", file=sys.stderr)
