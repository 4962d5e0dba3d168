"""`mcx locate A B` for two runs of one model in different layouts (D74).

Both runs are replayed over the step from the same start (each its checkpoint at one common step, or both
their stage's start from one ``[init] from`` source), keeping their layer-level outputs and parameters after
the step in full (mcx.contract.trace's ``layers``); mcx.ops.gathered makes them layout-free tensors. The band
each tensor is judged by is measured, not set: the first run is replayed once more adding one unit of
rounding (its dtype's eps, relative) to the embedding's and every attention and MLP block's output and to the
gradient the backward brings to each, where layouts reduce in another order (D79); the difference that makes at each tensor, times BAND_MARGIN, is its band
(mcx.report.parted). The verdict: every tensor within (equivalent up to the last layer), or the first one out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcx.contract.checkpoints import checkpoint_root, checkpoint_steps
from mcx.errors import InputError
from mcx.metrics.batches import compare_batches, read_batches
from mcx.ops.progress import Note, Progress
from mcx.report.parted import BAND_MARGIN, LayoutsLocated, TensorCheck, layout_name

DEGREES = ("tp", "pp", "cp", "ep", "dp")


def micro_split(job: dict[str, Any]) -> tuple[int, int]:
    """(micro-batches a data-parallel rank trains a step, their size) of a stage's job."""
    t = job["spec"]["train"]
    return t["global_batch_size"] // (t["micro_batch_size"] * job["layout"]["dp"]), t["micro_batch_size"]


def _start(stage: Path, step: int) -> int:
    """The step a replay of ``step`` starts from: its newest checkpoint before it, 0 for the stage's start."""
    return max((s for s in checkpoint_steps(checkpoint_root(stage)) if s <= step - 1), default=0)


def _refusals(ref_a: str, ref_b: str, stage_a: Path, stage_b: Path, ja: dict[str, Any], jb: dict[str, Any],
              step: int) -> str:
    """Refuses what cannot be compared across layouts; returns what both replays start from."""
    ma, mb = ja["spec"]["model"], jb["spec"]["model"]
    if ma != mb:
        keys = sorted(k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k))
        raise InputError(f"{ref_a} and {ref_b} train different models ({', '.join(f'model.{k}: {ma.get(k)!r} vs '
                         f'{mb.get(k)!r}' for k in keys[:4])}); layouts are compared on one model;",
                         "locate two runs of the same [model] table.")
    for job, ref in ((ja, ref_a), (jb, ref_b)):
        unsupported = [k for k in ("cp", "ep") if job["layout"].get(k, 1) != 1]
        if unsupported:
            raise InputError(f"{ref} runs with {', '.join(f'{k.upper()} {job['layout'][k]}' for k in unsupported)}; "
                             "across layouts, locate gathers tensor, pipeline and data parallelism and micro-batch "
                             "splits only;", "compare layouts without context or expert parallelism.")
    if micro_split(ja) == micro_split(jb) and ja["layout"]["dp"] == jb["layout"]["dp"]:  # one split: the hashes compare
        check = compare_batches(read_batches(stage_a), read_batches(stage_b))
        if check is not None and check.first is not None and check.first.step <= step:
            raise InputError(f"{ref_a} and {ref_b} did not train on the same data order: their {check.describe()};",
                             "layouts are compared on one data order: train both with the same data, seed and "
                             "start (`mcx compare` shows the batch check).")
    sa, sb = _start(stage_a, step), _start(stage_b, step)
    ca, cb = checkpoint_steps(checkpoint_root(stage_a)), checkpoint_steps(checkpoint_root(stage_b))
    if sa != sb:
        both = sorted(set(ca) & set(cb))
        raise InputError(f"no common checkpoint step to replay step {step} from: {ref_a} starts it from "
                         f"{_said(sa)}, {ref_b} from {_said(sb)} (checkpoints at {ca or 'none'} and {cb or 'none'});",
                         f"pick a step just after one both saved ({', '.join(map(str, both)) or 'none'}) with --step, "
                         "or train both with the same checkpoint.interval.")
    if sa == 0:
        ia, ib = ja.get("init"), jb.get("init")
        if not ia or not ib or ia["path"] != ib["path"]:
            raise InputError(f"{ref_a} and {ref_b} do not start from the same weights ({_init(ia)} vs {_init(ib)}); "
                             "across layouts, the replays must start from one set of canonical weights;",
                             "start both from one checkpoint ([init] from = \"run:ID\", mcx loads it into any "
                             "layout), or locate a step after a checkpoint both saved.")
        return f"the same weights, {ia['path']} ([init] from), at each stage's start"
    return (f"each run's checkpoint at step {sa}: the layouts' own rounding over the {sa} step(s) before is in "
            "the difference, not in the band")


def _said(start: int) -> str:
    return f"its checkpoint at step {start}" if start else "its stage's start"


def _init(init: dict[str, Any] | None) -> str:
    return f"[init] from {init['path']}" if init else "its own random initialisation"


def locate_across(ref_a: str, ref_b: str, path_a: Path, path_b: Path, ja: dict[str, Any], jb: dict[str, Any],
                  step: int, *, progress: Progress) -> LayoutsLocated:
    from mcx.ops import gathered
    from mcx.ops.replays import read_trace, replay

    stage_a, stage_b = path_a / "full", path_b / "full"
    start = _refusals(ref_a, ref_b, stage_a, stage_b, ja, jb, step)
    ra = replay(stage_a, step, layers=True, progress=progress)
    rb = replay(stage_b, step, layers=True, progress=progress)
    rn = replay(stage_a, step, layers=True, noise=True, progress=progress)
    progress(Note(lead="locate", text=f": gathering step {step}'s layer outputs and parameters"))
    model = ja["spec"]["model"]
    swiglu = bool(model.get("swiglu", True))
    ga, gb, gn = (gathered.gather(r, read_trace(r), sequence_parallel=bool(j["layout"].get("sequence_parallel")),
                                  swiglu=swiglu) for r, j in ((ra, ja), (rb, jb), (rn, ja)))
    checks: list[TensorCheck] = []
    for name in ga.order:
        a, b, n = ga.outputs[name], gb.outputs.get(name, {}), gn.outputs[name]
        if set(a) != set(b):
            raise InputError(f"{ref_a} and {ref_b} trained step {step} on different samples ({len(set(a) - set(b))} "
                             f"of {len(a)} only in {ref_a}'s global batch): not the same data order;",
                             "layouts are compared on one data order: train both with the same data, seed and start.")
        worst, where, noise, floor = 0.0, "", 0.0, 0.0
        for i, (key, (x, _)) in enumerate(a.items()):
            y, s = b[key]
            d = gathered.max_abs(x, y)
            if d > worst:
                worst, where = d, f"sample {i} ({ref_b}: DP {s.dp}, micro-batch {s.micro_batch})"
            noise = max(noise, gathered.max_abs(x, n[key][0]))
            floor = max(floor, gathered.ulp_floor(x))
        checks.append(TensorCheck(what="output", name=name, layer=_layer(name, ga.layers.get(name)), max_abs=worst,
                                  noise=noise, band=max(BAND_MARGIN * noise, floor), samples=len(a), where=where))
    for name, x in ga.parameters.items():
        if name not in gb.parameters:
            raise InputError(f"{ref_b}'s trace has no parameter {name}: not the same model;", "compare one model.")
        noise = gathered.max_abs(x, gn.parameters[name])
        checks.append(TensorCheck(what="parameter", name=name, layer=_layer(name, ga.layers.get(name)),
                                  max_abs=gathered.max_abs(x, gb.parameters[name]), noise=noise,
                                  band=max(BAND_MARGIN * noise, gathered.ulp_floor(x)), samples=0, where=""))
    first = next((c for c in checks if not c.within), None)
    (ma, sa), (mb, sb) = micro_split(ja), micro_split(jb)
    return LayoutsLocated(
        run_a=ref_a, run_b=ref_b, layouts=(layout_name(ja["layout"], ma, sa), layout_name(jb["layout"], mb, sb)),
        step=step, start=start, checks=tuple(checks), first=first, layers=int(model["num_layers"]),
        band=(f"{BAND_MARGIN:g} x the difference one unit of rounding (eps of the dtype, relative) added to the "
              f"embedding's and every attention and MLP block's output and to its gradient makes in a third replay "
              f"of {ref_a} "
              "(never below one unit of rounding of the tensor's largest value)"),
        replays=(str(ra), str(rb), str(rn)))


def _layer(name: str, recorded: int | None) -> int | None:
    """1-based layer of a module or parameter; 0 for the embedding; None past the last layer."""
    if recorded is not None:
        return recorded
    return 0 if name.startswith("embedding") else None
