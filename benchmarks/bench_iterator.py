"""Iterator throughput and the flat-buffer vs list-of-tensors layout choice, at 4,096 samples.

Run: .venv/bin/python benchmarks/bench_iterator.py [--samples 4096] [--max-len 8192]
Each layout is built in a forked child so its resident-memory growth is measured alone.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from slime_hydra.data.iterator import MicrobatchIterator
from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.tokens import RolloutTokens, synthesize_tokens

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident bytes of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def first_fit_order(lengths: np.ndarray, cap: int) -> list[list[int]]:
    """Consecutive samples into micro-batches of at most `cap` tokens (one rank, one step)."""
    out, cur, used = [], [], 0
    for i, n in enumerate(lengths):
        if cur and used + n > cap:
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += int(n)
    return [*out, cur]


def build_lists(samples: dict[str, list[np.ndarray]]) -> dict[str, list[torch.Tensor]]:
    """The alternative layout: one 1-D tensor per sample per field."""
    return {k: [torch.tensor(a) for a in v] for k, v in samples.items()}


def pack_lists(lists: dict[str, list[torch.Tensor]], mb: list[int], pad_multiple: int) -> int:
    """Pack one micro-batch from per-sample tensors (cp=1), as a list-based iterator would."""
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in ("tok", "lab", "mask", "adv", "logp")}
    for i in mb:
        t = lists["tokens"][i]
        r = len(lists["loss_mask"][i])
        zeros = torch.zeros(len(t) - r, dtype=torch.float32)
        cols["tok"].append(t)
        cols["lab"].append(torch.cat([t[1:], t.new_zeros(1)]))
        for name, key in (("mask", "loss_mask"), ("adv", "advantages"), ("logp", "old_logprobs")):
            full = torch.cat([zeros, lists[key][i].to(torch.float32)])
            cols[name].append(torch.cat([full[1:], full.new_zeros(1)]))
    packed = {k: torch.cat(v) for k, v in cols.items()}
    pad = -len(packed["tok"]) % pad_multiple
    packed = {k: torch.nn.functional.pad(v, (0, pad)).unsqueeze(0) for k, v in packed.items()}
    cu = torch.tensor([0, *np.cumsum([len(lists["tokens"][i]) for i in mb])], dtype=torch.int32)
    return packed["tok"].shape[1] + len(cu)


def measure(build: Callable[[], object], pack: Callable[[object], None], queue: mp.Queue) -> None:
    """Child process body: time and size `build`, then time `pack` on what it built."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = rss()
    t0 = time.perf_counter()
    built = build()
    build_s = time.perf_counter() - t0
    rss_mb = (rss() - before) / 2**20
    t0 = time.perf_counter()
    pack(built)
    queue.put({"build_s": build_s, "rss_mb": rss_mb, "pack_s": time.perf_counter() - t0})


def in_child(build: Callable[[], object], pack: Callable[[object], None]) -> dict:
    """Run `measure` in a forked child: it shares the parent's data and grows on its own."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=measure, args=(build, pack, queue))
    proc.start()
    out = queue.get()
    proc.join()
    return out


def main() -> None:
    """Print layout memory/speed and iterator throughput."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--cap", type=int, default=16384, help="tokens per micro-batch")
    args = ap.parse_args()
    torch.set_num_threads(1)

    rng = np.random.default_rng(0)
    total = rng.integers(64, args.max_len + 1, args.samples)
    resp = np.maximum(1, (total * rng.uniform(0.3, 0.9, args.samples)).astype(np.int64))
    groups = np.arange(args.samples) // 8
    t = time.perf_counter()
    data = synthesize_tokens(total, resp, groups, vocab_size=32, seed=0)
    synth_s = time.perf_counter() - t
    num_tokens = int(total.sum())
    samples = {
        name: [data.sample(i)[name].copy() for i in range(len(data))]
        for name in ("tokens", "loss_mask", "advantages", "old_logprobs")
    }
    mbs = first_fit_order(total, args.cap)
    print(
        f"rollout: {args.samples} samples, {num_tokens / 1e6:.1f}M tokens "
        f"(max {args.max_len}), {len(mbs)} micro-batches of <= {args.cap} tokens; "
        f"synthesize_tokens {synth_s:.2f}s"
    )

    def build_flat() -> RolloutTokens:
        return RolloutTokens.from_samples(
            samples["tokens"],
            resp,
            samples["loss_mask"],
            data.rewards,
            groups,
            samples["advantages"],
            samples["old_logprobs"],
        )

    def pack_flat(built: RolloutTokens) -> None:
        for _ in MicrobatchIterator(RolloutBatch.from_tokens(built), mbs, step=0, dp_rank=0):
            pass

    def pack_list(built: dict[str, list[torch.Tensor]]) -> None:
        for mb in mbs:
            pack_lists(built, mb, 128)

    data_mb = sum(a.nbytes for v in samples.values() for a in v) / 2**20
    print(f"payload: {data_mb:.0f} MiB (int64 tokens, bool mask, float32 advantages/log-probs)")
    print(f"{'layout':<16}{'RSS +MiB':>10}{'arrays':>8}{'build s':>9}{'pack s':>8}{'Mtok/s':>8}")
    layouts = (
        ("flat+offsets", build_flat, pack_flat, 8),
        ("list of tensors", lambda: build_lists(samples), pack_list, 4 * len(data)),
    )
    for name, build, pack, arrays in layouts:
        f = in_child(build, pack)
        print(
            f"{name:<16}{f['rss_mb']:>10.0f}{arrays:>8}{f['build_s']:>9.2f}"
            f"{f['pack_s']:>8.2f}{num_tokens / f['pack_s'] / 1e6:>8.1f}"
        )

    batch = RolloutBatch.from_tokens(data)
    for cp in (1, 2, 4):
        it = MicrobatchIterator(batch, mbs, step=0, dp_rank=0, cp_size=cp, cp_rank=cp - 1)
        t0 = time.perf_counter()
        packed = sum(mb.tokens.shape[1] for mb in it)
        dt = time.perf_counter() - t0
        print(
            f"MicrobatchIterator cp={cp}: {len(mbs)} micro-batches, {packed / 1e6:.2f}M packed "
            f"tokens on this rank in {dt:.2f}s = {packed / dt / 1e6:.1f}M tokens/s "
            f"({num_tokens / dt / 1e6:.1f}M rollout tokens/s)"
        )


if __name__ == "__main__":
    main()
