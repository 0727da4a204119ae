"""Layer 1, base: what every layer uses and that knows nothing of the simulation — errors and exit
statuses, atomic file writes, the progress line, stopping between store calls."""
