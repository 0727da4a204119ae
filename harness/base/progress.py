"""Progress on the terminal for long runs and sweeps; silent when stderr is not a terminal (logs, CI)."""
from __future__ import annotations

import sys
import time


class Progress:
    """One status line, rewritten in place, at most every `every_s` seconds."""

    def __init__(self, label: str, every_s: float = 0.5, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.label = label
        self.every_s = every_s
        self._last = 0.0
        self._shown = False

    def update(self, message: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if force or now - self._last >= self.every_s:
            self.stream.write(f"\r\033[K{self.label}: {message}")
            self.stream.flush()
            self._last = now
            self._shown = True

    def done(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
