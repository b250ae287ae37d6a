"""Running the check on the device machine: each CLI run under one time budget with
nvidia-smi's memory polled beside it, the probe in a child process, then the results."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .figures import largest_safe_micro_batch_size, load_dims, param_count
from .results import assemble_results, result_table
from .runs import (
    RunSpec,
    calibration_file,
    calibration_runs,
    cli_command,
    fp16_run,
    loss_runs,
    skip_reason,
    throughput_runs,
)
from .settings import (
    CALIBRATION_FILE,
    GROUPS,
    PROBE_MIN_S,
    REPO,
    THROUGHPUT_CAP,
    THROUGHPUT_DATA,
    THROUGHPUT_GBS,
    THROUGHPUT_MODEL,
)


class MemoryPoller:
    """Peak `nvidia-smi` memory.used (MiB, the whole card: CUDA contexts and allocator caches
    included) while a run goes: a fallback when perf/max_memory_gib is missing."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                used = int(
                    subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.split()[0]
                )
                self.peak = max(self.peak or 0, used)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MemoryPoller:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl rows (a half-written last line is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


def _kill_group(proc: subprocess.Popen) -> None:
    """End the run's process group (the app and the workers it started), TERM then KILL."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 20)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


class Runner:
    """Starts runs of the app under one deadline and keeps their records."""

    def __init__(self, root: Path, log_dir: Path, deadline: float) -> None:
        self.root, self.log_dir, self.deadline = root, log_dir, deadline
        self.records: dict[str, dict[str, Any]] = {}

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def start(self, spec: RunSpec) -> tuple[subprocess.Popen, Path, float, Any]:
        run_dir = self.root / spec.name
        shutil.rmtree(run_dir, ignore_errors=True)
        log = (self.log_dir / f"run_{spec.name}.log").open("w")
        cmd = cli_command(sys.executable, run_dir, spec)
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="1", WANDB_MODE="disabled")
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        print(f"[gpu_check] {spec.name}: started ({self.remaining():.0f} s left)", flush=True)
        return proc, run_dir, time.monotonic(), log

    def finish(
        self,
        spec: RunSpec,
        proc: subprocess.Popen,
        run_dir: Path,
        began: float,
        log: Any,
        poller: MemoryPoller | None = None,
    ) -> dict[str, Any]:
        limit = min(spec.timeout_s, max(self.remaining(), 1.0))
        status = None
        stopped = False
        metrics = run_dir / "metrics.jsonl"
        while status is None:
            if proc.poll() is not None:
                status = "ok" if proc.returncode == 0 else "failed"
            elif spec.stop_after_rows and len(read_rows(metrics)) >= spec.stop_after_rows:
                _kill_group(proc)
                status, stopped = "ok", True
            elif time.monotonic() - began > limit:
                _kill_group(proc)
                status = "timeout"
            else:
                time.sleep(0.5)
        _kill_group(proc)  # leftovers of a finished run, if any
        log.close()
        text = (self.log_dir / f"run_{spec.name}.log").read_text(errors="replace")
        if status == "failed" and re.search(r"CUDA out of memory|OutOfMemoryError", text):
            status = "oom"
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        schedule_path = run_dir / "schedule.json"
        record = {
            "group": spec.group,
            "status": status,
            "returncode": proc.returncode,
            "stopped_after_metrics": stopped,
            "seconds": round(time.monotonic() - began, 1),
            "cap": spec.cap,
            "overrides": list(spec.overrides),
            "rows": read_rows(metrics),
            "schedule": json.loads(schedule_path.read_text()) if schedule_path.is_file() else None,
            "log_tail": text[-4000:] if status != "ok" else text[-600:],
            "nvidia_smi_peak_mib": poller.peak if poller else None,
        }
        self.records[spec.name] = record
        print(
            f"[gpu_check] {spec.name}: {status} in {record['seconds']} s, "
            f"{len(record['rows'])} rows",
            flush=True,
        )
        return record

    def skip(self, spec: RunSpec, why: str) -> None:
        print(f"[gpu_check] {spec.name}: skipped ({why})", flush=True)
        self.records[spec.name] = {
            "group": spec.group,
            "status": "skipped",
            "cap": spec.cap,
            "overrides": list(spec.overrides),
            "why": why,
            "rows": [],
        }

    def run(self, spec: RunSpec, min_left_s: float = 45) -> dict[str, Any] | None:
        if self.remaining() < min_left_s:
            self.skip(spec, f"{self.remaining():.0f} s left of the budget")
            return None
        with MemoryPoller() as poller:
            proc, run_dir, began, log = self.start(spec)
            return self.finish(spec, proc, run_dir, began, log, poller)


def check(out: Path, budget_s: float, work: Path, only: Sequence[str] = GROUPS) -> int:
    """The whole check (see the module docstring); writes out/gpu_check.json."""
    began = time.monotonic()
    deadline = began + budget_s
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(work / "runs", work, deadline)
    (work / "runs").mkdir(exist_ok=True)

    from slime_hydra.data.synthetic import SyntheticGRPO
    from slime_hydra.schedule.cost import flops_coefficients

    dims = load_dims(THROUGHPUT_MODEL)
    coefficients = flops_coefficients(dims)
    params = param_count(dims)
    lengths = [int(x) for x in SyntheticGRPO(**THROUGHPUT_DATA).load().total_lengths]
    safe_mbs = largest_safe_micro_batch_size(lengths, THROUGHPUT_CAP, THROUGHPUT_GBS)
    rollout = {
        **THROUGHPUT_DATA,
        "global_batch_size": THROUGHPUT_GBS,
        "samples": len(lengths),
        "tokens": sum(lengths),
        "max_len": max(lengths),
        "mean_len": sum(lengths) / len(lengths),
    }
    print(
        f"[gpu_check] {THROUGHPUT_MODEL}: {params / 1e9:.3f}B parameters; rollout "
        f"{rollout}; safe fixed micro_batch_size at cap {THROUGHPUT_CAP}: {safe_mbs}",
        flush=True,
    )

    # Headline figures first (GROUPS' order). The CPU loss run goes alongside the GPU one.
    if "loss" in only:
        gpu_loss, cpu_loss = loss_runs()
        cpu_started = runner.start(cpu_loss)
        runner.run(gpu_loss)
        runner.finish(cpu_loss, *cpu_started)

    for spec in throughput_runs(safe_mbs):
        if spec.group not in only:
            continue
        why = skip_reason(spec, runner.records)
        if why:
            runner.skip(spec, why)
        else:
            runner.run(spec, min_left_s=60 if spec.group == "throughput" else 50)

    if "fp16" in only:
        runner.run(fp16_run())

    probe = None
    if "probe" in only:
        if runner.remaining() < PROBE_MIN_S:
            probe = {"error": f"skipped: {runner.remaining():.0f} s left of the budget"}
        else:
            probe = run_probe(work, min(150.0, runner.remaining()))
        print(f"[gpu_check] probe: {json.dumps(probe, default=str)[:1500]}", flush=True)

    calibration = None
    if "calibration" in only:
        calibrate, calibrated = calibration_runs(runner.root)
        record = runner.run(calibrate, min_left_s=120)
        path = calibration_file(runner.root)
        if record and record["status"] == "ok" and path.is_file():
            shutil.copy(path, out / CALIBRATION_FILE)
            calibration = json.loads(path.read_text())
            runner.run(calibrated, min_left_s=60)
        else:
            runner.skip(calibrated, "no calibration file")

    results = assemble_results(
        date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        elapsed_s=time.monotonic() - began,
        probe=probe,
        runs=runner.records,
        coefficients=coefficients,
        params=params,
        safe_mbs=safe_mbs,
        rollout=rollout,
        calibration=calibration,
    )
    (out / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str))
    logs = sorted(work.glob("run_*.log"))
    with (out / "runs.log").open("w") as f:
        for path in logs:
            f.write(f"===== {path.name}\n{path.read_text(errors='replace')[-20000:]}\n")
    print(result_table(results), flush=True)
    print(f"[gpu_check] wrote {out / 'gpu_check.json'}", flush=True)
    return 0


def run_probe(work: Path, timeout_s: float) -> dict[str, Any]:
    """`probe` in a child process (this process never touches CUDA); its JSON or the error."""
    path = work / "probe.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, str(REPO / "benchmarks/gpu_check.py"), "probe", "--json", str(path)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        return {
            "error": f"probe timed out after {timeout_s:.0f} s",
            "log_tail": str(exc.stdout or "")[-3000:],
        }
    (work / "run_probe.log").write_text(proc.stdout + proc.stderr)
    if path.is_file():
        return json.loads(path.read_text())
    tail = (proc.stdout + proc.stderr)[-3000:]
    return {"error": f"probe exited {proc.returncode}", "log_tail": tail}
