"""What runs a training job: the checks before launch and the hand-off (start.py), plan mode's
simulation, the elastic launcher, the worker, the step loop, checkpoints, process groups, nodes,
torchrun's environment and each rank's output. The job goes one way down: start → launch →
worker → (engine from train/step/, resume, loop, close)."""
