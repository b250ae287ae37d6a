"""Pure partitioning algorithms on lists of integer workloads: no torch, no config, no I/O."""

from slime_hydra.partition.base import Partitioner, PartitionError, align_up, part_sums
from slime_hydra.partition.bounds import min_bins_lower_bound
from slime_hydra.partition.capped import CappedPartitioner, capped_partition
from slime_hydra.partition.greedy import first_fit, lpt
from slime_hydra.partition.karmarkar_karp import karmarkar_karp
from slime_hydra.partition.workload import flops_workloads

__all__ = [
    "CappedPartitioner",
    "PartitionError",
    "Partitioner",
    "align_up",
    "capped_partition",
    "first_fit",
    "flops_workloads",
    "karmarkar_karp",
    "lpt",
    "min_bins_lower_bound",
    "part_sums",
]
