"""What a simulated run gives back: the summary, the steps table, the simulated tasks and the workload.

A module of its own so that the views of a run (terminal, files, timeline, MLflow) depend on the result,
not on the code that produced it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from harness.base.errors import TrackingError


if TYPE_CHECKING:  # annotations only: the MLflow logging process imports this module, and needs no Numba
    import pandas as pd

    from harness.model.ops import Workload
    from harness.sim.kernel import SimulationResult


def shown_steps(measured: np.ndarray, count: int) -> np.ndarray:
    """The steps trace.json shows: the first `count` measured ones, by number. A graph build after the first
    measured step (a sink load as the KV length crosses a bucket) is not one of them: shown, its load
    read as the device idle in steady state."""
    return np.flatnonzero(measured)[: max(int(count), 0)]


def drawn_steps(measured: np.ndarray, count: int) -> tuple[int, int]:
    """First and last step timeline.png draws: a stretch of time, so consecutive measured steps only (no
    build inside it, for the reason of `shown_steps`): the first `count` of the first stretch that long,
    else of the longest (the earliest of equals)."""
    steps = np.flatnonzero(measured)
    breaks = np.flatnonzero(np.diff(steps) != 1) + 1
    starts, ends = np.r_[0, breaks], np.r_[breaks, steps.size]  # each stretch: steps[start:end]
    lengths = ends - starts
    long_enough = np.flatnonzero(lengths >= count)
    pick = long_enough[0] if long_enough.size else int(np.argmax(lengths))
    first = int(steps[starts[pick]])
    return first, first + int(min(max(count, 1), lengths[pick])) - 1


# Summary keys measured on the wall clock (how long this process took, compilation included): the
# only ones that differ between runs of the same config and seed.
WALL_CLOCK_KEYS = frozenset({"sim_wall_s", "compile_s"})


# Summary keys that say what ran (the config's sizes, seed and overrides) rather than what was measured:
# MLflow has them as params, not metrics.
# The workload's own keys among them (summary key = workload.<key>, enums as their value).
WHAT_RAN_WORKLOAD_KEYS = (
    "batch_size", "context_len", "phase", "quant", "kernels", "kv_cache_dtype", "decode_kv_reads", "tp", "dp", "ep", "steps", "warmup_steps",
)
# Workload sizes a serving run does not read (its batches and KV lengths are its requests'): null in what
# ran, and no MLflow param (the compare views placed every serving run at batch 1).
UNREAD_IN_SERVING = ("batch_size", "context_len")
WHAT_RAN_KEYS = (*WHAT_RAN_WORKLOAD_KEYS, "serving", "seed", "overrides", "config_hash", "setting_hash", "strategy_changes")
# The param (flattened config key) each of them is in MLflow; `overrides`, `setting_hash` and `strategy_changes` are tags there,
# `config_hash` is not kept.
WHAT_RAN_PARAMS = {
    **{key: f"workload.{key}" for key in WHAT_RAN_WORKLOAD_KEYS},
    "serving": "workload.serving.enabled",
    "seed": "seed",
}


def without_wall_clock(summary: dict) -> dict:
    """The summary's simulated figures: identical for the same config and seed."""
    return {k: v for k, v in summary.items() if k not in WALL_CLOCK_KEYS}


@dataclass
class RunResult:
    summary: dict
    step_columns: dict[str, np.ndarray]  # the steps table, one array per column (steps.parquet holds them)
    result: Optional[SimulationResult]  # None when reused from a finished run (resume=true)
    workload: Optional[Workload]
    tracking_error: Optional[TrackingError] = None  # why MLflow did not take the run (its files are complete)
    resumed_from: Optional[Path] = None  # a finished run of the same configuration, reused (resume=true)

    @cached_property
    def steps(self) -> "pd.DataFrame":
        """The steps table as a DataFrame. Built on first use: importing pandas is a quarter of a
        default run's start-up, and writing a run's files needs only the columns."""
        import pandas as pd

        return pd.DataFrame(self.step_columns)


# What a run all of whose measured steps build their graph says (sim/metrics.py; its figures hold the
# builds): the terminal then does not call the builds "outside the steady state" (harness.results.outputs).
# Here, not in metrics: the processes that draw and log import outputs without Numba.
ALL_BUILDS_NOTE = ("every measured step builds its graph: the figures include the capture or load (capture_ms too);"
                   " a replay needs a step of a shape built before: raise workload.steps, or coarsen the shape buckets")
