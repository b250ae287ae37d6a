"""Rollout sources, the RolloutBatch they produce, and the packed micro-batch iterator."""
