"""The parallel layout the planner chooses: one ``Layout`` for the planner, the launchers and the worker.

Its own module so that ``layout`` (the rules and the search) and ``memory`` (which sizes a layout)
both import it without importing each other.
"""

from __future__ import annotations

from typing import Any, Literal

from attrs import frozen

Device = Literal["cpu", "cuda"]  # what a stage's ranks train on (the planner's StagePlan.device, the job's device)

# The fields of a Layout the job file carries (docs/stage-directory.md); the others
# (nodes, gpus_per_node, distributed_optimizer) the worker reads from the stage's spec (mcx.contract.job).
JOB_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "dp", "world_size", "sequence_parallel")


@frozen(kw_only=True)
class Layout:
    """Parallel degrees; tp x pp x cp x dp is the world size (nodes x gpus_per_node)."""

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    cp: int = 1
    ep: int = 1
    dp: int = 1
    world_size: int = 1
    gpus_per_node: int = 1
    nodes: int = 1
    sequence_parallel: bool = False
    distributed_optimizer: bool = True

    @property
    def virtual_stages(self) -> int | None:
        """Model chunks per pipeline rank for the interleaved schedule; None when not interleaving
        (MCore's ``virtual_pipeline_model_parallel_size`` must then be None, not 1)."""
        return self.vpp if self.pp > 1 and self.vpp is not None and self.vpp > 1 else None

    def job_dict(self) -> dict[str, Any]:
        """The ``layout`` object of the job contract (docs/stage-directory.md)."""
        return {name: getattr(self, name) for name in JOB_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        return {**self.job_dict(), "gpus_per_node": self.gpus_per_node, "nodes": self.nodes,
                "distributed_optimizer": self.distributed_optimizer}
