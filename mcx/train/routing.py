"""A mixture of experts' routing, measured every training step (issue 41: load imbalance as measured).

Two numbers a step, both reduced over the whole job:

* ``moe_balance_loss``: Megatron-Core's load-balancing loss (``load_balancing_loss`` or
  ``seq_load_balancing_loss``, without its coefficient), as Megatron-LM logs it: summed over tensor and
  context parallel ranks, averaged over data-parallel replicas, micro-batches and MoE layers. 1.0 when the
  router spreads its tokens and its probability evenly. Only where the spec's auxiliary loss is on.
* ``moe_expert_load``: the busiest expert's routed tokens over the mean expert's, per MoE layer over the
  step's global batch, averaged over the MoE layers. 1.0 is balanced; ``num_experts / topk`` is the worst
  (every token picks that expert). With expert parallelism the busiest expert's rank sets the layer's time.

The tokens are counted on the device by a forward hook on each router (no host sync inside the step) and
read once after the step, with one all-reduce. Evaluation passes (the model in eval mode) are not counted;
a recomputed forward counts a layer's tokens twice, which leaves the ratio unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker, get_moe_metrics_tracker
from megatron.core.transformer.moe.router import Router

from mcx.contract.job import Job
from mcx.spec.schema import ExperimentSpec
from mcx.train.runtime import World

# Megatron-Core's name for each auxiliary loss mcx's spec can turn on (model.moe_router_load_balancing_type)
BALANCE_LOSSES = {"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss"}


@dataclass(frozen=True)
class Routing:
    balance_loss: float | None  # None: no auxiliary loss in the spec
    expert_load: float


def balance_loss_name(spec: ExperimentSpec) -> str | None:
    m = spec.model
    return BALANCE_LOSSES.get(m.moe_router_load_balancing_type) if m.moe_aux_loss_coeff > 0 else None


def tap_routers(chunks: list[torch.nn.Module], job: Job) -> RouterTap | None:
    """The routing tap of a mixture of experts' model chunks; None for a dense model."""
    return RouterTap(chunks, job.spec, job.layout.dp) if job.spec.model.num_experts else None


class RouterTap:
    """Counts each MoE layer's routed tokens per expert during training forwards; ``read`` reduces a step."""

    def __init__(self, chunks: list[torch.nn.Module], spec: ExperimentSpec, data_parallel: int) -> None:
        routers = [m for c in chunks for m in c.modules() if isinstance(m, Router)]
        device = next(chunks[0].parameters()).device
        layers, experts = spec.model.num_layers, spec.model.num_experts or 0
        self.counts = torch.zeros(layers, experts, dtype=torch.float64, device=device)
        self.data_parallel = data_parallel
        self.balance = balance_loss_name(spec)
        destroy_moe_metrics_tracker()  # process-wide: nothing an earlier model recorded, at no other length
        tracker = get_moe_metrics_tracker()
        if self.balance is not None:  # every rank sends the same length, whatever layers it holds
            tracker.ensure_initialized(self.balance, layers, device=device)
        for r in routers:
            r.register_forward_hook(self._count)

    def _count(self, router: Router, args: object, output: tuple[torch.Tensor, torch.Tensor]) -> None:
        if router.training:
            self.counts[router.layer_number - 1] += output[1].sum(0)  # routing_map: [tokens, experts] booleans

    def read(self, world: World, num_micro_batches: int) -> Routing:
        """The step's routing, the same on every rank; clears the counts and Megatron-Core's tracker."""
        tracker = get_moe_metrics_tracker()
        layers, n = self.counts.shape[0], self.counts.numel()
        local = self.counts.flatten()
        if self.balance is not None:
            local = torch.cat([local, tracker.metrics[self.balance].values.to(local)])
        summed = torch.tensor(world.sum(local.tolist()), dtype=torch.float64)
        counts = summed[:n].view(layers, -1)
        moe = counts.sum(1) > 0
        per_layer = counts[moe].amax(1) / counts[moe].mean(1)
        expert_load = float(per_layer.mean()) if moe.any() else 1.0
        balance = None
        if self.balance is not None:
            losses = summed[n:]
            balance = float(losses.sum()) / self.data_parallel / num_micro_batches / max(int(moe.sum()), 1)
        self.counts.zero_()
        tracker.clear()
        return Routing(balance_loss=balance, expert_load=expert_load)
