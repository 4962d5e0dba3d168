"""What `mcx locate A B` found for two runs of one model in different layouts (D74): each layer's gathered
full tensors compared against a band measured by a rounding-noise replay; "equivalent up to layer N within
the band", or the first tensor where the layouts part. Pure: typed results and their sentences.
"""

from __future__ import annotations

from typing import Any, Literal

from attrs import asdict, frozen

# The band: BAND_MARGIN times the difference one unit of rounding makes at that tensor (measured by the noise
# replay), and never below one unit of rounding of the tensor's largest value. The margin covers the layouts'
# reductions rounding at more places than the noise replay does (D74 says how it was measured).
BAND_MARGIN = 10.0


@frozen(kw_only=True)
class TensorCheck:
    """One gathered tensor of the traced step: a layer-level module's output over every sample of the global
    batch, or a parameter after the optimizer's step as one canonical full tensor."""

    what: Literal["output", "parameter"]
    name: str  # module path (output) or parameter path (parameter), layer index global and 0-based
    layer: int | None  # 1-based; 0: the embedding; None: after the last layer (final norm, output layer)
    max_abs: float  # between the two layouts
    noise: float  # between the first run's replay and its rounding-noise replay
    band: float
    samples: int  # samples of the global batch compared (outputs); 0 for a parameter
    where: str  # where the largest difference is: "sample 3 (run B: DP 1, micro-batch 0)"; "" if none

    @property
    def within(self) -> bool:
        return self.max_abs <= self.band

    def said(self) -> str:
        kind = "output" if self.what == "output" else "after the step"
        at = f" at {self.where}" if self.where else ""
        return (f"`{self.name}` {kind}: max abs {self.max_abs:.3g}{at}, band {self.band:.3g} "
                f"(rounding noise {self.noise:.3g})")


@frozen(kw_only=True)
class LayoutsLocated:
    """`mcx locate A B` for two layouts: ``first`` is the first tensor out of its band (None: all within)."""

    run_a: str
    run_b: str
    layouts: tuple[str, str]  # e.g. "TP1 PP1 CP1 EP1 DP1, 2 micro-batches of 2"
    step: int
    start: str  # what both replays started from
    checks: tuple[TensorCheck, ...]  # in execution order: outputs layer by layer, then parameters
    first: TensorCheck | None
    layers: int  # the model's transformer layers
    band: str  # how the band was measured, one sentence
    replays: tuple[str, ...]

    @property
    def differs(self) -> bool:
        return self.first is not None

    def summary(self) -> str:
        if self.first is None:
            return (f"step {self.step}: equivalent up to layer {self.layers} within the band "
                    f"({len(self.checks)} tensors, every layer's output and every parameter after the step)")
        f = self.first
        layer = {None: "after the last layer", 0: "at the embedding"}.get(f.layer, f"at layer {f.layer}")
        return f"step {self.step}: the layouts part {layer}: {f.said()}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self, recurse=True)
        for c, check in zip(out["checks"], self.checks):
            c["within"] = check.within
        if out["first"] is not None:
            out["first"]["within"] = False
        return {**out, "across_layouts": True, "differs": self.differs, "summary": self.summary()}


def layout_name(layout: dict[str, Any], micro: int, micro_size: int) -> str:
    """A job's layout in one line: "TP1 PP1 CP1 EP1 DP2, 1 micro-batch of 2 a rank"."""
    degrees = " ".join(f"{k.upper()}{layout.get(k, 1)}" for k in ("tp", "pp", "cp", "ep", "dp"))
    sp = " SP" if layout.get("sequence_parallel") else ""
    return f"{degrees}{sp}, {micro} micro-batch{'es' if micro != 1 else ''} of {micro_size} a rank"
