"""The planner's check of a Hugging Face directory (`mcx.weights.hftensors.check_tensors`: config.json and
the safetensors headers, no tensor read), timed on LLaMA 3 8B, 70B and 405B shaped directories as the Hub
shards them. Each shard is a sparse file: its real header, then a hole as long as the tensors' bytes, so a
405B directory costs a megabyte of disk and the check sees the sizes a download has. Baseline: what the
worker did before (each shard opened with safetensors' ``safe_open`` and every tensor's shape read).

    .venv/bin/python benchmarks/hf_check.py --dir /tmp/hf_check
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# name: (layers, hidden, ffn, heads, kv heads, vocab, shards on the Hub)
MODELS = {"llama3-8b": (32, 4096, 14336, 32, 8, 128256, 4), "llama3-70b": (80, 8192, 28672, 64, 8, 128256, 30),
          "llama3-405b": (126, 16384, 53248, 128, 8, 128256, 191)}


def make(d: Path, layers: int, hidden: int, ffn: int, heads: int, kv: int, vocab: int, shards: int) -> int:
    """A sharded bf16 LLaMA directory at ``d`` (config.json, index, sparse shards); its tensors' bytes."""
    d.mkdir(parents=True, exist_ok=True)
    hd = hidden // heads
    names = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        names += [(p + "input_layernorm.weight", (hidden,)), (p + "self_attn.q_proj.weight", (heads * hd, hidden)),
                  (p + "self_attn.k_proj.weight", (kv * hd, hidden)),
                  (p + "self_attn.v_proj.weight", (kv * hd, hidden)),
                  (p + "self_attn.o_proj.weight", (hidden, heads * hd)),
                  (p + "post_attention_layernorm.weight", (hidden,)), (p + "mlp.gate_proj.weight", (ffn, hidden)),
                  (p + "mlp.up_proj.weight", (ffn, hidden)), (p + "mlp.down_proj.weight", (hidden, ffn))]
    names += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header, offset = {}, 0
        for name, shape in names[s * per:(s + 1) * per]:
            size = 2
            for x in shape:
                size *= x
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[name] = file
        raw = json.dumps(header).encode()
        with open(d / file, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)
        total += offset
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                 "weight_map": weight_map}))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "intermediate_size": ffn,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
        "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}))
    return total


def timed(fn, repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"best_ms": round(times[0] * 1000, 1), "median_ms": round(times[len(times) // 2] * 1000, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="where to build the directories (sparse files)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    from safetensors import safe_open

    from mcx.weights.hfconfig import read_config
    from mcx.weights.hftensors import check_tensors

    def safetensors_shapes(d: Path) -> None:
        for shard in sorted(d.glob("*.safetensors")):
            with safe_open(str(shard), "pt", device="cpu") as f:
                for name in f.keys():
                    f.get_slice(name).get_shape()

    results = {}
    for name, shape in MODELS.items():
        d = Path(args.dir) / name
        total = make(d, *shape)
        results[name] = {"shards": shape[-1], "tensor_bytes": total,
                         "check": timed(lambda: check_tensors(d, read_config(d)), args.repeats),
                         "baseline_safe_open": timed(lambda: safetensors_shapes(d), args.repeats)}
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
