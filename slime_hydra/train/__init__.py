"""Training: distributed set-up, the megatron-core model, the policy loss and FLOPs arithmetic."""
