"""What computes a training step: the megatron-core model chunks and packed attention, the policy
loss, the optimizer, the engine on megatron's schedules, the CPU shim and the HF bridge. Torch
and megatron throughout; no launcher, process or run-dir code (that is train/run/)."""
