"""`mcx export-hf` streams: peak host memory of exporting a LLaMA-shaped model, against the model's size.

A canonical checkpoint of a LLaMA-shaped model (random weights, fp32) is written once as each source format
mcx exports from: a CPU run's ``state.pt`` and (``--dist``) a Megatron-Core distributed checkpoint written by
the tests' CPU fixture at TP 1. Then, each in a fresh process, the export that `mcx export-hf` runs
(``mcx.weights.sources.open_weights`` -> ``mcx.weights.hf_convert.write_hf``) writes it as bf16 safetensors shards
of ``--shard-mb``. A sampler thread reads the process's RssAnon (its own memory: a memory-mapped source's
pages are file-backed, reclaimable, and not the export's) and VmHWM (everything resident, mapped files
included) every 5 ms; the export's own memory is the peak RssAnon less what the process held before it began
(Python, torch). Baseline: the model's bytes, in the source's dtype and the export's.

    .venv/bin/python benchmarks/hf_export.py --layers 16 --hidden 2048 --ffn 5632 --shard-mb 500 --dir /tmp/hf_export
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def export_child(source: str, fmt: str, out: str, layers: int, heads: int, groups: int, hidden: int,
                 shard_mb: int, vocab: int) -> dict:
    """One export in this process, with its memory sampled."""
    import torch

    from mcx.weights.hf_convert import Shapes, write_hf
    from mcx.weights.sources import open_weights

    peak = {"anon": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak["anon"] = max(peak["anon"], _status_kib("RssAnon"))
            time.sleep(0.005)

    base = _status_kib("RssAnon")
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    weights = open_weights(Path(source), fmt)
    config = {"vocab_size": vocab, "architectures": ["LlamaForCausalLM"]}
    written = write_hf(weights, Shapes(layers, heads, groups, hidden // heads, None, False), Path(out), config,
                       torch.bfloat16, shard_mb * 10**6, {})
    seconds = time.perf_counter() - t0
    stop.set()
    thread.join()
    return {"format": fmt, "seconds": round(seconds, 2), "rss_anon_before_gib": base / 2**20,
            "peak_rss_anon_gib": peak["anon"] / 2**20, "export_anon_gib": (peak["anon"] - base) / 2**20,
            "vmhwm_gib": _status_kib("VmHWM") / 2**20, **written}


def make_state(path: Path, layers: int, heads: int, groups: int, hidden: int, ffn: int, vocab: int) -> int:
    """A canonical fp32 state.pt of the shape, written tensor by tensor into one dict (the source)."""
    import torch

    from mcx.weights.canonical import layer_key

    d = hidden // heads
    shapes = {"embedding.word_embeddings.weight": (vocab, hidden), "decoder.final_layernorm.weight": (hidden,),
              "output_layer.weight": (vocab, hidden)}
    for i in range(layers):
        shapes |= {layer_key(i, "input_layernorm.weight"): (hidden,),
                   layer_key(i, "self_attention.linear_qkv.weight"): ((heads + 2 * groups) * d, hidden),
                   layer_key(i, "self_attention.linear_proj.weight"): (hidden, heads * d),
                   layer_key(i, "pre_mlp_layernorm.weight"): (hidden,),
                   layer_key(i, "mlp.linear_fc1.weight"): (2 * ffn, hidden),
                   layer_key(i, "mlp.linear_fc2.weight"): (hidden, ffn)}
    gen = torch.Generator().manual_seed(0)
    model = {k: torch.randn(s, generator=gen) * 0.02 for k, s in shapes.items()}
    path.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model, "optimizer": {}, "scheduler": {}}, path / "state.pt")
    return sum(t.numel() for t in model.values())


def write_dist(work: Path, args: argparse.Namespace) -> None:
    """The same weights as a Megatron-Core distributed checkpoint saved by two gloo ranks at TP 2 (the tests'
    CPU fixture, tests/fixtures/dist_checkpoint.py: mcx's model for the layout, filled by fullstate.load_full)."""
    import torch

    canonical = work / "canonical.pt"
    torch.save(torch.load(work / "torch" / "state.pt", weights_only=True)["model"], canonical)
    shape = [f"model.num_layers={args.layers}", f"model.hidden_size={args.hidden}",
             f"model.num_attention_heads={args.heads}", f"model.num_query_groups={args.groups}",
             f"model.ffn_hidden_size={args.ffn}", f"model.vocab_size={args.vocab}"]
    plan = work / "plan.json"
    plan.write_text(json.dumps([{"out": str(work / "dist"), "spec": str(ROOT / "experiments" / "tiny.toml"),
                                 "set": shape, "vocab": args.vocab, "canonical": str(canonical),
                                 "layout": {"tp": 2}, "fill": "load_full"}]))
    subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "--master-port", "29577",
                    str(ROOT / "tests" / "fixtures" / "dist_checkpoint.py"), str(plan)], check=True, cwd=ROOT)
    canonical.unlink()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--ffn", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--shard-mb", type=int, default=500)
    p.add_argument("--dir", default="/tmp/hf_export")
    p.add_argument("--dist", action="store_true", help="also from a distributed checkpoint (TP 2)")
    p.add_argument("--out")
    p.add_argument("--child", nargs=3, metavar=("SOURCE", "FORMAT", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    shape = (args.layers, args.heads, args.groups, args.hidden)
    if args.child:
        print(json.dumps(export_child(*args.child, *shape, args.shard_mb, args.vocab)))
        return
    work = Path(args.dir)
    subprocess.run(["rm", "-rf", str(work)], check=True)
    params = make_state(work / "torch", args.layers, args.heads, args.groups, args.hidden, args.ffn, args.vocab)
    sources = [("torch", work / "torch")]
    if args.dist:
        write_dist(work, args)
        sources.append(("dist", work / "dist"))
    results = []
    for fmt, source in sources:
        proc = subprocess.run([sys.executable, __file__, "--child", str(source), fmt, str(work / f"hf-{fmt}"),
                               *sum(([f"--{k}", str(v)] for k, v in (("layers", args.layers), ("heads", args.heads),
                                     ("groups", args.groups), ("hidden", args.hidden), ("shard-mb", args.shard_mb),
                                     ("vocab", args.vocab))),
                                    [])], capture_output=True, text=True, check=True, cwd=ROOT)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    identical = None
    if len(results) > 1:  # every source exported to the same bytes, tensor by tensor
        from safetensors import safe_open

        def tensors(d: Path):
            for f in sorted(d.glob("*.safetensors")):
                with safe_open(str(f), "pt") as h:
                    for k in h.keys():
                        yield k, h.get_tensor(k)

        import torch

        theirs = dict(tensors(work / f"hf-{sources[1][0]}"))
        identical = all(torch.equal(v, theirs.pop(k)) for k, v in tensors(work / f"hf-{sources[0][0]}")) and not theirs
    out = {"params": params, "sources_export_identical": identical, "model_fp32_gib": params * 4 / 2**30, "model_bf16_gib": params * 2 / 2**30,
           "shard_mb": args.shard_mb, "cpu": os.cpu_count(), "results": results}
    for r in results:
        r["export_anon_over_model_bf16"] = round(r["export_anon_gib"] / out["model_bf16_gib"], 3)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
