"""Layer 2, config: the run schema (dataclasses Hydra composes into), value limits, composition
from conf/, and the one-line messages for bad input. Knows no model, no simulation."""
