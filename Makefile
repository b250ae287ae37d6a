# make run [ARGS="overrides..."]  — set up .venv if needed, then run the main job.
# make test                       — set up .venv if needed, then lint and run every test.
# make bench                      — print the scheduling, iterator and training benchmarks.
PY := .venv/bin/python
VENV := .venv/.installed

$(VENV): pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	# Pinned first: this machine's pip takes the CPU wheel from local disk.
	.venv/bin/pip install -q torch==2.13.0
	.venv/bin/pip install -q -e '.[dev]'
	touch $@

.PHONY: run test bench
run: $(VENV)
	$(PY) -m slime_hydra $(ARGS)

test: $(VENV)
	$(PY) -m ruff check .
	$(PY) -m pytest

bench: $(VENV)
	$(PY) benchmarks/bench_planner.py
	$(PY) benchmarks/bench_schedule.py
	$(PY) benchmarks/bench_iterator.py
	$(PY) benchmarks/bench_train.py
