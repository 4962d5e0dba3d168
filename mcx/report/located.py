"""What `mcx locate` found: the first traced operation whose output differs while its inputs matched, its
class and the fix to try (D70, docs/reproduce.md). Pure: two traces' records in, typed results out.

Order: each rank's records are in execution order (mcx.contract.trace); the first difference of a pair of
traces is each rank's first differing record, the earliest of those (by position in its rank's order).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from attrs import asdict, frozen

Kind = Literal["data", "config", "library", "nondeterministic", "optimizer", "hardware", "unexplained"]
KINDS: tuple[Kind, ...] = ("data", "config", "library", "nondeterministic", "optimizer", "hardware", "unexplained")


@frozen(kw_only=True)
class Difference:
    """One operation, traced in both runs, whose output differs."""

    key: str
    step: int
    micro_batch: int | None  # None: after the step's backward (a parameter's gradient or update)
    phase: str  # batch | forward | backward | grad | update
    module: str
    layer: int | None  # 1-based, global (None: not inside a transformer layer)
    position: dict[str, int]  # the rank's tp, pp, cp, dp, ep
    rank: int
    inputs_identical: bool | None  # forward: its inputs' hashes compared; else: every record before it matched
    max_abs: float | None  # over the full tensors; None when neither trace kept them
    sum: tuple[float, float]
    norm: tuple[float, float]

    def where(self) -> str:
        """One line, e.g. "step 12, micro-batch 1, layer 2 `mlp.linear_fc2` forward, TP rank 0 (DP 0, PP 0)"."""
        mb = f"micro-batch {self.micro_batch}, " if self.micro_batch is not None else "after backward, "
        module = self.module
        if self.layer is not None:
            module = module.split(".", 3)[3] if module.count(".") >= 3 else module
            module = f"layer {self.layer} `{module}`"
        else:
            module = f"`{module}`"
        p = self.position
        rest = f"DP {p['dp']}, PP {p['pp']}" + "".join(f", {k.upper()} {p[k]}" for k in ("cp", "ep") if p.get(k))
        return f"step {self.step}, {mb}{module} {self.phase}, TP rank {p['tp']} ({rest})"

    def said(self) -> str:
        inputs = {True: "inputs identical", False: "inputs differ too", None: "inputs unknown"}[self.inputs_identical]
        size = f"max abs {self.max_abs:.3g}" if self.max_abs is not None else \
            f"sum {self.sum[0]:.6g} vs {self.sum[1]:.6g}"
        return f"{self.where()}: {inputs}, output differs ({size})"


@frozen(kw_only=True)
class Located:
    """`mcx locate A B` (or `mcx reproduce RUN --locate`): ``first`` is None when the traces are identical."""

    run_a: str
    run_b: str
    step: int | None  # the step replayed and traced; None: the recorded metrics never differ (nothing replayed)
    first: Difference | None
    kind: Kind | None
    cause: str  # what the classification rests on, one sentence
    fix: str
    records: int  # records compared (each run's, all ranks)
    replays: tuple[str, ...]  # the replay directories (their trace/ and worker.log)

    @property
    def differs(self) -> bool:
        return self.first is not None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self, recurse=True), "differs": self.differs,
                "summary": self.first.said() if self.first else "no difference"}


def _by_rank(records: Iterable[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for rec in records:
        out.setdefault(int(rec["rank"]), []).append(rec)
    return {r: sorted(recs, key=lambda x: x["index"]) for r, recs in out.items()}


def structure_problem(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> str | None:
    """Why two traces cannot be compared record by record (another model or layout), or None."""
    ka, kb = [r["key"] for r in a], [r["key"] for r in b]
    if ka == kb:
        return None
    only_a, only_b = sorted(set(ka) - set(kb)), sorted(set(kb) - set(ka))
    if only_a or only_b:
        return (f"the traces name different operations ({len(only_a)} only in the first, e.g. "
                f"{(only_a or ['-'])[0]}; {len(only_b)} only in the second, e.g. {(only_b or ['-'])[0]})")
    return "the traces run the same operations in another order"


def first_pair(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The first record (see the module docstring) whose content hash differs, with its counterpart; None: equal."""
    ra, rb = _by_rank(a), _by_rank(b)
    found: list[tuple[int, int, dict[str, Any], dict[str, Any]]] = []
    for rank, recs in ra.items():
        for x, y in zip(recs, rb.get(rank, [])):
            if x["sha"] != y["sha"]:
                found.append((x["index"], rank, x, y))
                break
    if not found:
        return None
    _, _, x, y = min(found, key=lambda f: (f[0], f[1]))
    return x, y


def difference(x: dict[str, Any], y: dict[str, Any], max_abs: float | None) -> Difference:
    inputs = (x.get("inputs") == y.get("inputs")) if "inputs" in x else True
    return Difference(key=x["key"], step=x["step"], micro_batch=None if x["micro_batch"] < 0 else x["micro_batch"],
                      phase=x["phase"], module=x["module"], layer=x["layer"],
                      position={k: int(x[k]) for k in ("tp", "pp", "cp", "dp", "ep")}, rank=int(x["rank"]),
                      inputs_identical=inputs, max_abs=max_abs, sum=(x["sum"], y["sum"]), norm=(x["norm"], y["norm"]))


def only_updates_differ(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> bool:
    """Every batch, forward, backward and gradient record matches; an update differs."""
    pairs = list(zip(a, b))
    return all(x["sha"] == y["sha"] for x, y in pairs if x["phase"] != "update") and \
        any(x["sha"] != y["sha"] for x, y in pairs if x["phase"] == "update")


FIXES: dict[Kind, str] = {
    "data": "the runs read different batches at this step: compare their data (`mcx explain A B`) and, for a resumed "
            "run, its data position (consumed samples); the batch hash in the metrics names the first such step",
    "config": "the runs' configs differ (the keys named): that change is where they part; rerun with it reverted to "
              "confirm",
    "library": "the environments differ (the components named): run both with one lockfile or container image, or "
               "accept the difference as that library's",
    "nondeterministic": "the same run replayed twice already differs at this operation: a non-deterministic kernel; "
                        "set train.deterministic = true (deterministic algorithms, NCCL and Transformer Engine "
                        "deterministic modes) and rerun",
    "optimizer": "every forward and backward record matches and a parameter update differs: check the optimizer "
                 "(its state in the checkpoint, the distributed optimizer's sharding, the update's precision)",
    "hardware": "the runs ran on different hardware (the fields named) with identical inputs: the kernels chosen "
                "there differ; compare on one machine, or judge by the seed-spread band (`mcx reproduce`)",
    "unexplained": "config, data, environment and hardware match and the replay is deterministic, yet this operation "
                   "differs: the recorded run was not what a replay computes now (a changed checkpoint, a driver "
                   "update); replay both again with `mcx locate` to confirm, and report it",
}
