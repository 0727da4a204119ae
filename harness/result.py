"""What a simulated run gives back: the summary, the steps table, the simulated tasks and the workload.

A module of its own so that the views of a run (terminal, files, timeline, MLflow) depend on the result,
not on the code that produced it.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from harness.core import SimulationResult
from harness.ops import Workload


@dataclass
class RunResult:
    summary: dict
    steps: pd.DataFrame
    result: SimulationResult
    workload: Workload
