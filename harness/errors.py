"""Error types: one base for everything the harness reports to a user without a traceback."""


class HarnessError(Exception):
    """A problem the harness explains in one line (bad input, an impossible graph)."""


class ConfigError(HarnessError, ValueError):
    """A configuration value is invalid; the message names the key and the value."""


class TrackingError(HarnessError):
    """The tracking store could not take a run whose files are complete; `reason` says why in one line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason
