"""ParallelLayout: the parallel sizes a schedule is planned for, checked once at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from slime_hydra.errors import SlimeHydraError


@dataclass(frozen=True)
class ParallelLayout:
    """Data, tensor, pipeline, virtual-pipeline and context parallel sizes.

    world size = dp × tp × pp × cp. `microbatch_group_size_per_vp_stage` (megatron's name)
    defaults to pp, as in megatron-core.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    """Virtual pipeline stages (model chunks) per pipeline rank; needs pp > 1."""
    cp: int = 1
    microbatch_group_size_per_vp_stage: int | None = None
    """Micro-batches per VPP group; null means pp (megatron-core's default)."""
    sequence_parallel: bool = False
    """Megatron's sequence parallelism: activations outside attention split over the TP ranks."""

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "vpp", "cp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SlimeHydraError(
                    f"parallel.{name}={value!r} is not a positive integer; "
                    f"set parallel.{name} to 1 or more."
                )
        if self.vpp > 1 and self.pp == 1:
            raise SlimeHydraError(
                f"parallel.vpp={self.vpp} needs pipeline parallelism, but parallel.pp=1; "
                "set parallel.pp to 2 or more, or parallel.vpp=1."
            )
        if self.sequence_parallel and self.tp == 1:
            raise SlimeHydraError(
                "parallel.sequence_parallel=true splits activations over tensor-parallel ranks, "
                "but parallel.tp=1; set parallel.tp to 2 or more, or sequence_parallel=false."
            )
        g = self.microbatch_group_size_per_vp_stage
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
            raise SlimeHydraError(
                f"parallel.microbatch_group_size_per_vp_stage={g!r} is not a positive integer."
            )
        if self.vpp > 1 and self.vp_group_size < self.pp:
            raise SlimeHydraError(
                f"parallel.microbatch_group_size_per_vp_stage={self.vp_group_size} is below "
                f"parallel.pp={self.pp}, which megatron-core's interleaved schedule rejects at "
                f"run time; set parallel.microbatch_group_size_per_vp_stage to {self.pp} or more."
            )

    @property
    def world_size(self) -> int:
        """Processes the layout needs: dp × tp × pp × cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def vp_group_size(self) -> int:
        """Micro-batches per virtual-pipeline group (megatron's default: pp)."""
        g = self.microbatch_group_size_per_vp_stage
        return self.pp if g is None else g

    @property
    def microbatch_alignment(self) -> int:
        """The per-rank micro-batch count must be a multiple of this (1 without VPP)."""
        return self.vp_group_size if self.vpp > 1 else 1
