"""Pure partitioning algorithms on lists of integer workloads: no torch, no config, no I/O."""

from slime_hydra.partition.balanced import BalancedPacker
from slime_hydra.partition.base import Partitioner, PartitionError, Work, align_up, part_sums
from slime_hydra.partition.bounds import max_part_lower_bound, min_bins_lower_bound
from slime_hydra.partition.greedy import first_fit, first_fit_decreasing
from slime_hydra.partition.karmarkar_karp import karmarkar_karp
from slime_hydra.partition.workload import flops_workloads

__all__ = [
    "BalancedPacker",
    "PartitionError",
    "Partitioner",
    "Work",
    "align_up",
    "first_fit",
    "first_fit_decreasing",
    "flops_workloads",
    "karmarkar_karp",
    "max_part_lower_bound",
    "min_bins_lower_bound",
    "part_sums",
]
