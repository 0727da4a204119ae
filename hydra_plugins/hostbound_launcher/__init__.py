"""Hydra instantiates a launcher only if its class is defined in the `hydra_plugins` package (it finds
plugins by scanning it and knows each class by its defining module): this names harness's launcher there,
as hydra.launcher._target_ in conf/hydra/launcher/hostbound.yaml."""
from harness.launcher import WarmWorkerLauncher


class HostboundLauncher(WarmWorkerLauncher):
    """harness.launcher.WarmWorkerLauncher: a sweep's jobs in warm worker processes forked from it."""


__all__ = ["HostboundLauncher"]
