"""``train.te_op_fuser``: Megatron-Core's TEFusedMLP, made safe to checkpoint and to overlap.

TEFusedMLP runs a dense MLP as one ``te.pytorch.ops.Sequential`` (RMSNorm, FC1, SwiGLU, FC2), which
lets Transformer Engine fuse SwiGLU with the FP8 cast of its output (and dSwiGLU with the cast of the
gradient). MCore builds that sequence at the first forward and keeps it out of the module tree, which
costs two things this subclass gives back (D29):

* **FP8 scaling state in checkpoints.** Under delayed scaling the FC1 and FC2 ops' amax histories
  and scales reached no checkpoint, so a resumed run restarted its FP8 scaling and left the run it
  resumed. Each op's state now travels as the ``_extra_state`` of the module whose weight it uses
  (``linear_fc1``, ``linear_fc2``; the fused MLP leaves theirs unused): MCore's checkpoint keys stay.
* **Forward pre-hooks seen when they run.** MCore copies the submodules' hooks when it builds the
  sequence; Megatron's DDP adds its parameter all-gather hooks only after the first step and removes
  them around evaluation, so the copy missed them and the MLP could read weights still being
  gathered. The sequence now runs the submodules' current pre-hooks at each forward.
"""

from __future__ import annotations

from functools import partial

import torch
import transformer_engine.pytorch as te
from megatron.core.extensions.transformer_engine import TEFusedMLP
from megatron.core.fp8_utils import get_fp8_context
from transformer_engine.pytorch.quantization import FP8GlobalStateManager

_EMPTY = torch.empty(0, dtype=torch.uint8)


class CheckpointedFusedMLP(TEFusedMLP):
    """TEFusedMLP whose fused FC1/FC2 ops save and load their quantization state with the model."""

    _fused_impl: tuple[torch.nn.Module] | None  # TEFusedMLP's: built at the first forward (or a load, below)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for index, linear in enumerate((self.linear_fc1, self.linear_fc2)):
            # Instance attributes shadow the TE modules' own methods, which torch's state_dict and
            # load_state_dict call (MCore's sharded_state_dict goes through state_dict too).
            linear.get_extra_state = partial(self._op_state, index)
            linear.set_extra_state = partial(self._load_op_state, index)

    def _register_hooks_on_fused_impl(self, fused_impl: torch.nn.Module) -> None:
        for sub in self.modules():
            if sub is not self and (sub._forward_hooks or sub._backward_hooks or sub._backward_pre_hooks):
                raise RuntimeError(f"{type(self).__name__}: {type(sub).__name__} has forward-post or backward "
                                   "hooks, which the fused MLP cannot run (it exposes no intermediate tensors)")
        fused_impl.register_forward_pre_hook(self._submodule_pre_hooks)

    def _submodule_pre_hooks(self, *_) -> None:
        """The submodules' forward pre-hooks as registered now (DDP's waits for gathered weights)."""
        for sub in self.modules():
            if sub is self:  # its own hooks ran in its __call__
                continue
            for hook_id, hook in list(sub._forward_pre_hooks.items()):
                result = hook(sub, (), {}) if hook_id in sub._forward_pre_hooks_with_kwargs else hook(sub, ())
                if result is not None:
                    raise RuntimeError(f"{type(self).__name__}: a pre-hook of {type(sub).__name__} changes its "
                                       "input, which the fused MLP does not expose")

    def _linear_ops(self) -> list:
        if self._fused_impl is None:
            # Built at a checkpoint load rather than the first forward: the model is complete by then
            # (hooks are looked up at each forward), and the state must reach the ops while the load runs.
            self._fused_impl = (self._make_fused_impl(),)
        ops = [op for op in self._fused_impl[0].modules() if isinstance(op, te.ops.BasicLinear)]
        assert len(ops) == 2, f"TEFusedMLP built {len(ops)} linear ops, expected FC1 and FC2"
        return ops

    def _op_state(self, index: int) -> torch.Tensor:
        if self._fused_impl is None:  # never ran: no scaling state yet
            return _EMPTY
        return self._linear_ops()[index].get_extra_state()

    def _load_op_state(self, index: int, state: torch.Tensor | None) -> None:
        if state is None or state.numel() == 0:
            return
        op = self._linear_ops()[index]
        if op._fp8_metas is None and self.config.fp8:
            # Create the op's scaling state as its first training forward would, under the run's own
            # recipe and amax-reduction group (set_extra_state alone would register it under a
            # group-less autocast, whose amaxes are reduced over the whole world). Without grad the
            # autocast's exit updates no scales.
            with torch.no_grad(), get_fp8_context(self.config):
                op.reset_recipe_state(recipe=FP8GlobalStateManager.get_fp8_recipe())
        # A state saved by a plain TE linear (te_op_fuser off) has no "forward"/"backward" entries:
        # the op then keeps fresh scaling, as a new run would.
        op.set_extra_state(state)


def checkpointed(mlp_builder: partial) -> partial:
    """The TE layer spec's MLP builder (``partial(TEFusedMLP.as_mlp_submodule, submodules=...)``), with
    CheckpointedFusedMLP in place of TEFusedMLP."""
    return partial(CheckpointedFusedMLP.as_mlp_submodule, *mlp_builder.args, **mlp_builder.keywords)
