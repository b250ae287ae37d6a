"""Run reports: PNG plots from run and sweep dirs (`python -m slime_hydra.report DIR...`)."""
