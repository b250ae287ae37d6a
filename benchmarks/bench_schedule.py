"""Scheduling benchmark: the quality of dynamic batching beside its peers on one grid of traces.

Run `python benchmarks/bench_schedule.py` (a few minutes) or with `--quick` (a smaller grid).
Prints the table and a PASS/FAIL summary per target; the exit status is 0 either way (the
figures are the result). Plan time and the scale curve on random families are
benchmarks/bench_planner.py's.

Peers, written from their documented algorithms (benchmarks/baselines.py): slime's current
pack-first (first-fit, split to a multiple of dp·g, deal round-robin) and verl's
rearrange_micro_batches (KK into the all-reduced count ceil(tokens / max_token_len)).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from baselines import pack_first, verl_rearrange
from omegaconf import OmegaConf

from slime_hydra.data.synthetic import SyntheticGRPO
from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition.bounds import max_part_lower_bound
from slime_hydra.schedule import (
    DynamicBatching,
    ParallelLayout,
    SlimeLegacyBatching,
    StepSchedule,
    microbatch_lower_bound,
    step_metrics,
)
from slime_hydra.schedule.cost import ModelDims, flops_coefficients

FREE_CAP = 1 << 62
MAX_PROMPT_LEN = 1024
RESPONSE_MEDIAN = 2048
ROOT = Path(__file__).resolve().parents[1]
# The cost a·L + b·L² of conf/model/qwen2_5_7b.yaml: what balance=flops and plan mode use.
FLOPS = flops_coefficients(
    ModelDims.from_mapping(
        OmegaConf.to_container(OmegaConf.load(ROOT / "conf/model/qwen2_5_7b.yaml"))
    )
)


@dataclass
class Target:
    """One named target and whether it was met, with the figure that decides it."""

    name: str
    passed: bool
    detail: str


def grpo_lengths(num_samples: int, max_response_len: int, seed: int) -> tuple[list[int], list[int]]:
    """Total lengths and group ids of a synthetic GRPO rollout (8 samples per prompt)."""
    batch = SyntheticGRPO(
        num_prompts=num_samples // 8,
        n_samples_per_prompt=8,
        max_prompt_len=MAX_PROMPT_LEN,
        response_len_median=RESPONSE_MEDIAN,
        max_response_len=max_response_len,
        seed=seed,
    ).load()
    return [int(n) for n in batch.total_lengths], [int(g) for g in batch.group_ids]


def truncation_lengths(num_samples: int, cap: int, seed: int) -> list[int]:
    """A truncation-heavy step: 35% of samples just over cap/2 (responses cut at the limit),
    50% short, and a long tail of 15% between 0.6 and 1.0 × cap."""
    rng = np.random.default_rng(seed)
    kind = rng.random(num_samples)
    just_over = rng.integers(cap // 2 + 1, int(cap * 0.56), num_samples)
    short = np.clip(rng.lognormal(np.log(cap / 10), 0.6, num_samples), 16, cap // 2).astype(int)
    tail = rng.integers(int(cap * 0.6), cap + 1, num_samples)
    out = np.where(kind < 0.35, just_over, np.where(kind < 0.85, short, tail))
    return [int(n) for n in out]


def min_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Least CPU time in seconds over `repeats` calls (the least disturbed by other load on
    the machine), and the last result."""
    times = []
    result = None
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
    return min(times), result


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A right-aligned plain-text table."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[j]) for row in cells) for j in range(len(header))]
    print(f"\n== {title}")
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


@dataclass
class Result:
    """One method's figures on one case."""

    k: int
    violations: int
    empty: int
    max_over_lb: float
    token_imb: float
    flops_imb: float
    flops_over_lb: float
    dp_flops_imb: float
    dp_token_imb: float
    ms: float


@dataclass
class Case:
    """One quality-grid case and every method's figures."""

    label: str
    k_lb: int
    results: dict[str, Result | None]
    legacy: dict[str, str]


METHODS = ("ours", "ours_flops", "slime_pf", "verl", "verl_at_k")


def measure(
    ranks: list, lengths: Sequence[int], cap: int, layout: ParallelLayout, ms: float
) -> Result:
    step = StepSchedule.build(0, ranks)
    m = step_metrics(step, lengths, cap, layout, FLOPS)
    a, b = FLOPS
    # Costs in units of 2^-30 of the costliest sample: integers the bound sums without overflow.
    exact = np.asarray(lengths, dtype=np.float64)
    exact = a * exact + b * exact * exact
    cost = np.rint(exact * ((1 << 30) / exact.max())).astype(np.int64).tolist()
    mbs = [mb for rank in step.ranks for mb in rank]
    flops_max = max(sum(cost[i] for i in mb) for mb in mbs)
    flops_lb = max_part_lower_bound(cost, len(mbs), upper=flops_max, rel_tol=1e-4)
    return Result(
        k=m["batch/num_microbatches"],
        violations=m["batch/cap_violations"],
        empty=m["batch/empty_microbatches"],
        max_over_lb=m["batch/mb_tokens_max"] / m["batch/mb_tokens_lb"],
        token_imb=m["batch/token_imbalance"],
        flops_imb=m["batch/flops_imbalance"],
        flops_over_lb=flops_max / flops_lb,
        dp_flops_imb=m["batch/dp_flops_imbalance"],
        dp_token_imb=m["batch/dp_token_imbalance"],
        ms=ms,
    )


def run_case(trace: str, dp: int, vpp: int, cap: int, n: int, seed: int) -> Case:
    """Plan one step with every method and the two slime presets; measure them alike."""
    if vpp > 1:
        layout = ParallelLayout(dp=dp, pp=2, vpp=vpp, microbatch_group_size_per_vp_stage=2)
    else:
        layout = ParallelLayout(dp=dp)
    align = layout.microbatch_alignment
    if trace == "grpo":
        lengths, _ = grpo_lengths(n, min(16384, cap - MAX_PROMPT_LEN), seed)
    else:
        lengths = truncation_lengths(n, cap, seed)
    samples = list(range(n))
    flops = DynamicBatching(layout, None, cap, balance="flops", flops_coefficients=FLOPS)
    planners: dict[str, Callable[[], Sequence]] = {
        # Their nested lists, as the others return them.
        "ours": lambda: DynamicBatching(layout, None, cap).plan_step(lengths, samples, 0).ranks,
        "ours_flops": lambda: flops.plan_step(lengths, samples, 0).ranks,
        "slime_pf": partial(pack_first, lengths, samples, dp, cap, align),
        "verl": partial(verl_rearrange, lengths, samples, dp, cap, align),
    }
    results: dict[str, Result | None] = {}
    # verl's algorithm at ours_flops's K: the FLOPs comparison at equal micro-batch count.
    planners["verl_at_k"] = lambda: verl_rearrange(
        lengths, samples, dp, cap, align, num_micro_batches=results["ours_flops"].k
    )
    for name, planner in planners.items():
        try:
            t, ranks = min_time(planner, 1)
        except ValueError:  # pack-first with no bin left to split
            results[name] = None
            continue
        results[name] = measure(ranks, lengths, cap, layout, t * 1e3)
    legacy = {}
    for preset, rounding, fallback in (("slime_1848", "down", False), ("slime_1823", "up", True)):
        strategy = SlimeLegacyBatching(layout, None, cap, rounding, fallback, preset=preset)
        try:
            m = step_metrics(strategy.plan(lengths, samples).steps[0], lengths, cap, layout, FLOPS)
            legacy[preset] = (
                f"{m['batch/num_microbatches']}/{m['batch/cap_violations']}/"
                f"{m['batch/empty_microbatches']}"
            )
        except SlimeHydraError:
            legacy[preset] = "crash"
    return Case(
        label=f"{trace} dp={dp} vpp={vpp} cap={cap} n={n}",
        k_lb=microbatch_lower_bound(lengths, cap, dp, align),
        results=results,
        legacy=legacy,
    )


def _fmt(r: Result | None, key: str, spec: str) -> str:
    return "-" if r is None else format(getattr(r, key), spec)


def bench_quality(
    traces: Sequence[str],
    dps: Sequence[int],
    vpps: Sequence[int],
    caps: Sequence[int],
    runs: Sequence[tuple[int, int]],
) -> list[Target]:
    """The grid: per case and method, K vs its bound, the largest micro-batch vs its proven
    bound, cap violations, token and FLOPs imbalance, plan time as a ratio to ours."""
    cases = [
        run_case(trace, dp, vpp, cap, n, seed)
        for trace in traces
        for dp in dps
        for vpp in vpps
        for cap in caps
        for n, seed in runs
    ]
    rows = []
    for c in cases:
        ours = c.results["ours"]
        assert ours is not None
        for name in METHODS:
            r = c.results[name]
            ratio = "-" if r is None else f"{r.ms / ours.ms:.1f}x"
            rows.append(
                [
                    c.label if name == "ours" else "",
                    name,
                    _fmt(r, "k", "d"),
                    c.k_lb,
                    _fmt(r, "violations", "d"),
                    _fmt(r, "empty", "d"),
                    _fmt(r, "max_over_lb", ".4f"),
                    _fmt(r, "token_imb", ".3f"),
                    _fmt(r, "flops_imb", ".3f"),
                    _fmt(r, "flops_over_lb", ".4f"),
                    _fmt(r, "dp_token_imb", ".4f"),
                    _fmt(r, "dp_flops_imb", ".4f"),
                    _fmt(r, "ms", ".1f"),
                    ratio,
                    c.legacy["slime_1848"] if name == "ours" else "",
                    c.legacy["slime_1823"] if name == "ours" else "",
                ]
            )
    print_table(
        "Quality per case (one step of n samples; K per rank, K_lb its lower bound (Martello-Toth "
        "L2, what the planner uses and batch/num_microbatches_lb logs); max/LB = "
        "largest micro-batch / proven lower bound at that K (batch/mb_tokens_lb); imbalances "
        "max/mean; flopsmax/LB = largest micro-batch FLOPs / proven bound on it at that K (a "
        "lower K raises the mean, so imbalances compare only at equal K); FLOPs a·L + b·L² of "
        "qwen2_5_7b; verl_at_k = verl's algorithm forced to ours_flops's K; ms CPU and its ratio "
        "to ours; legacy columns K/violations/empties or crash)",
        [
            "case",
            "method",
            "K",
            "K_lb",
            "viol",
            "empty",
            "max/LB",
            "tok_imb",
            "flops_imb",
            "flopsmax/LB",
            "dp_tok",
            "dp_flops",
            "ms",
            "vs ours",
            "slime_1848",
            "slime_1823",
        ],
        rows,
    )

    def worst(name: str, key: str) -> str:
        values = [getattr(c.results[name], key) for c in cases if c.results[name] is not None]
        return f"{max(values):.4g} / {statistics.fmean(values):.4g}" if values else "-"

    keys = ("violations", "max_over_lb", "token_imb", "flops_imb", "flops_over_lb", "dp_flops_imb")
    print_table(
        f"Summary over {len(cases)} cases (worst / mean)",
        ["method", *keys],
        [[name, *(worst(name, key) for key in keys)] for name in METHODS],
    )
    checks: list[tuple[str, Callable[[Case], bool]]] = [
        (
            "ours: largest micro-batch <= 1.01 x proven bound, 0 violations, K = K_lb",
            lambda c: (
                c.results["ours"].max_over_lb <= 1.01
                and c.results["ours"].violations == 0
                and c.results["ours"].k == c.k_lb
            ),
        ),
        (
            "flops: micro-batch FLOPs imbalance <= verl's, 0 violations",
            lambda c: (
                c.results["ours_flops"].violations == 0
                and c.results["ours_flops"].flops_imb <= c.results["verl"].flops_imb + 1e-9
            ),
        ),
        (
            "flops at equal K: micro-batch FLOPs imbalance <= verl's at our K, 0 violations",
            lambda c: (
                c.results["ours_flops"].violations == 0
                and c.results["ours_flops"].flops_imb <= c.results["verl_at_k"].flops_imb + 1e-9
            ),
        ),
        (
            "flops: largest micro-batch FLOPs <= 1.01 x proven bound at K",
            lambda c: c.results["ours_flops"].flops_over_lb <= 1.01,
        ),
        (
            "flops: rank FLOPs imbalance <= 1.01",
            lambda c: c.results["ours_flops"].dp_flops_imb <= 1.01,
        ),
    ]
    targets = []
    for name, ok in checks:
        missed = [c for c in cases if not ok(c)]
        targets.append(Target(name, not missed, f"{len(missed)}/{len(cases)} cases miss"))
        for c in missed:
            o, f, v = c.results["ours"], c.results["ours_flops"], c.results["verl"]
            why = ""
            if v.k < c.k_lb:
                why = (
                    f"; verl's K={v.k} is below K_lb={c.k_lb}, so it breaks the cap "
                    f"({v.violations} violations): no cap-safe schedule has that few, and ours "
                    f"is at {f.flops_over_lb:.4f} x the proven FLOPs bound at its K"
                )
            print(
                f"  MISS [{name}] {c.label}: K={o.k} K_lb={c.k_lb} max/LB={o.max_over_lb:.4f} "
                f"flops_imb={f.flops_imb:.3f} (verl {v.flops_imb:.3f} at K={v.k}) "
                f"dp_flops={f.dp_flops_imb:.4f}{why}"
            )
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    """Run every part of the benchmark and print the target summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small grid, single repeats")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    targets = (
        bench_quality(["grpo", "truncation"], [8, 32], [1, 2], [16384], [(1024, 0)])
        if args.quick
        else bench_quality(
            ["grpo", "truncation"], [8, 32], [1, 2], [12288, 16384], [(2048, 1), (4096, 2)]
        )
    )
    print_table(
        f"Targets ({time.perf_counter() - start:.0f} s in all)",
        ["result", "target", "measured"],
        [["PASS" if t.passed else "FAIL", t.name, t.detail] for t in targets],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
