"""The offline diff of two traces (mcx.report.located): which record is first, what it says; pure, no replay.
The replays themselves run end to end in tests/test_reproduce.py (D70)."""

from __future__ import annotations

from mcx.contract.trace import record_key
from mcx.report.located import difference, first_pair, only_updates_differ, structure_problem


def rec(rank: int, index: int, phase: str, module: str, sha: str, mb: int = 0, **extra) -> dict:
    r = {"tp": rank, "pp": 0, "cp": 0, "dp": 0, "ep": 0, "rank": rank, "index": index, "step": 7, "micro_batch": mb,
         "phase": phase, "module": module, "occurrence": 0, "layer": None, "sha": sha, "sum": 1.0, "norm": 1.0, **extra}
    return {**r, "key": record_key(r)}


def test_the_first_difference_is_the_earliest_in_its_ranks_order():
    a = [rec(0, 0, "forward", "embedding", "e"), rec(0, 1, "forward", "decoder.layers.0.mlp", "m", inputs="i"),
         rec(1, 0, "forward", "embedding", "e"), rec(1, 1, "forward", "decoder.layers.0.mlp", "m", inputs="i")]
    assert first_pair(a, a) is None and structure_problem(a, a) is None
    b = [*a[:1], rec(0, 1, "forward", "decoder.layers.0.mlp", "X", inputs="i"), *a[2:3],
         rec(1, 1, "forward", "decoder.layers.0.mlp", "Y", inputs="j")]
    x, y = first_pair(a, b)
    assert (x["rank"], y["sha"]) == (0, "X")  # both ranks differ at index 1: the lower rank is named
    d = difference(x, y, 0.5)
    assert d.inputs_identical is True and d.said().startswith("step 7, micro-batch 0, `decoder.layers.0.mlp` forward, "
                                                               "TP rank 0 (DP 0, PP 0): inputs identical")
    assert difference(a[3], b[3], None).inputs_identical is False
    assert "only in the first" in structure_problem(a, a[:3])


def test_only_an_update_differing_is_the_optimizers():
    a = [rec(0, 0, "grad", "w", "g", mb=-1), rec(0, 1, "update", "w", "u", mb=-1)]
    b = [a[0], rec(0, 1, "update", "w", "v", mb=-1)]
    assert only_updates_differ(a, b) and not only_updates_differ(a, a)
    assert "after backward" in difference(a[1], b[1], None).where()
