"""The parts of benchmarks/gpu_check.py (trainer=gpu on one lent H200), a module each: settings,
wheels, figures, runs and results are pure and tested on CPU (tests/unit/test_gpu_check.py);
runner runs the check on the device machine; probe is its CUDA child process. Each imports only
the standard library at the top, so `gpu_check.py wheels` runs under any python3."""
