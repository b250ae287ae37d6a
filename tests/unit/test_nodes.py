"""Which nodes a job spans, read from a SLURM allocation's environment."""

from __future__ import annotations

import pytest

from slime_hydra.train.run.nodes import first_host, job_nodes, node_count
from slime_hydra.train.run.torchrun import is_rank_zero


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("gpu[003-005,9]", "gpu003"),
        ("gpu[12,14],login1", "gpu12"),
        ("node7", "node7"),
        ("a-b-1,a-b-2", "a-b-1"),
    ],
)
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


def test_a_single_machine_is_one_node_with_a_local_rendezvous(monkeypatch):
    for name in ("SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)
    nodes = job_nodes()
    assert (nodes.count, nodes.rank) == (1, 0)
    assert nodes.endpoint.startswith("127.0.0.1:")
    assert job_nodes().run_id != nodes.run_id  # a fresh rendezvous per job


def test_a_multi_node_slurm_job_meets_on_its_first_node(monkeypatch):
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[041-042]")
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    nodes = job_nodes()
    assert (nodes.count, nodes.rank, nodes.endpoint) == (2, 1, "gpu041:29500")
    assert nodes.run_id == "slime_hydra-slurm-777"
    assert node_count() == 2
    assert not is_rank_zero()  # only the first node's job process writes the run dir
    monkeypatch.setenv("SLURM_NODEID", "0")
    assert is_rank_zero()
