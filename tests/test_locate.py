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


def test_tensor_parallel_shards_gather_into_canonical_tensors(tmp_path):
    """Across layouts (D74), mcx.ops.gathered on a TP 2 trace as the worker writes one (records + kept tensors):
    outputs per sample keyed by token ids, logits joined along the vocabulary, parameters joined along their
    `tp_dim`, SwiGLU's fc1 halves rejoined as [gate; up] (the CPU backend has no TP to produce this for real)."""
    import torch

    from mcx.contract.trace import TRACE_DIR, tensors_file
    from mcx.ops.gathered import gather

    g = torch.Generator().manual_seed(0)
    fc1, proj, norm = (torch.randn(8, 3, generator=g), torch.randn(3, 4, generator=g), torch.randn(3, generator=g))
    logits, hidden = torch.randn(5, 2, 6, generator=g), torch.randn(5, 2, 3, generator=g)  # [s, b, ...]
    tokens = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    gate, up = fc1[:4], fc1[4:]
    records, index = [], {0: 0, 1: 0}
    for tp in (0, 1):
        shards = {"decoder.layers.0.mlp.linear_fc1.weight": (torch.cat([gate[2 * tp:2 * tp + 2], up[2 * tp:2 * tp + 2]]), 0),
                  "decoder.layers.0.self_attention.linear_proj.weight": (proj[:, 2 * tp:2 * tp + 2], 1),
                  "decoder.layers.0.input_layernorm.weight": (norm, None)}
        kept = {}

        def add(phase, module, tensor, layer=None, **extra):
            r = rec(tp, index[tp], phase, module, "x", mb=-1 if phase == "update" else 0, layer=layer, **extra)
            index[tp] += 1
            kept[r["key"]] = tensor
            records.append(r)

        add("batch", "input", tokens)
        add("forward", "decoder.layers.0", hidden, layer=1)
        add("forward", "output_layer", logits[..., 3 * tp:3 * tp + 3])
        for name, (shard, dim) in shards.items():
            add("update", name, shard, layer=1, tp_dim=dim)
        (tmp_path / TRACE_DIR).mkdir(exist_ok=True)
        torch.save(kept, tmp_path / TRACE_DIR / tensors_file(tp))
    got = gather(tmp_path, records, sequence_parallel=False, swiglu=True)
    assert torch.equal(got.parameters["decoder.layers.0.mlp.linear_fc1.weight"], fc1)
    assert torch.equal(got.parameters["decoder.layers.0.self_attention.linear_proj.weight"], proj)
    assert torch.equal(got.parameters["decoder.layers.0.input_layernorm.weight"], norm)
    assert got.order == ("decoder.layers.0", "output_layer")
    for i in (0, 1):
        key = tokens[i].numpy().tobytes()
        assert torch.equal(got.outputs["output_layer"][key][0], logits[:, i])
        assert torch.equal(got.outputs["decoder.layers.0"][key][0], hidden[:, i])
