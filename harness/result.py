"""What a simulated run gives back: the summary, the steps table, the simulated tasks and the workload.

A module of its own so that the views of a run (terminal, files, timeline, MLflow) depend on the result,
not on the code that produced it.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from harness.core import SimulationResult
from harness.ops import Workload


# Summary keys measured on the wall clock (how long this process took, compilation included): the
# only ones that differ between runs of the same config and seed.
WALL_CLOCK_KEYS = frozenset({"sim_wall_s", "compile_s"})


def without_wall_clock(summary: dict) -> dict:
    """The summary's simulated figures: identical for the same config and seed."""
    return {k: v for k, v in summary.items() if k not in WALL_CLOCK_KEYS}


@dataclass
class RunResult:
    summary: dict
    steps: pd.DataFrame
    result: SimulationResult
    workload: Workload
