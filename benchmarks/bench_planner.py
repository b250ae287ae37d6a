"""Planner benchmark on lengths nobody tuned to: random length families, random layouts, a fresh
seed each run (printed), worst cases reported; then the scale curve up to 1M samples.

    python benchmarks/bench_planner.py                 # a fresh seed, 48 cases, the curve
    python benchmarks/bench_planner.py --seed 1234     # the same cases again
    python benchmarks/bench_planner.py --cases 96 --no-curve --draws 0 --near-full 120
    python benchmarks/bench_planner.py --cases 0 --draws 0 --near-full 0 --no-curve  # targets

Each case draws a family (tests/families.py), 512-16k samples a step in 1-3 steps, a layout
(dp 1-64, pp/vpp with a VPP group, cp 1-2) and a cap, and plans it with `batching=dynamic`
(oversize=isolate for families with samples over the cap). Times are CPU time
(time.process_time) of `plan()`, the median of `--repeats` runs alternated with a plain
pure-Python first-fit of the same steps (baselines.first_fit_bins) in the same process, so
load on the machine shifts both; a figure is per step. Quality is against the proven bounds the
planner logs: K over `batch/num_microbatches_lb`, the largest micro-batch over
`batch/mb_tokens_lb`; each step above K_lb goes to the count oracle (count_oracle.py), and
`lower` counts those it packs one count lower: plans the planner missed; of the others, `proven`
counts those where the LP relaxation (count_lp.py) proves one count lower out of reach: there
the bound, not the planner, is short, and K is the fewest. The seed sweep plans
fixed cases (family, size, layout) on several draws each and reports the slowest draw against
the median one. The target steps (`--target-draws`) are the issue's plan-time targets, 4k and 16k
samples on dp32, on every family, the worst draw against the target. The near-full steps
(`--near-full`) are where the count search runs: steps 97%
full or more at K_lb, which the random cases draw rarely; the figure is the micro-batches above
K_lb in all, with the count oracle's misses and the LP's proofs. The exit status is 0 either
way (the figures are the result).
"""

from __future__ import annotations

import argparse
import math
import secrets
import statistics
import sys
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests.families; PYTHONPATH first

import numpy as np
from baselines import first_fit_bins
from count_lp import lp_bins
from count_oracle import packs

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition.bounds import capped_parts_lower_bound, max_part_lower_bound
from slime_hydra.schedule import (
    DynamicBatching,
    ParallelLayout,
    StepSchedule,
    step_metrics,
    violations,
)
from slime_hydra.schedule.metrics import microbatch_lower_bound
from tests.families import FAMILIES, ISOLATE, lengths_of

FLOPS = (1.0, 1 / 4096)  # any (a, b): only the flops imbalance metric reads it


@dataclass
class Case:
    key: str  # "seed:index[:redraw]", what --only takes
    family: str
    layout: ParallelLayout
    max_tokens: int
    lengths: list[int]
    groups: list[int]
    global_batch_size: int

    @property
    def steps(self) -> int:
        return -(-len(self.lengths) // self.global_batch_size)

    def describe(self) -> str:
        lay = self.layout
        vpp = f" pp{lay.pp} vpp{lay.vpp} g{lay.microbatch_alignment}" if lay.vpp > 1 else ""
        return (
            f"[{self.key}] {self.family:9s} {self.global_batch_size:6d}×{self.steps}"
            f" dp{lay.dp}{vpp}"
            f" cp{lay.cp} cap {self.max_tokens * lay.cp}"
        )


def draw_case(key: str, family: str) -> Case:
    """One random case of `family`, drawn from the numbers in `key`."""
    rng = np.random.default_rng([int(part) for part in key.split(":")])
    dp = int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]))
    vpp = int(rng.choice([1, 1, 2, 3]))
    pp = int(rng.choice([2, 4])) if vpp > 1 else int(rng.choice([1, 2]))
    group = int(rng.integers(pp, 2 * pp + 1)) if vpp > 1 else None
    cp = int(rng.choice([1, 1, 2]))
    layout = ParallelLayout(dp=dp, pp=pp, vpp=vpp, cp=cp, microbatch_group_size_per_vp_stage=group)
    max_tokens = int(rng.choice([4096, 8192, 16384]))
    per_step = int(np.exp(rng.uniform(np.log(512), np.log(16384))))
    per_step = max(per_step, dp * layout.microbatch_alignment * 2)
    steps = int(rng.integers(1, 4))
    n = per_step * steps
    lengths = lengths_of(family, rng, n, max_tokens * cp).tolist()
    return Case(key, family, layout, max_tokens, lengths, list(range(n)), per_step)


def first_fit_steps(case: Case) -> None:
    """The baseline: plain first-fit of each step's samples, in order, under the cap."""
    cap = case.max_tokens * case.layout.cp
    gbs = case.global_batch_size
    for start in range(0, len(case.lengths), gbs):
        first_fit_bins(case.lengths[start : start + gbs], cap)


@dataclass
class Result:
    case: Case
    plan_ms: float  # per step, median
    first_fit_ms: float  # per step, median
    spread: float  # (max - min) / median of the plan's repeats
    k_over: int  # steps whose K is above its bound
    k_missed: int  # of those, steps the count oracle packs one aligned count lower
    k_proven: int  # of those, steps the LP bound proves no aligned count lower can be packed
    quality: float  # worst largest-micro-batch over its bound
    dp_imbalance: float
    dp_over_lb: float  # heaviest rank / `rank_lower_bound`, worst step
    broken: int  # cap violations + empty micro-batches + invariant violations

    @property
    def ms_per_1k(self) -> float:
        return self.plan_ms / (self.case.global_batch_size / 1000)


def run_case(case: Case, repeats: int) -> Result:
    strategy = DynamicBatching(
        case.layout,
        case.global_batch_size,
        case.max_tokens,
        oversize="isolate" if case.family in ISOLATE else "error",
        flops_coefficients=FLOPS,
    )
    plan_times, ff_times = [], []
    schedule = None
    for r in range(repeats):  # alternate which runs first
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for which in order:
            if which == 0:
                t0 = time.process_time()
                schedule = strategy.plan(case.lengths, case.groups)
                plan_times.append((time.process_time() - t0) * 1e3)
            else:
                t0 = time.process_time()
                first_fit_steps(case)
                ff_times.append((time.process_time() - t0) * 1e3)
    assert schedule is not None
    cap = case.max_tokens * case.layout.cp
    k_over, k_missed, k_proven, quality, dp_imb, dp_lb, broken = 0, 0, 0, 0.0, 0.0, 0.0, 0
    for step in schedule.steps:
        m = step_metrics(step, case.lengths, cap, case.layout, FLOPS)
        if m["batch/num_microbatches"] > m["batch/num_microbatches_lb"]:
            k_over += 1
            why = below_k(step, case.lengths, cap, case.layout)
            k_missed += why == "lower"
            k_proven += why == "proven"
        quality = max(quality, m["batch/mb_tokens_max"] / m["batch/mb_tokens_lb"])
        dp_imb = max(dp_imb, m["batch/dp_token_imbalance"])
        bound = rank_lower_bound(step, case.lengths, cap)
        dp_lb = max(dp_lb, heaviest_rank(step, case.lengths) / bound)
        broken += m["batch/cap_violations"] + m["batch/empty_microbatches"]
    broken += len(violations(schedule, case.layout, case.groups, case.family in ISOLATE))
    med = statistics.median(plan_times)
    return Result(
        case,
        med / case.steps,
        statistics.median(ff_times) / case.steps,
        (max(plan_times) - min(plan_times)) / med if med else 0.0,
        k_over,
        k_missed,
        k_proven,
        quality,
        dp_imb,
        dp_lb,
        broken,
    )


def heaviest_rank(step: StepSchedule, lengths: Sequence[int]) -> int:
    """The tokens of the step's heaviest DP rank."""
    return max(sum(lengths[i] for mb in rank for i in mb) for rank in step.ranks)


def rank_lower_bound(step: StepSchedule, lengths: Sequence[int], cap: int) -> int:
    """A proven lower bound on the heaviest of the step's DP ranks (tokens) at its count K:
    the heaviest of dp parts of its samples (partition.bounds), the longest sample with the
    K - 1 shortest (its rank's other micro-batches are not empty), and what the cap lets the
    ranks hold (capped_parts_lower_bound). `dp imb` over the mean alone cannot tell a rank a long
    sample weighs down from a plan that misses."""
    sizes = np.sort(np.asarray([lengths[i] for i in step.samples], dtype=np.int64))
    k, dp = step.num_microbatches, len(step.mbs_per_rank)
    return max(
        max_part_lower_bound(sizes, dp),
        int(sizes[-1] + sizes[: k - 1].sum()),
        capped_parts_lower_bound(sizes, dp, k, cap),
    )


def below_k(
    step: StepSchedule, lengths: Sequence[int], cap: int, layout: ParallelLayout
) -> str | None:
    """Why the step's K is above K_lb, one VPP-aligned count fewer asked of its samples within
    the cap (the over-cap ones alone in theirs): "lower" where the count oracle packs them (a
    plan the planner missed), "proven" where the LP bound (count_lp.py, seeded with the step's
    micro-batches) proves they need more bins (K is the fewest), None where neither knows."""
    per_mb, samples = step.flat()
    sizes = np.asarray(lengths, dtype=np.int64)[samples]
    normal = sizes <= cap
    k = step.num_microbatches - layout.microbatch_alignment
    bins = layout.dp * k - int((~normal).sum())
    if packs(sizes[normal], bins, cap):
        return "lower"
    bin_of = np.repeat(np.arange(per_mb.size), per_mb)
    return "proven" if lp_bins(sizes[normal], cap, start=bin_of[normal]) > bins else None


def report(results: Sequence[Result]) -> None:
    print(
        f"\n{'family':9s} {'cases':>5s} {'ms/1k worst':>11s} {'median':>7s} {'worst/med':>9s}"
        f" {'plan/FF worst':>13s} {'q worst':>8s} {'K>K_lb':>6s} {'lower':>5s} {'proven':>6s}"
        f" {'dp imb':>7s} {'dp/lb':>6s}"
        f" {'broken':>6s}"
    )
    by_family: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_family[r.case.family].append(r)
    for family, rs in sorted(by_family.items()):
        per_1k = [r.ms_per_1k for r in rs]
        med = statistics.median(per_1k)
        big = [r.plan_ms / r.first_fit_ms for r in rs if r.case.global_batch_size >= 2048]
        print(
            f"{family:9s} {len(rs):5d} {max(per_1k):11.2f} {med:7.2f} {max(per_1k) / med:9.1f}"
            f" {max(big, default=float('nan')):13.3f} {max(r.quality for r in rs):8.4f}"
            f" {sum(r.k_over for r in rs):6d} {sum(r.k_missed for r in rs):5d}"
            f" {sum(r.k_proven for r in rs):6d}"
            f" {max(r.dp_imbalance for r in rs):7.4f} {max(r.dp_over_lb for r in rs):6.4f}"
            f" {sum(r.broken for r in rs):6d}"
        )
    worst = sorted(results, key=lambda r: -r.ms_per_1k)[:3]
    print("\nslowest cases (ms per step, per 1k samples, plan / first-fit, spread of repeats):")
    for r in worst:
        print(
            f"  {r.case.describe()}: {r.plan_ms:.1f} ms, {r.ms_per_1k:.2f}/1k, "
            f"{r.plan_ms / r.first_fit_ms:.3f}× first-fit, ±{r.spread:.0%}"
        )
    behind = sorted(
        (r for r in results if r.case.global_batch_size >= 2048),
        key=lambda r: -r.plan_ms / r.first_fit_ms,
    )[:3]
    print("slowest against first-fit at >= 2k samples (plan / first-fit):")
    for r in behind:
        print(
            f"  {r.case.describe()}: {r.plan_ms:.1f} ms against {r.first_fit_ms:.1f} ms, "
            f"{r.plan_ms / r.first_fit_ms:.3f}×"
        )
    off = sorted(results, key=lambda r: -r.quality)[:3]
    print("farthest from the bound (largest micro-batch / batch/mb_tokens_lb, K over K_lb):")
    for r in off:
        print(f"  {r.case.describe()}: {r.quality:.4f}, {r.k_over} step(s) K > K_lb")
    at = [r for r in results if r.case.global_batch_size >= 2048]
    ratios = [r.plan_ms / r.first_fit_ms for r in at]
    print(
        f"\nat >= 2k samples: planner / first-fit worst {max(ratios, default=float('nan')):.3f},"
        f" median {statistics.median(ratios) if ratios else float('nan'):.3f}"
        f" ({len(at)} cases); all cases: {sum(r.broken for r in results)} broken invariants,"
        f" {sum(r.k_over for r in results)} steps with K > K_lb, of which"
        f" {sum(r.k_missed for r in results)} pack one count lower (the count oracle: a plan"
        f" the planner missed) and {sum(r.k_proven for r in results)} cannot (the LP bound:"
        " K is the fewest)"
    )


SWEEP = (
    ("grpo", 4096, 32),
    ("grpo", 16384, 64),
    ("grpo", 65536, 256),
    ("truncated", 2048, 4),
    ("third", 2048, 32),
    ("pareto", 8192, 16),
    ("over_half", 4096, 32),
    ("short", 8192, 64),
)
"""(family, samples, dp) of the seed sweep: one step, cap 16384."""


def seed_sweep(seed: int, draws: int) -> None:
    """Each SWEEP case drawn `draws` times (one seed each, from the run's): the slowest draw's
    plan time against the median draw's (the issue's 'slowest seed within 3x the median'),
    with the worst quality and the draws with K over K_lb: those the count oracle packs lower
    and those the LP bound proves at their fewest."""
    print(f"\nseed sweep ({draws} draws a case, cap 16384, one step; CPU ms):")
    print(
        f"{'family':9s} {'samples':>7s} {'dp':>4s} {'median':>8s} {'slowest':>8s}"
        f" {'slow/med':>8s} {'q worst':>8s} {'K>K_lb':>6s} {'lower':>5s} {'proven':>6s}"
    )
    for family, n, dp in SWEEP:
        times, worst, over, lower, proven = [], 0.0, 0, 0, 0
        layout = ParallelLayout(dp=dp)
        for draw in range(draws):
            lengths = lengths_of(family, np.random.default_rng([seed, draw, n]), n, 16384)
            lengths = lengths.tolist()
            strategy = DynamicBatching(layout, None, 16384)
            start = time.process_time()
            try:
                schedule = strategy.plan(lengths, list(range(n)))
            except SlimeHydraError:  # no schedule exists (n samples cannot fill dp ranks)
                continue
            times.append((time.process_time() - start) * 1e3)
            m = step_metrics(schedule.steps[0], lengths, 16384, layout, FLOPS)
            worst = max(worst, m["batch/mb_tokens_max"] / m["batch/mb_tokens_lb"])
            if m["batch/num_microbatches"] > m["batch/num_microbatches_lb"]:
                over += 1
                why = below_k(schedule.steps[0], lengths, 16384, layout)
                lower += why == "lower"
                proven += why == "proven"
        med = statistics.median(times)
        print(
            f"{family:9s} {n:7d} {dp:4d} {med:8.1f} {max(times):8.1f} {max(times) / med:8.1f}"
            f" {worst:8.4f} {over:3d}/{len(times)} {lower:5d} {proven:6d}"
        )


TARGETS = ((4096, 32, 10.0), (16384, 32, 40.0))
"""(samples, dp, target ms) of the issue's plan-time targets: one step, cap 16384, any family."""


def target_steps(seed: int, draws: int, repeats: int) -> None:
    """The plan-time targets' steps, each family drawn `draws` times (one seed each, from the
    run's): the median and worst draw's plan time (the median of `repeats` plans), against the
    target, with the worst quality."""
    print(f"\ntarget steps ({draws} draws of every family, cap 16384, one step; CPU ms):")
    print(
        f"{'samples':>7s} {'dp':>3s} {'family':9s} {'median':>7s} {'worst':>7s}"
        f" {'target':>6s} {'q worst':>8s}"
    )
    for n, dp, target in TARGETS:
        layout = ParallelLayout(dp=dp)
        for family in sorted(FAMILIES):
            times, worst = [], 0.0
            for draw in range(draws):
                lengths = lengths_of(family, np.random.default_rng([seed, draw, n, 2]), n, 16384)
                lengths = lengths.tolist()
                oversize = "isolate" if family in ISOLATE else "error"
                strategy = DynamicBatching(layout, None, 16384, oversize=oversize)
                runs = []
                try:
                    for _ in range(repeats):
                        start = time.process_time()
                        schedule = strategy.plan(lengths, list(range(n)))
                        runs.append((time.process_time() - start) * 1e3)
                except SlimeHydraError:  # no schedule exists (equal samples over cap/2)
                    continue
                times.append(statistics.median(runs))
                m = step_metrics(schedule.steps[0], lengths, 16384, layout, FLOPS)
                worst = max(worst, m["batch/mb_tokens_max"] / m["batch/mb_tokens_lb"])
            if times:
                print(
                    f"{n:7d} {dp:3d} {family:9s} {statistics.median(times):7.1f}"
                    f" {max(times):7.1f} {target:6.0f} {worst:8.4f}"
                )


def near_full(seed: int, steps: int) -> None:
    """Steps 97% full or more at K_lb, where the count search runs: GRPO and truncated lengths,
    500-6k samples, dp 1-32, caps 8k-32k, drawn from the run's seed. The micro-batches above
    K_lb in all, the steps above it, and of those the ones the count oracle packs one count
    lower (the search's misses) and the ones the LP bound proves at their fewest."""
    rng = np.random.default_rng([seed, 1])
    above, over, lower, proven, times = 0, 0, 0, 0, []
    drawn = 0
    while drawn < steps:
        family = ("grpo", "truncated")[drawn % 2]
        n = int(np.exp(rng.uniform(np.log(500), np.log(6000))))
        layout = ParallelLayout(dp=int(rng.choice([1, 2, 3, 4, 8, 16, 32])))
        cap = int(rng.choice([8192, 16384, 32768]))
        sizes = lengths_of(family, rng, n, cap)
        k_lb = microbatch_lower_bound(sizes, cap, layout.dp, 1)
        if k_lb * layout.dp > n or sizes.sum() < 0.97 * k_lb * layout.dp * cap:
            continue
        drawn += 1
        lengths = sizes.tolist()
        start = time.process_time()
        schedule = DynamicBatching(layout, None, cap).plan(lengths, list(range(n)))
        times.append((time.process_time() - start) * 1e3)
        k = schedule.steps[0].num_microbatches
        above += k - k_lb
        if k > k_lb:
            over += 1
            why = below_k(schedule.steps[0], lengths, cap, layout)
            lower += why == "lower"
            proven += why == "proven"
    print(
        f"\nnear-full steps ({steps}, 97% full or more at K_lb; CPU ms): {above} micro-batches"
        f" above K_lb in all, {over} steps above it, of which {lower} pack one count lower (the"
        f" count oracle: the search's misses) and {proven} cannot (the LP bound); plan median"
        f" {statistics.median(times):.1f} ms, mean {statistics.mean(times):.1f} ms (what a run"
        f" pays a step), slowest {max(times):.1f} ms"
    )


CURVE = ((4096, 32), (16384, 32), (16384, 64), (65536, 256), (262144, 1024), (1048576, 4096))


def curve(rng: np.random.Generator, repeats: int) -> None:
    """Plan time and peak memory of one GRPO-like step from 4k samples on dp32 to 1M on
    dp4096 (cap 16384), against n log n. The first plan of a size is also shown apart: it pays
    for the allocator's first growth to that size (page faults), which a training loop planning
    step after step pays once."""
    print(
        "\nscale curve (grpo family, cap 16384, one step; CPU ms, median of repeats, and the"
        " first):"
    )
    print(
        f"{'samples':>8s} {'dp':>5s} {'K':>4s} {'plan ms':>9s} {'first ms':>9s}"
        f" {'ms/(n log2 n)·1e6':>18s} {'peak MiB':>9s} {'q':>7s}"
    )
    for n, dp in CURVE:
        lengths = lengths_of("grpo", rng, n, 16384).tolist()
        layout = ParallelLayout(dp=dp)
        strategy = DynamicBatching(layout, None, 16384)
        samples = list(range(n))
        times = []
        for _ in range(repeats):
            start = time.process_time()
            strategy.plan(lengths, samples)
            times.append((time.process_time() - start) * 1e3)
        tracemalloc.start()
        schedule = strategy.plan(lengths, samples)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        m = step_metrics(schedule.steps[0], lengths, 16384, layout, FLOPS)
        ms = statistics.median(times)
        print(
            f"{n:8d} {dp:5d} {schedule.steps[0].num_microbatches:4d} {ms:9.1f} {times[0]:9.1f}"
            f" {ms / (n * math.log2(n)) * 1e6:18.2f} {peak:9.1f}"
            f" {m['batch/mb_tokens_max'] / m['batch/mb_tokens_lb']:7.4f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh one")
    parser.add_argument("--cases", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-curve", action="store_true")
    parser.add_argument("--draws", type=int, default=8, help="seed sweep draws (0: none)")
    parser.add_argument("--near-full", type=int, default=40, help="near-full steps (0: none)")
    parser.add_argument(
        "--target-draws", type=int, default=6, help="draws of the targets' steps (0: none)"
    )
    parser.add_argument("--only", help="one case by its key (SEED:INDEX[:REDRAW]), verbose")
    args = parser.parse_args(argv)
    families = sorted(FAMILIES)
    if args.only:
        case = draw_case(args.only, families[int(args.only.split(":")[1]) % len(families)])
        report([run_case(case, args.repeats)])
        return 0
    seed = secrets.randbelow(2**31) if args.seed is None else args.seed
    print(f"seed {seed} (rerun with --seed {seed})")
    results, refused = [], 0
    for i in range(args.cases):
        for redraw in range(8):
            case = draw_case(f"{seed}:{i}" + (f":{redraw}" if redraw else ""), families[i % 8])
            try:
                results.append(run_case(case, args.repeats))
                break
            except SlimeHydraError:  # no plan exists (equal samples over cap/2, n % dp != 0)
                refused += 1
    report(results)
    print(f"{refused} drawn cases refused with our error (no schedule exists), redrawn")
    if args.draws:
        seed_sweep(seed, args.draws)
    if args.target_draws:
        target_steps(seed, args.target_draws, args.repeats)
    if args.near_full:
        near_full(seed, args.near_full)
    if not args.no_curve:
        curve(np.random.default_rng([seed, args.cases]), args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
