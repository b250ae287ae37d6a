"""slime_hydra: cap-safe, balanced micro-batch schedules for RL rollouts on Megatron."""

__version__ = "0.1.0"
