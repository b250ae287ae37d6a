"""Run-dir state without processes: the lock, the claim, the resume comparison, metrics.jsonl,
checkpoints (weights only, checked whole), the non-finite step policy and the failure report."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from slime_hydra.errors import SlimeHydraError
from slime_hydra.log.jsonl import JsonlSink
from slime_hydra.rundir import RunDirError, RunDirLock, claim, diff_configs
from slime_hydra.schedule import ParallelLayout
from slime_hydra.schedule.cost import ModelDims
from slime_hydra.train.run import checkpoint
from slime_hydra.train.run.launch import failure_report, recorded_failures
from slime_hydra.train.run.loop import step_skipped
from slime_hydra.train.step.optimizer import no_weight_decay
from slime_hydra.train.step.shapes import weight_shapes
from tests.faults.rundir import assert_untouched, snapshot

CONFIG = {
    "batching": {"global_batch_size": 8, "max_tokens_per_gpu": 8192},
    "parallel": {"dp": 2, "tp": 1},
    "model": {"hidden_size": 128},
    "trainer": {"lr": 0.001, "resume": False, "max_steps": None, "clip_grad": 1.0},
    "logger": {"_target_": "x"},
    "seed": 1,
}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A dir holding a finished run: config, schedule, metrics, a checkpoint."""
    d = tmp_path / "run"
    (d / "checkpoints/step_000002").mkdir(parents=True)
    (d / "config.yaml").write_text(json.dumps(CONFIG))  # JSON is YAML
    (d / "schedule.json").write_text('{"lengths": [1], "cap": null, "steps": []}')
    (d / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (d / "checkpoints/latest").write_text("2\n")
    return d


def with_(**changes: object) -> dict:
    cfg = json.loads(json.dumps(CONFIG))
    for key, value in changes.items():
        group, name = key.split("__")
        cfg[group][name] = value
    return cfg


def test_a_new_run_into_a_dir_holding_a_run_is_refused(run_dir):
    before = snapshot(run_dir)
    with pytest.raises(RunDirError, match=r"already holds a run .*trainer.resume=true"):
        claim(run_dir, CONFIG, resume=False)
    assert_untouched(before, run_dir)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"batching__max_tokens_per_gpu": 4096}, "batching.max_tokens_per_gpu: 8192 → 4096"),
        ({"parallel__dp": 4}, "parallel.dp: 2 → 4"),
        ({"model__hidden_size": 64}, "model.hidden_size: 128 → 64"),
    ],
)
def test_a_resume_that_changes_the_schedule_or_model_names_keys_old_and_new(
    run_dir, changes, needle
):
    before = snapshot(run_dir)
    with pytest.raises(RunDirError, match="refused") as err:
        claim(run_dir, with_(trainer__resume=True, **changes), resume=True)
    assert needle in str(err.value) and str(run_dir / "config.yaml") in str(err.value)
    assert_untouched(before, run_dir)


def test_a_resume_may_change_optimizer_keys_and_says_so(run_dir, caplog):
    changed = claim(run_dir, with_(trainer__resume=True, trainer__lr=0.002), resume=True)
    assert changed == [("trainer.lr", 0.001, 0.002)]
    assert "trainer.lr: 0.001 → 0.002" in caplog.text


def test_diff_sorts_keys():
    diff = diff_configs(CONFIG, with_(trainer__max_steps=9, trainer__clip_grad=0.5))
    assert [k for k, *_ in diff.free] == ["trainer.max_steps"]
    assert [k for k, *_ in diff.applied] == ["trainer.clip_grad"]


def test_resume_into_a_dir_without_a_run_is_refused(tmp_path):
    with pytest.raises(RunDirError, match="holds no run to resume"):
        claim(tmp_path, CONFIG, resume=True)


def test_a_second_process_cannot_take_the_lock_and_learns_the_holder(run_dir):
    before = snapshot(run_dir)
    lock = RunDirLock(run_dir).acquire()
    try:
        code = (
            f"from slime_hydra.rundir import RunDirLock\nRunDirLock({str(run_dir)!r}).acquire()\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode != 0
        assert f"in use by another run (pid {os.getpid()}" in out.stderr
    finally:
        lock.release(refused=True)
    assert_untouched(before, run_dir)
    RunDirLock(run_dir).acquire().release()  # released: free again


def test_metrics_keep_each_step_once_and_tolerate_a_torn_last_line(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "x": 1}, {"step": 2, "x": 2}, {"step": 3}, {"step": 2, "x": "again"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "train/lo')
    JsonlSink(path, steps_done=2).close()  # a run resumed after step 2 logs 3, 4, ...
    kept = [json.loads(x) for x in path.read_text().splitlines()]
    assert kept == [{"step": 1, "x": 1}, {"step": 2, "x": "again"}]  # the last row of step 2
    assert "torn last line" in caplog.text


def test_a_damaged_metrics_line_before_the_last_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"st\n{"step": 2}\n')
    before = snapshot(tmp_path)
    with pytest.raises(SlimeHydraError, match=r"metrics.jsonl:2: not a metrics row"):
        JsonlSink(path, steps_done=2)
    assert_untouched(before, tmp_path)


# -- checkpoints ------------------------------------------------------------------------------


DIMS = ModelDims("t", 2, 8, 16, 2, 2, 32, 64)
LAYOUT = ParallelLayout(dp=2)
IDENT = checkpoint.identity(LAYOUT, DIMS)


def megatron_shaped(dims: ModelDims, layout: ParallelLayout, rank: int) -> torch.nn.ModuleList:
    """Modules whose state_dict has the keys and shapes of `rank`'s model chunks."""
    chunks = torch.nn.ModuleList(torch.nn.Module() for _ in range(layout.vpp))
    for key, shape in weight_shapes(dims, layout, rank).items():
        chunk, *parts, leaf = key.split(".")
        at = chunks[int(chunk)]
        for part in parts:
            if not hasattr(at, part):
                at.add_module(part, torch.nn.Module())
            at = getattr(at, part)
        at.register_parameter(leaf, torch.nn.Parameter(torch.randn(shape)))
    return chunks


def adamw(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW over `model`'s params in the groups the trainer's optimizers make: weights with
    weight decay, then biases and 1-D params."""
    named = list(model.named_parameters())
    groups = [[p for n, p in named if no_weight_decay(n, p) == skip] for skip in (False, True)]
    return torch.optim.AdamW([{"params": g} for g in groups if g], lr=lr)


def saved(run_dir: Path, world: int = 2, digest: str = "d") -> torch.nn.Module:
    model = megatron_shaped(DIMS, LAYOUT, 0)
    opt = adamw(model, lr=0.1)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    for rank in range(world):
        checkpoint.save(run_dir, 2, rank, model, opt, digest, IDENT, {"skipped_steps": 1})
    checkpoint.mark_latest(run_dir, 2)
    return model


def fresh_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    fresh = megatron_shaped(DIMS, LAYOUT, 1)
    return fresh, adamw(fresh, lr=0.5)


def test_checkpoints_round_trip_weights_only_and_keep_the_new_lr(tmp_path):
    model = saved(tmp_path)
    assert checkpoint.verify(tmp_path, "d", LAYOUT, DIMS) == 2
    fresh, opt = fresh_optimizer()
    steps, counters = checkpoint.load(tmp_path, 1, fresh, opt, "d", IDENT)
    assert (steps, counters) == (2, {"skipped_steps": 1})
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True)
    )
    assert opt.param_groups[0]["lr"] == 0.5  # the resumed config's lr applies
    assert opt.state_dict()["state"][0]["step"] == 1  # the moments are the checkpoint's


def test_optimizer_state_objects_are_taken_from_the_fresh_optimizer():
    state = {"state": {}, "param_groups": [{"lr": 0.1, "cfg": object(), "params": [0]}]}
    dropped: list = []
    kept = checkpoint.plain(state, (), dropped)
    assert dropped == [("param_groups", 0, "cfg")] and "cfg" not in kept["param_groups"][0]


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch /tmp/slime_hydra_ckpt_pwned",))


def edit(path: Path, change) -> None:
    """Load a rank file, let `change` edit its state, save it back."""
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


QKV = "0.decoder.layers.1.self_attention.linear_qkv.weight"


def narrowed(state: dict, record: bool) -> None:
    """The rank's qkv weight cut to half its columns; with `record`, its shape record too."""
    state["model"][QKV] = state["model"][QKV][:, :4].clone()
    if record:
        state["shapes"][f"model/{QKV}"] = [24, 4]


def moment(state: dict, param: int, exp_avg: torch.Tensor) -> None:
    """Set parameter `param`'s exp_avg, and its shape record with it."""
    state["optimizer"]["state"].setdefault(param, {})["exp_avg"] = exp_avg
    state["shapes"][f"optimizer/state/{param}/exp_avg"] = list(exp_avg.shape)


def merge_groups(optimizer: dict) -> None:
    """All params in the first param group."""
    first, *rest = optimizer["param_groups"]
    first["params"] = [i for g in optimizer["param_groups"] for i in g["params"]]
    optimizer["param_groups"] = [first]
    assert rest


def recorded(state: dict) -> None:
    """Record the shapes of the state's tensors again, as the crafter of an edited file would."""
    state["shapes"] = checkpoint.tensor_shapes(
        {"model": state["model"], "optimizer": state["optimizer"]}
    )


def grouped(model: dict) -> list[str]:
    """The weight names of `model` in the optimizer's order: decayed, then biases and 1-D (not
    megatron's `_extra_state` entries)."""
    weights = {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}
    return [k for skip in (False, True) for k in weights if no_weight_decay(k, weights[k]) == skip]


def reordered(state: dict, permute_moments: bool) -> None:
    """The model keys in reverse order; with `permute_moments`, the moments permuted so that,
    paired by the file's key order, each still has its weight's shape."""
    before = grouped(state["model"])
    state["model"] = dict(reversed(state["model"].items()))
    if permute_moments:
        torch_state = state["optimizer"]["state"]
        saved_id = {name: i for i, name in enumerate(before)}
        after = grouped(state["model"])
        state["optimizer"]["state"] = {i: torch_state[saved_id[n]] for i, n in enumerate(after)}
    recorded(state)


def with_master_copies(state: dict, copy_shape: tuple[int, ...] | None = None) -> None:
    """The optimizer state as megatron's mixed-precision optimizer (bf16/fp16 on a GPU) saves
    it: the torch state under "optimizer", an fp32 copy of each weight per param group; with
    `copy_shape`, the first copy of another shape."""
    names = grouped(state["model"])
    groups = state["optimizer"]["param_groups"]
    copies = [[state["model"][names[i]].float().clone() for i in g["params"]] for g in groups]
    if copy_shape is not None:
        copies[0][0] = torch.zeros(copy_shape)
    state["optimizer"] = {"optimizer": state["optimizer"], "fp32_from_fp16_params": copies}
    recorded(state)


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("latest_garbage", "holds 'garbage', not a step count"),
        ("truncated", "not a readable checkpoint (truncated or damaged"),
        ("crafted", "only a full unpickler could rebuild"),
        ("missing_rank", "rank_001.pt is missing"),
        ("rank_file_a_dir", "rank_001.pt is a directory, not a rank's checkpoint file"),
        ("rank_file_a_fifo", "rank_001.pt is not a regular file (a FIFO, device or socket), not"),
        ("other_schedule", "different schedule"),
        ("latest_past_the_end", "latest names step 99999999, but"),
        ("latest_arabic_digit", "holds '٣', not a step count"),
        ("swapped_ranks", "rank_000.pt was saved by rank 1, not rank 0: the rank files were"),
        ("other_layout", "parallel config: parallel.dp: 2 saved, 1 now, parallel.tp: 1 saved, 2"),
        ("other_model", "another model config: model.ffn_hidden_size: 16 saved, 32 now"),
        ("format_3", "rank_001.pt is a checkpoint of format 3, and this version of slime_hydra"),
        (
            "format_2",
            "format 2, and this version of slime_hydra reads format 4 only (it records no rank",
        ),
        ("edited_tensor", f"rank_001.pt: model/{QKV} has shape [24, 4], but it was saved with "),
        ("dropped_tensor", f"rank_001.pt: model/{QKV} is missing, but it was saved with shape"),
        (
            "edited_tensor_and_record",
            f"gives rank 1 the weight {QKV} with shape [24, 8] (model.hidden_size=8, "
            "model.num_attention_heads=2, model.num_query_groups=2, model.kv_channels=None, "
            "parallel.tp=1), and the file holds shape [24, 4]",
        ),
        ("other_normalization", "input_layernorm.bias with shape [8] (model.hidden_size=8, model"),
        (
            "moment_of_another_shape",
            "rank_001.pt: the optimizer's exp_avg of parameter 0 "
            "(0.embedding.word_embeddings.weight) has shape [3], and this run's model gives that "
            "weight [128, 8]",
        ),
        ("moments_of_another_grouping", "holds param groups of [15] parameters, and this run"),
        ("moment_of_no_parameter", "optimizer state holds parameter 99, which none of its param"),
        ("damaged_rng", "rank_001.pt holds an RNG state that cannot be restored"),
        (
            "reordered_keys_and_permuted_moments",
            "rank_001.pt: the optimizer's exp_avg of parameter 1 (0.decoder.layers.0."
            "self_attention.linear_proj.weight) has shape [8, 16], and this run's model gives "
            "that weight [8, 8]: torch pairs saved moments with this run's parameters by position "
            "in the model's order",
        ),
        (
            "unknown_weight",
            "rank_001.pt: it holds the weight 0.decoder.layers.7.mlp.linear_fc2.weight, which "
            "this run's model does not have (1 such keys)",
        ),
        (
            "several_optimizers",
            "rank_001.pt: its optimizer state is the states of 2 optimizers (megatron's chain, as "
            "for MoE experts, which this project's model does not have), and this run's "
            "optimizer loads a torch optimizer's state (trainer=cpu",
        ),
        (
            "master_copies_on_cpu",
            "its optimizer state is megatron's mixed-precision state with fp32 master copies "
            "(trainer=gpu with trainer.params_dtype=bfloat16 or float16), and this run's "
            "optimizer loads a torch optimizer's state",
        ),
        ("distributed_optimizer", "its optimizer state is empty (megatron's distributed"),
    ],
)
def test_a_damaged_or_crafted_checkpoint_is_refused_before_launch(tmp_path, damage, needle):
    saved(tmp_path)
    rank1 = checkpoint.rank_file(tmp_path, 2, 1)
    digest = "d"
    if damage == "latest_garbage":
        (tmp_path / "checkpoints/latest").write_text("garbage\n")
    elif damage == "truncated":
        rank1.write_bytes(rank1.read_bytes()[:100])
    elif damage == "crafted":
        torch.save({"steps_done": 2, "schedule": "d", "model": RunsCode(), "optimizer": {}}, rank1)
    elif damage == "missing_rank":
        rank1.unlink()
    elif damage == "rank_file_a_dir":  # was "missing: saved by fewer ranks"
        rank1.unlink()
        rank1.mkdir()
    elif damage == "rank_file_a_fifo":
        rank1.unlink()
        os.mkfifo(rank1)
    elif damage == "latest_past_the_end":
        (tmp_path / "checkpoints/latest").write_text("99999999\n")
    elif damage == "latest_arabic_digit":
        (tmp_path / "checkpoints/latest").write_text("٣\n")  # int() reads it as 3
    elif damage == "swapped_ranks":
        rank0 = checkpoint.rank_file(tmp_path, 2, 0)
        data0, data1 = rank0.read_bytes(), rank1.read_bytes()
        rank0.write_bytes(data1)
        rank1.write_bytes(data0)
    elif damage == "other_schedule":
        digest = "other"
    elif damage == "format_3":
        edit(rank1, lambda state: state.update(format=3) or state.pop("shapes"))
    elif damage == "format_2":
        edit(rank1, lambda state: state.update(format=2) or state.pop("rank"))
    elif damage == "edited_tensor":
        edit(rank1, lambda state: narrowed(state, record=False))
    elif damage == "dropped_tensor":
        edit(rank1, lambda state: state["model"].pop(QKV))
    elif damage == "edited_tensor_and_record":
        edit(rank1, lambda state: narrowed(state, record=True))
    elif damage == "moment_of_another_shape":  # the moment and its shape record alike
        edit(rank1, lambda state: moment(state, 0, torch.zeros(3)))
    elif damage == "moments_of_another_grouping":  # one group, as torch's default AdamW makes
        edit(rank1, lambda state: merge_groups(state["optimizer"]))
    elif damage == "moment_of_no_parameter":
        edit(rank1, lambda state: moment(state, 99, torch.zeros(3)))
    elif damage == "damaged_rng":
        edit(rank1, lambda state: state.update(python_rng=(3, (1, 2), None)))
    elif damage == "reordered_keys_and_permuted_moments":
        edit(rank1, lambda state: reordered(state, permute_moments=True))
    elif damage == "unknown_weight":
        extra = {"0.decoder.layers.7.mlp.linear_fc2.weight": torch.zeros(8, 16)}
        edit(rank1, lambda state: state["model"].update(extra) or recorded(state))
    elif damage == "several_optimizers":
        chain = lambda state: state.update(optimizer=[state["optimizer"]] * 2)  # noqa: E731
        edit(rank1, lambda state: chain(state) or recorded(state))
    elif damage == "master_copies_on_cpu":
        edit(rank1, with_master_copies)
    elif damage == "distributed_optimizer":
        edit(rank1, lambda state: state.update(optimizer={}) or recorded(state))
    layout, dims = {
        "other_layout": (ParallelLayout(tp=2), DIMS),
        "other_model": (LAYOUT, dataclasses.replace(DIMS, ffn_hidden_size=32)),
        "other_normalization": (LAYOUT, dataclasses.replace(DIMS, normalization="LayerNorm")),
    }.get(damage, (LAYOUT, DIMS))
    before = snapshot(tmp_path)
    with pytest.raises(SlimeHydraError) as err:
        checkpoint.verify(tmp_path, digest, layout, dims)
    assert needle in str(err.value)
    assert not Path("/tmp/slime_hydra_ckpt_pwned").exists()
    assert_untouched(before, tmp_path)


def test_a_checkpoint_with_its_keys_reordered_is_accepted_and_loads_each_moment_on_its_weight(
    tmp_path,
):
    """Weights load by name and moments by position in the model's order, so reordering only
    the keys changes nothing: the check accepts it, and each weight gets its own moments."""
    model = megatron_shaped(DIMS, LAYOUT, 0)
    opt = adamw(model, lr=0.1)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    for rank in range(2):
        checkpoint.save(tmp_path, 2, rank, model, opt, "d", IDENT)
    checkpoint.mark_latest(tmp_path, 2)
    edit(checkpoint.rank_file(tmp_path, 2, 1), lambda state: reordered(state, False))
    assert checkpoint.verify(tmp_path, "d", LAYOUT, DIMS) == 2
    fresh, fresh_opt = fresh_optimizer()
    checkpoint.load(tmp_path, 1, fresh, fresh_opt, "d", IDENT)
    saved_moments = {n: opt.state[p]["exp_avg"] for n, p in model.named_parameters()}
    for name, p in fresh.named_parameters():
        assert torch.equal(fresh_opt.state[p]["exp_avg"], saved_moments[name]), name


@pytest.mark.parametrize(
    ("copy_shape", "needle"),
    [
        (None, None),
        (
            (3,),
            "rank_000.pt: the optimizer's fp32 master copy 0 of param group 0 "
            "(0.embedding.word_embeddings.weight) has shape [3], and this run's model gives that "
            "weight [128, 8]",
        ),
    ],
)
def test_megatron_master_copies_are_checked_and_a_torch_state_is_refused_for_them(
    tmp_path, copy_shape, needle
):
    """A bf16/fp16 run on a GPU resumes megatron's mixed-precision state: the copies it copies
    back into its fp32 weights have their weights' shapes, in the model's order. (Megatron
    builds that optimizer for CUDA tensors only: the state is laid out here as it saves it.)"""
    saved(tmp_path)
    for rank in range(2):
        edit(checkpoint.rank_file(tmp_path, 2, rank), lambda s: with_master_copies(s, copy_shape))
    if needle is None:
        assert checkpoint.verify(tmp_path, "d", LAYOUT, DIMS, master_copies=True) == 2
        return
    with pytest.raises(SlimeHydraError) as err:
        checkpoint.verify(tmp_path, "d", LAYOUT, DIMS, master_copies=True)
    assert needle in str(err.value)


def test_a_torch_optimizer_state_is_refused_where_megatron_master_copies_are_loaded(tmp_path):
    saved(tmp_path)
    with pytest.raises(SlimeHydraError, match="loads megatron's mixed-precision state with fp32"):
        checkpoint.verify(tmp_path, "d", LAYOUT, DIMS, master_copies=True)


# -- the non-finite step policy ---------------------------------------------------------------


def job_in(run_dir: Path) -> SimpleNamespace:
    return SimpleNamespace(run=SimpleNamespace(run_dir=run_dir))


def result(loss: float, grad_norm: float, skipped: bool = False) -> SimpleNamespace:
    return SimpleNamespace(loss=loss, grad_norm=grad_norm, skipped=skipped)


def test_a_finite_step_counts(tmp_path):
    assert not step_skipped(result(0.5, 1.0), 3, False, job_in(tmp_path))


@pytest.mark.parametrize("values", [(float("nan"), 1.0), (0.5, float("inf")), (0.5, None)])
def test_a_non_finite_step_stops_naming_the_step_and_the_kept_checkpoint(tmp_path, values):
    saved(tmp_path)  # the checkpoint after 2 steps: named 2, resumed at step 3
    before = snapshot(tmp_path)
    with pytest.raises(SlimeHydraError, match=r"step 7: .*not finite.*after step 2 ") as err:
        step_skipped(result(*values), 7, False, job_in(tmp_path))
    assert "trainer.skip_nonfinite=true" in str(err.value)
    assert_untouched(before, tmp_path)


def test_skip_nonfinite_skips_a_step_the_optimizer_skipped(tmp_path):
    assert step_skipped(result(float("nan"), float("nan"), skipped=True), 4, True, job_in(tmp_path))
    with pytest.raises(SlimeHydraError, match="applied the update anyway"):
        step_skipped(result(float("nan"), 1.0), 4, True, job_in(tmp_path))


# -- worker failures --------------------------------------------------------------------------


def failure(tmp_path: Path, rank: int, message: str | None, exitcode: int = 1, ts: int = 0):
    error_file = tmp_path / f"error_{rank}.json"
    if message is not None:
        data = {
            "message": {
                "message": message,
                "extraInfo": {"py_callstack": "tb", "timestamp": str(ts)},
            }
        }
        error_file.write_text(json.dumps(data))
    return ProcessFailure(
        local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file=str(error_file)
    )


def test_the_failure_is_reported_from_the_rank_where_it_happened(tmp_path):
    failures = {
        # rank 1 noticed first (an earlier timestamp) that its peer was gone
        1: failure(tmp_path, 1, "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]", ts=1),
        0: failure(
            tmp_path, 0, "SlimeHydraError: rank_000.pt does not fit this rank's model", ts=2
        ),
    }
    report = failure_report(failures)
    assert report.startswith("training failed on rank 0 (exit code 1): rank_000.pt does not fit")
    assert "rank 1: RuntimeError: [gloo] Connection closed by peer" in report


GLOO_LOST = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:55976. This is typically caused by a remote worker "
    "crashing."
)


def test_a_peers_long_message_is_quoted_whole_sentences_without_source_places(tmp_path):
    failures = {
        0: failure(tmp_path, 0, "SlimeHydraError: rank_000.pt does not fit", ts=1),
        1: failure(tmp_path, 1, GLOO_LOST, ts=2),
        2: failure(tmp_path, 2, "RuntimeError: " + "word " * 60, ts=3),
        3: failure(tmp_path, 3, "RuntimeError: First. " + "Second sentence is long. " * 9, ts=4),
    }
    report = failure_report(failures)
    assert report.endswith(
        "Then: rank 1: RuntimeError: Connection closed by peer [127.0.0.1]:55976. This is "
        "typically caused by a remote worker crashing; rank 2: RuntimeError: "
        + "word " * 28
        + "word …; rank 3: RuntimeError: First. "
        + "Second sentence is long. " * 4
        + "Second sentence is long."
    ), report
    assert "pair.cc" not in report and "caused by a ." not in report


def test_a_killed_rank_is_the_cause_when_the_others_only_lost_it(tmp_path):
    failures = {
        0: failure(tmp_path, 0, "RuntimeError: Connection closed by peer", ts=1),
        1: failure(tmp_path, 1, None, exitcode=1),
    }
    assert failure_report(failures).startswith("training failed on rank 1 (exit code 1)")


def test_a_stopped_ranks_recorded_error_is_found_in_the_last_attempt(tmp_path):
    """The launcher stopped rank 2 (node 1's local rank 0) before it exited with its own error;
    its error file in the last attempt is still read, an older attempt's is not."""
    for attempt, local, message in [
        (0, 1, "RuntimeError: an old attempt's error"),
        (1, 0, "SlimeHydraError: rank_002.pt does not fit this rank's model"),
    ]:
        path = tmp_path / "run_x" / f"attempt_{attempt}" / str(local) / "error.json"
        path.parent.mkdir(parents=True)
        info = {"py_callstack": "tb", "timestamp": "0"}
        path.write_text(json.dumps({"message": {"message": message, "extraInfo": info}}))
    (tmp_path / "run_x" / "attempt_1" / "1").mkdir()  # a rank that recorded nothing
    found = recorded_failures(tmp_path, first_rank=2)
    assert list(found) == [2]
    report = failure_report(
        {**found, 3: failure(tmp_path, 3, "RuntimeError: [gloo] Connection closed by peer")}
    )
    assert report.startswith("training failed on rank 2 (exit code 1): rank_002.pt does not fit")
