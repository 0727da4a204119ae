"""Hydra instantiates a launcher only if its class is defined in the `hydra_plugins` package (it finds
plugins by scanning it and knows each class by its defining module): this names harness's launcher there,
as hydra.launcher._target_ in conf/hydra/launcher/hostbound.yaml."""
from harness.sweep.launcher import WarmWorkerLauncher


class HostboundLauncher(WarmWorkerLauncher):
    """harness.sweep.launcher.WarmWorkerLauncher: a sweep's jobs in warm worker processes forked from it."""


def register() -> None:
    """Hydra finds plugins by scanning the hydra_plugins package, which misses an editable install's
    modules (setuptools maps them with an import hook that the scan cannot list): the entry point
    registers this one by hand before Hydra starts."""
    from hydra.core.plugins import Plugins

    Plugins.instance().register(HostboundLauncher)


__all__ = ["HostboundLauncher", "register"]
