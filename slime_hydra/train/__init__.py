"""Training, in two parts over plain data: `step/` computes one optimizer step (the megatron-core
model, packed attention, the policy loss, the optimizer, the engine on megatron's schedules, the
CPU shim, the HF bridge) and knows nothing of processes; `run/` runs processes (the checks before
launch, the elastic launcher, the worker, the step loop, checkpoints, process groups, nodes,
torchrun's environment, rank output, and plan mode's simulation). `settings.py` (the trainers'
Hydra-facing settings) and `job.py` (the planned Job) sit below both; run/ imports step/, never
the other way round."""
