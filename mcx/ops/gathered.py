"""A cross-layout replay's kept tensors gathered into layout-free ones (D74): each layer-level module's output
per sample of the global batch, whatever rank and micro-batch held it, and each parameter after the step as
one canonical full tensor, whatever tensor-parallel rank held which shard.

A sample is named by its token ids (the micro-batch's input the trace kept), so two layouts that split the
global batch differently still compare each sample with itself. Outputs are sequence-first ([s, b, ...]);
they are whole on every tensor-parallel rank, except with sequence parallelism (split along the sequence)
and the output layer's logits (split along the vocabulary). A tensor-parallel parameter is split along the
dimension its record names (``tp_dim``); a SwiGLU fc1 holds its gate and up halves shard by shard, so each
shard is halved before the halves are joined. torch is imported here only: the control plane reads a replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

from mcx.contract.trace import LAYER_LEVEL, TRACE_DIR, tensors_file

if TYPE_CHECKING:
    import torch

Records = Sequence[dict[str, Any]]


@frozen
class Sample:
    tokens: bytes  # the sample's token ids: its name in either layout
    dp: int
    micro_batch: int
    index: int  # within the micro-batch


@frozen
class Gathered:
    """One replay's step: module -> {sample's tokens: (output [s, ...], where)}, parameter -> full tensor,
    and the modules in execution order."""

    outputs: dict[str, dict[bytes, tuple[Any, Sample]]]
    parameters: dict[str, Any]
    order: tuple[str, ...]
    layers: dict[str, int | None]  # module or parameter -> its record's layer


def _kept(replay: Path, ranks: set[int]) -> dict[int, dict[str, Any]]:
    import torch

    return {r: torch.load(replay / TRACE_DIR / tensors_file(r), weights_only=True) for r in sorted(ranks)}


def _sole(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record a tensor-parallel rank: context-parallel rank 0, the first pipeline stage holding it."""
    recs = [r for r in recs if r["cp"] == 0]
    first_pp = min((r["pp"] for r in recs), default=0)
    return sorted((r for r in recs if r["pp"] == first_pp), key=lambda r: r["tp"])


def gather(replay: Path, records: Records, *, sequence_parallel: bool, swiglu: bool) -> Gathered:
    import torch

    kept = _kept(replay, {int(r["rank"]) for r in records})

    def tensor(rec: dict[str, Any]) -> torch.Tensor:
        t: torch.Tensor | None = kept[int(rec["rank"])].get(rec["key"])
        if t is None:
            raise ValueError(f"{replay}: the trace kept no tensor for {rec['key']}")
        return t

    tokens: dict[tuple[int, int], torch.Tensor] = {}
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    params: dict[str, list[dict[str, Any]]] = {}
    order: list[str] = []
    layers: dict[str, int | None] = {}
    low = min(int(r["rank"]) for r in records)
    for rec in records:
        if rec["phase"] == "batch" and rec["cp"] == 0:
            tokens.setdefault((rec["dp"], rec["micro_batch"]), tensor(rec))
        elif rec["phase"] == "forward" and rec["occurrence"] == 0 and LAYER_LEVEL.match(rec["module"]):
            groups.setdefault((rec["module"], rec["dp"], rec["micro_batch"]), []).append(rec)
            if rec["module"] not in layers and rec["rank"] == low:
                order.append(rec["module"])
            layers.setdefault(rec["module"], rec["layer"])
        elif rec["phase"] == "update" and rec["dp"] == 0:
            params.setdefault(rec["module"], []).append(rec)
            layers.setdefault(rec["module"], rec["layer"])
    outputs: dict[str, dict[bytes, tuple[Any, Sample]]] = {}
    for (module, dp, mb), recs in groups.items():
        shards = [tensor(r) for r in _sole(recs)]
        if module == "output_layer":
            whole = torch.cat(shards, dim=-1)
        elif sequence_parallel:
            whole = torch.cat(shards, dim=0)
        else:
            whole = shards[0]
        ids = tokens[(dp, mb)]  # [b, s]
        for i in range(ids.shape[0]):
            key = ids[i].contiguous().numpy().tobytes()
            outputs.setdefault(module, {}).setdefault(key, (whole[:, i], Sample(key, dp, mb, i)))
    parameters = {name: _joined([tensor(r) for r in _sole(recs)], _sole(recs)[0].get("tp_dim"),
                                swiglu and name.endswith("mlp.linear_fc1.weight"))
                  for name, recs in params.items()}
    for name in order:  # a module of a later pipeline stage, not on the lowest rank: in layer order after
        layers.setdefault(name, None)
    rest = sorted((m for m in outputs if m not in order), key=lambda m: (layers.get(m) or 0, m))
    return Gathered(outputs=outputs, parameters=parameters, order=(*order, *rest), layers=layers)


def _joined(shards: list[Any], dim: int | None, gated: bool) -> Any:
    import torch

    if dim is None or len(shards) == 1:
        return shards[0]
    if gated:  # [gate_0; up_0], [gate_1; up_1] -> [gate_0; gate_1; up_0; up_1]
        halves = [s.chunk(2, dim=dim) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=dim)
    return torch.cat(shards, dim=dim)


def common(a: Any, b: Any) -> tuple[Any, Any]:
    """Both tensors cut to their common shape: the vocabulary is padded to a multiple the layout sets, so
    embedding rows and logits past the real vocabulary may exist in one layout only."""
    if a.shape == b.shape:
        return a, b
    if a.dim() != b.dim():
        raise ValueError(f"shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
    index = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, b.shape))
    return a[index], b[index]


def max_abs(a: Any, b: Any) -> float:
    a, b = common(a, b)
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def ulp_floor(a: Any) -> float:
    """One unit of rounding of the tensor's largest value (its dtype's eps times its abs-max)."""
    import torch

    return float(torch.finfo(a.dtype).eps * a.double().abs().max()) if a.numel() and a.is_floating_point() else 0.0
