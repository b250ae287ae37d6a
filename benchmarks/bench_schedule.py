"""Scheduling benchmark: partitioner speed and balance, planning time, schedule quality.

Run `python benchmarks/bench_schedule.py` (full, a few minutes) or with `--quick` (a smaller
grid and single repeats, well under 30 s). Prints one table per part and a PASS/FAIL summary
per target; the exit status is 0 either way (the figures are the result).
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

from baselines import pack_first, textbook_kk

from slime_hydra.data.synthetic import SyntheticGRPO
from slime_hydra.partition import capped_partition, part_sums
from slime_hydra.schedule import (
    DynamicBatching,
    ParallelLayout,
    SlimeLegacyBatching,
    StepSchedule,
    microbatch_lower_bound,
    step_metrics,
    violations,
)

FREE_CAP = 1 << 62
MAX_PROMPT_LEN = 1024
RESPONSE_MEDIAN = 2048
FLOPS = (1.0, 0.0)  # token counts; the FLOPs imbalance is not a target here


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


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time in seconds over `repeats` calls, and the last result."""
    times = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A right-aligned plain-text table."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[j]) for row in cells) for j in range(len(header))]
    print(f"\n== {title}")
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def bench_partition(repeats: int) -> list[Target]:
    """capped_partition (free, cap not binding) vs textbook KK for n samples into n/64 parts."""
    rows = []
    targets = []
    for n in (512, 2048, 8192):
        lengths, _ = grpo_lengths(n, 16384, seed=n)
        k = n // 64
        bound = max(max(lengths), -(-sum(lengths) // k))
        t_ours, ours = median_time(
            partial(capped_partition, lengths, FREE_CAP, min_parts=k), repeats
        )
        t_kk, kk = median_time(partial(textbook_kk, lengths, k), repeats)
        ours_ratio = max(part_sums(ours, lengths)) / bound
        kk_ratio = max(part_sums(kk, lengths)) / bound
        speedup = t_kk / t_ours
        rows.append(
            [
                n,
                k,
                f"{t_ours * 1e3:.2f}",
                f"{t_kk * 1e3:.2f}",
                f"{speedup:.1f}x",
                f"{ours_ratio:.6f}",
                f"{kk_ratio:.6f}",
            ]
        )
        if n == 8192:
            targets.append(
                Target(
                    "partition n=8192 k=128 speed >= 20x textbook KK",
                    speedup >= 20,
                    f"{speedup:.1f}x",
                )
            )
            targets.append(
                Target(
                    "partition n=8192 k=128 largest part <= 1.01 x bound",
                    ours_ratio <= 1.01,
                    f"{ours_ratio:.6f}",
                )
            )
    print_table(
        "Partitioner: capped_partition(cap=free, min_parts=k) vs textbook_kk "
        f"(median of {repeats}; bound = max(max L, ceil(sum L / k)))",
        ["n", "k", "ours_ms", "kk_ms", "speedup", "ours_max/bound", "kk_max/bound"],
        rows,
    )
    return targets


PLAN_TARGET_MS = {4096: 10.0, 16384: 50.0}


def bench_planning(repeats: int, splits: Sequence[str]) -> list[Target]:
    """One step's plan time, dp=32, cap 16384, per DP split, beside pack_first."""
    cap = 16384
    layouts = {
        "pp1": ParallelLayout(dp=32),
        "pp2vpp2g2": ParallelLayout(dp=32, pp=2, vpp=2, microbatch_group_size_per_vp_stage=2),
    }
    rows = []
    targets = []
    for n, limit in PLAN_TARGET_MS.items():
        lengths, _ = grpo_lengths(n, cap - MAX_PROMPT_LEN, seed=7)
        samples = list(range(n))
        for name, layout in layouts.items():
            align = layout.microbatch_alignment
            t_pf, pf = median_time(
                partial(pack_first, lengths, samples, layout.dp, cap, align), repeats
            )
            for split in splits:
                strategy = DynamicBatching(layout, None, cap, dp_split=split)
                t, ranks = median_time(partial(strategy.plan_step, lengths, samples, 0), repeats)
                rows.append(
                    [
                        n,
                        name,
                        split,
                        f"{t * 1e3:.1f}",
                        len(ranks[0]),
                        f"{t_pf * 1e3:.1f}",
                        len(pf[0]),
                        f"{limit:.0f}",
                    ]
                )
                if split == "auto":
                    targets.append(
                        Target(
                            f"plan {n} samples dp=32 {name} < {limit:.0f} ms",
                            t * 1e3 < limit,
                            f"{t * 1e3:.1f} ms",
                        )
                    )
    print_table(
        f"Planning one step: DynamicBatching(cap={cap}) by dp_split vs pack_first "
        f"(median of {repeats}; auto is the default and is what the target measures)",
        ["n", "layout", "split", "plan_ms", "K", "pf_ms", "pf_K", "target_ms"],
        rows,
    )
    return targets


@dataclass
class Case:
    """One quality-grid case and its measured figures."""

    label: str
    k: int
    lb: int
    pf_k: int
    bad: int
    empty: int
    mb_imb: float
    mb_floor: float
    dp_imb: float
    pf_mb_imb: float
    pf_dp_imb: float
    legacy: dict[str, tuple[int, int, int]]

    @property
    def excess(self) -> float:
        """Micro-batches per rank above the lower bound, as a fraction of it."""
        return self.k / self.lb - 1


def run_case(dp: int, vpp: int, cap: int, n: int, seed: int) -> Case:
    """Plan one step with DynamicBatching, pack_first and the two slime presets; measure."""
    if vpp > 1:
        layout = ParallelLayout(dp=dp, pp=2, vpp=vpp, microbatch_group_size_per_vp_stage=2)
    else:
        layout = ParallelLayout(dp=dp)
    align = layout.microbatch_alignment
    lengths, groups = grpo_lengths(n, min(16384, cap - MAX_PROMPT_LEN), seed)
    samples = list(range(n))

    def metrics(step: StepSchedule) -> dict[str, Any]:
        return step_metrics(step, lengths, cap, layout, FLOPS)

    schedule = DynamicBatching(layout, None, cap).plan(lengths, groups)
    ours = metrics(schedule.steps[0])
    pf = metrics(StepSchedule.build(0, pack_first(lengths, samples, dp, cap, align)))
    legacy = {}
    for preset, rounding, fallback in (("slime_1848", "down", False), ("slime_1823", "up", True)):
        strategy = SlimeLegacyBatching(layout, None, cap, rounding, fallback, preset=preset)
        m = metrics(strategy.plan(lengths, groups).steps[0])
        legacy[preset] = (
            m["batch/num_microbatches"],
            m["batch/cap_violations"],
            m["batch/empty_microbatches"],
        )
    k = ours["batch/num_microbatches"]
    return Case(
        label=f"dp={dp} vpp={vpp} cap={cap} n={n} seed={seed}",
        k=k,
        lb=microbatch_lower_bound(lengths, cap, dp, align),
        pf_k=pf["batch/num_microbatches"],
        bad=len(violations(schedule, layout, groups)),
        empty=ours["batch/empty_microbatches"],
        mb_imb=ours["batch/token_imbalance"],
        mb_floor=max(lengths) * dp * k / sum(lengths),
        dp_imb=ours["batch/dp_token_imbalance"],
        pf_mb_imb=pf["batch/token_imbalance"],
        pf_dp_imb=pf["batch/dp_token_imbalance"],
        legacy=legacy,
    )


def bench_quality(
    dps: Sequence[int], vpps: Sequence[int], caps: Sequence[int], runs: Sequence[tuple[int, int]]
) -> list[Target]:
    """The quality grid: one row per case, then worst/mean per figure and the targets."""
    cases = [
        run_case(dp, vpp, cap, n, seed)
        for dp in dps
        for vpp in vpps
        for cap in caps
        for n, seed in runs
    ]
    rows = [
        [
            c.label,
            c.k,
            c.lb,
            c.pf_k,
            f"{c.excess:+.1%}",
            c.bad,
            c.empty,
            f"{c.mb_imb:.3f}",
            f"{c.mb_floor:.3f}",
            f"{c.dp_imb:.4f}",
            f"{c.pf_mb_imb:.3f}",
            f"{c.pf_dp_imb:.4f}",
            *("/".join(map(str, c.legacy[p])) for p in ("slime_1848", "slime_1823")),
        ]
        for c in cases
    ]
    print_table(
        "Quality on synthetic GRPO steps (all samples <= cap; K = micro-batches per rank; "
        "floor = max L / mean micro-batch at that K; legacy columns: K/cap violations/empties)",
        [
            "case",
            "K",
            "LB",
            "pf_K",
            "K/LB-1",
            "viol",
            "empty",
            "mb_imb",
            "floor",
            "dp_imb",
            "pf_mb_imb",
            "pf_dp_imb",
            "slime_1848",
            "slime_1823",
        ],
        rows,
    )
    figures: dict[str, Callable[[Case], float]] = {
        "invariant violations": lambda c: c.bad,
        "empty micro-batches": lambda c: c.empty,
        "K - pack_first K": lambda c: c.k - c.pf_k,
        "K / LB - 1": lambda c: c.excess,
        "micro-batch token imbalance": lambda c: c.mb_imb,
        "  (its floor max L / mean)": lambda c: c.mb_floor,
        "DP-rank token imbalance": lambda c: c.dp_imb,
        "pack_first micro-batch imbalance": lambda c: c.pf_mb_imb,
        "pack_first DP-rank imbalance": lambda c: c.pf_dp_imb,
        "slime_1848 cap violations": lambda c: c.legacy["slime_1848"][1],
        "slime_1848 empty micro-batches": lambda c: c.legacy["slime_1848"][2],
        "slime_1823 cap violations": lambda c: c.legacy["slime_1823"][1],
        "slime_1823 empty micro-batches": lambda c: c.legacy["slime_1823"][2],
    }
    print_table(
        f"Quality summary over {len(cases)} cases",
        ["figure", "worst", "mean"],
        [
            [name, f"{max(map(f, cases)):.4g}", f"{statistics.fmean(map(f, cases)):.4g}"]
            for name, f in figures.items()
        ],
    )
    mean_excess = statistics.fmean(c.excess for c in cases)
    checks: list[tuple[str, Callable[[Case], bool]]] = [
        ("no invariant violation or empty micro-batch", lambda c: c.bad == 0 and c.empty == 0),
        ("K <= pack_first K", lambda c: c.k <= c.pf_k),
        ("micro-batch token imbalance <= 1.03", lambda c: c.mb_imb <= 1.03),
        (
            "micro-batch token imbalance <= max(1.03, floor at that K)",
            lambda c: c.mb_imb <= max(1.03, c.mb_floor) + 1e-9,
        ),
        ("DP-rank token imbalance <= 1.01", lambda c: c.dp_imb <= 1.01),
    ]
    targets = [Target("mean K / LB - 1 <= 3%", mean_excess <= 0.03, f"{mean_excess:.2%}")]
    for name, ok in checks:
        missed = [c for c in cases if not ok(c)]
        targets.append(Target(name, not missed, f"{len(missed)}/{len(cases)} cases miss"))
        for c in missed:
            print(
                f"  MISS [{name}] {c.label}: K={c.k} LB={c.lb} pf_K={c.pf_k} viol={c.bad} "
                f"empty={c.empty} mb_imb={c.mb_imb:.3f} (floor {c.mb_floor:.3f}) "
                f"dp_imb={c.dp_imb:.4f}"
            )
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    """Run every part of the benchmark and print the target summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small grid, single repeats")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.quick:
        targets = bench_partition(repeats=1) + bench_planning(repeats=1, splits=["auto"])
        targets += bench_quality([8, 32], [1, 2], [16384], [(1024, 0)])
    else:
        targets = bench_partition(repeats=3) + bench_planning(
            repeats=3, splits=["auto", "pack", "kk"]
        )
        targets += bench_quality(
            [8, 16, 32], [1, 2], [12288, 16384, 24576, 32768], [(1024, 0), (2048, 1), (4096, 2)]
        )
    print_table(
        f"Targets ({time.perf_counter() - start:.0f} s in all)",
        ["result", "target", "measured"],
        [["PASS" if t.passed else "FAIL", t.name, t.detail] for t in targets],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
