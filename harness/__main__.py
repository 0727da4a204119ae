"""`python -m harness [overrides]` — the thin Hydra entry point.

The @hydra.main function must live in this file; its config_path is the absolute conf/ directory of
a source checkout or of an installed wheel (harness.config.CONF_DIR), found from any working directory.
"""
import sys

import hydra
from omegaconf import DictConfig

from harness.cli import normalize_argv, preflight, run_from_hydra
from harness.config import CONF_DIR, register_configs
from harness.sweep import SweepStopped, fail_unfinished_sweep, finish_stopped_sweep

register_configs()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> float:
    return run_from_hydra(cfg)


def run() -> None:
    """`python -m harness` and the `hostbound` command: check the overrides, then let Hydra run."""
    sys.argv[1:] = normalize_argv(sys.argv[1:])
    preflight(sys.argv[1:])
    try:
        main()
    except SweepStopped as stopped:
        finish_stopped_sweep(stopped)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            fail_unfinished_sweep()
        raise


if __name__ == "__main__":
    run()
