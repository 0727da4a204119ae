"""`python -m harness [overrides]` — the thin Hydra entry point.

The @hydra.main function must live in this file; its config_path is the absolute conf/ directory of
a source checkout or of an installed wheel (harness.config.paths.CONF_DIR), found from any working directory.
"""
import gc

# The imports below make ~300k long-lived objects (numba, pandas, mlflow, Hydra); collecting while they
# are made costs ~1 s of a run's start and scanning them again in every later full collection costs a
# sweep ~30 ms a job. So no collection until they exist, and then they are left out of collections.
gc.disable()

import sys  # noqa: E402

from harness.results import drawer  # noqa: E402  (these two: the standard library only)
from harness.tracking import early as early_tracking  # noqa: E402

if __name__ == "__main__":  # before the imports below, which the helper processes need not wait for
    drawer.start_early(sys.argv[1:])
    early_tracking.start_early(sys.argv[1:])

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from harness.cli.command import exit_now, normalize_argv, preflight, run_from_hydra  # noqa: E402
from harness.config.compose import register_configs  # noqa: E402
from harness.config.paths import CONF_DIR  # noqa: E402
from harness.base.stopping import SweepStopped  # noqa: E402
from harness.sweep.callbacks import fail_unfinished_sweep, finish_stopped_sweep  # noqa: E402

from harness.sweep import compose_cache  # noqa: E402
from hydra_plugins import hostbound_launcher  # noqa: E402

register_configs()
hostbound_launcher.register()
compose_cache.install()  # the checks before Hydra, Hydra itself and a sweep's jobs compose from one cache
gc.freeze()
gc.enable()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> float:
    return run_from_hydra(cfg)


def run() -> None:
    """`python -m harness` and the `hostbound` command: check the overrides, then let Hydra run."""
    drawer.start_early(sys.argv[1:])  # the `hostbound` command (`python -m harness` did it above)
    early_tracking.start_early(sys.argv[1:])
    try:
        sys.argv[1:] = normalize_argv(sys.argv[1:])
        preflight(sys.argv[1:])
        try:
            main()
        except SweepStopped as stopped:
            finish_stopped_sweep(stopped)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            fail_unfinished_sweep()
        exit_now(exit_.code)
    exit_now(0)


if __name__ == "__main__":
    run()
