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

from harness.base import stopping  # noqa: E402  (the standard library only)

stopping.stop_on_signals()  # Ctrl-C or SIGTERM from here on: one line, no traceback (harness.base.stopping)

with stopping.held():  # a stop during the imports waits for them to end; run() then ends the command
    from harness.results import drawer  # (these two: the standard library only)
    from harness.tracking import early as early_tracking

    if __name__ == "__main__":  # before the imports below, which the helper processes need not wait for
        drawer.start_early(sys.argv[1:])
        early_tracking.start_early(sys.argv[1:])

    import hydra
    from omegaconf import DictConfig

    from harness.base.stopping import Stopped, SweepStopped, exit_now
    from harness.cli.command import normalize_argv, preflight, run_from_hydra
    from harness.config.compose import register_configs
    from harness.config.paths import CONF_DIR
    from harness.sweep.callbacks import fail_unfinished_sweep, finish_stopped_sweep

    from harness.sweep import compose_cache
    from hydra_plugins import hostbound_launcher

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
    try:
        stopping.raise_if_stopped()  # one that came during the imports
        drawer.start_early(sys.argv[1:])  # the `hostbound` command (`python -m harness` did it above)
        early_tracking.start_early(sys.argv[1:])
        sys.argv[1:] = normalize_argv(sys.argv[1:])
        preflight(sys.argv[1:])
        stopping.raise_if_stopped()  # one swallowed on its way up (see raise_if_stopped)
        try:
            main()
        except SweepStopped as stopped:
            finish_stopped_sweep(stopped)
    except Stopped:
        pass  # exit_now says so and ends by the signal
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            fail_unfinished_sweep()
        exit_now(exit_.code)
    exit_now(0)


if __name__ == "__main__":
    run()
