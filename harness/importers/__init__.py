"""Importers: real profiler traces → what they measured, and an op list the harness can replay.

`load_profile` reads a file with the reader its content calls for (`kineto.py`: PyTorch profiler /
Kineto JSON on CUDA or HIP; `torch_npu.py`: Ascend trace_view.json) into a `Profile`
(`events.py`); `core.py` links, splits into steps, measures and writes the op list. An importer never
simulates: replaying its op list (`workload=trace`) is what checks the simulator.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from harness.importers.events import READ_LIMIT_MB, Profile, ProfileError, read_json
from harness.importers.kineto import read_kineto
from harness.importers.torch_npu import is_torch_npu, read_torch_npu

__all__ = ["READ_LIMIT_MB", "Profile", "ProfileError", "load_profile"]


def load_profile(path: str | Path, rank: Optional[int] = None, read_limit_mb: int = READ_LIMIT_MB) -> Profile:
    """Read a trace file (`.json` or `.json.gz`, at most `read_limit_mb` MiB read and inflated) of either
    format; raises ProfileError naming the file."""
    path = Path(path)
    data = read_json(path, read_limit_mb)
    if not isinstance(data, (dict, list)):
        raise ProfileError(f"{path}: not a profiler trace (JSON {type(data).__name__}, expected an object or a list of events)")
    if is_torch_npu(data):
        return read_torch_npu(path, data, rank)
    return read_kineto(path, data, rank)
