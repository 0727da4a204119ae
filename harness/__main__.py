"""`python -m harness [overrides]` — the thin Hydra entry point.

The @hydra.main function must live in this file: run as `__main__`, Hydra resolves config_path
relative to it (../conf), which works from any working directory.
"""
import sys

import hydra
from omegaconf import DictConfig

from harness.cli import preflight, run_from_hydra
from harness.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    return run_from_hydra(cfg)


if __name__ == "__main__":
    preflight(sys.argv[1:])
    main()
