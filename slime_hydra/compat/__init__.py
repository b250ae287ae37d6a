"""Drop-ins for the partition calls of slime and verl, in their names and signatures, backed by
slime_hydra's planner: `compat.slime` and `compat.verl` (docs/compat.md). Pure: no torch."""
