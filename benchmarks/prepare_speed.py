"""Tokens/s of `mcx data prepare` against Megatron-LM's own tools/preprocess_data.py, same documents and tokenizer,
1 and 2 workers, and whether the two write the same bytes (issue 37, D61).

The corpus is real text: the Python standard library's .py files (sorted, one document each, cycled until
``--mib`` MiB), written as ``--shards`` JSON Lines shards for mcx and, concatenated, as the one JSONL file
preprocess_data.py reads (its ``--partitions 1``: with more it deals lines round-robin, which reorders them).
The tokenizer is a Hugging Face directory (tokenizer.json, tokenizer_config.json) holding the quickstart's
byte-level BPE (data/quickstart/tokenizer.json); Megatron-LM loads it with ``--tokenizer-type
HuggingFaceTokenizer`` (transformers' fast tokenizer), mcx with the tokenizers library. Each figure is the
wall time of the whole command (interpreter start, imports, reading, tokenizing, writing), best of
``--repeat``; the rate is the dataset's tokens over it.

Megatron-LM's source is not vendored: pass a checkout (``git clone https://github.com/NVIDIA/Megatron-LM``) at the
tag of this environment's megatron-core (``git checkout core_v0.19.0``: main's megatron.training needs a newer core)
as ``--megatron-lm``; its tools/preprocess_data.py runs with this environment's megatron-core and the checkout's
megatron.training (put on its PYTHONPATH here). A copy of the two folders without .git names its commit in a
``COMMIT`` file (how the GPU machine gets it: docs/gpu.md). ``--doc-chars 2000`` cuts the files into documents of
web-page length.

    .venv/bin/python benchmarks/prepare_speed.py --megatron-lm /tmp/Megatron-LM --mib 16 --workers 1 2
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pieces(text: str, chars: int) -> list[str]:
    """``text`` whole, or (``chars`` > 0) cut at blank lines into documents of about ``chars`` characters: the
    length of web pages rather than source files."""
    if chars <= 0:
        return [text]
    out, current = [], ""
    for block in text.split("\n\n"):
        current = f"{current}\n\n{block}" if current else block
        if len(current) >= chars:
            out.append(current)
            current = ""
    return out + ([current] if current.strip() else [])


def corpus(directory: Path, mib: float, shards: int, chars: int = 0) -> int:
    """The shards and their concatenation (``all.jsonl``); returns the number of documents."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    docs: list[str] = []
    size, budget = 0, int(mib * 2**20)
    while size < budget:
        for path in files:
            for text in pieces(path.read_text(encoding="utf-8", errors="replace"), chars):
                if text.strip():
                    docs.append(json.dumps({"text": text}) + "\n")
                    size += len(docs[-1])
            if size >= budget:
                break
    (directory / "shards").mkdir(parents=True, exist_ok=True)
    per = -(-len(docs) // shards)
    for k in range(shards):
        (directory / "shards" / f"part-{k:05d}.jsonl").write_text("".join(docs[k * per:(k + 1) * per]), encoding="utf-8")
    (directory / "all.jsonl").write_text("".join(docs), encoding="utf-8")
    return len(docs)


def hf_dir(directory: Path, source: Path) -> Path:
    out = directory / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    if not source.is_file():
        sys.exit(f"{source} is missing: build the quickstart dataset first (`.venv/bin/mcx data prepare`).")
    shutil.copyfile(source, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "eos_token": "<|endoftext|>"}))
    return out


def timed(cmd: list[str], repeat: int, cwd: Path, before=lambda: None, path: str | None = None) -> float:
    best = float("inf")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    for _ in range(repeat):
        before()
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        best = min(best, took)
    return best


def encode_rates(shard: Path, tokenizer: Path, repeat: int = 3) -> dict[str, dict[str, float]]:
    """Tokens/s of each way to tokenize one shard's documents in one process (the library choice, D61): the
    tokenizers library one document a call, its batch encoding with its threads off and on, and transformers'
    fast tokenizer one document a call (what preprocess_data.py's HuggingFaceTokenizer does). Per way, the best
    of ``repeat`` by wall time and by the process's CPU time: a worker of ``mcx data prepare`` is one thread,
    so CPU time is its cost, and it moves far less than wall time on a loaded machine."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    docs = [json.loads(line)["text"] for line in shard.read_text(encoding="utf-8").splitlines()]
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(str(tokenizer))
    n = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))

    def rate(fn) -> dict[str, float]:
        wall, cpu = float("inf"), float("inf")
        for _ in range(repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, time.process_time() - c0)
        return {"wall": round(n / wall), "cpu": round(n / cpu)}

    def batch(parallel: str):
        def run() -> None:
            os.environ["TOKENIZERS_PARALLELISM"] = parallel
            for i in range(0, len(docs), 256):
                tok.encode_batch(docs[i:i + 256], add_special_tokens=False)
        return run

    return {"documents": len(docs), "tokens": n,
            "tokenizers encode, one a call": rate(lambda: [tok.encode(d, add_special_tokens=False) for d in docs]),
            "tokenizers encode_batch(256), 1 thread": rate(batch("false")),
            "tokenizers encode_batch(256), threads": rate(batch("true")),
            "transformers fast tokenizer, one a call": rate(lambda: [hf(d).input_ids for d in docs])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron-lm", required=True, help="a Megatron-LM checkout (its tools/preprocess_data.py)")
    p.add_argument("--tokenizer-json", default=str(ROOT / "data" / "quickstart" / "tokenizer.json"))
    p.add_argument("--mib", type=float, default=16.0)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--doc-chars", type=int, default=0,
                   help="cut each file at blank lines into documents of about this many characters (0: whole files)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--dir", default="/tmp/prepare_speed")
    args = p.parse_args()
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    documents = corpus(work, args.mib, args.shards, args.doc_chars)
    tokenizer = hf_dir(work, Path(args.tokenizer_json))
    args.megatron_lm = str(Path(args.megatron_lm).resolve())  # the commands run in the work directory
    tool = Path(args.megatron_lm) / "tools" / "preprocess_data.py"
    named = Path(args.megatron_lm) / "COMMIT"  # a copy of the checkout's files, no .git (inside another repo's tree)
    commit = named.read_text().strip() if named.is_file() else subprocess.run(
        ["git", "-C", args.megatron_lm, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out: dict = {"documents": documents, "bytes": (work / "all.jsonl").stat().st_size, "shards": args.shards,
                 "doc_chars": args.doc_chars, "cpu": os.cpu_count(), "load_average_before": os.getloadavg(), "megatron_lm_commit": commit or None,
                 "results": {}}
    for w in args.workers:
        ours = work / f"mcx-{w}"
        mcx = [sys.executable, "-m", "mcx", "--project", str(work), "data", "prepare", str(work / "shards"),
               "--tokenizer", str(tokenizer), "--out", str(ours), "--workers", str(w), "--quiet"]
        mcx_s = timed(mcx, args.repeat, work, before=lambda: shutil.rmtree(ours, ignore_errors=True))
        tokens = json.loads((ours / "manifest.json").read_text())["dataset"]["tokens"]
        prefix = work / f"megatron-{w}"
        megatron = [sys.executable, str(tool), "--input", str(work / "all.jsonl"), "--output-prefix", str(prefix),
                    "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer), "--append-eod",
                    "--json-keys", "text", "--workers", str(w), "--log-interval", "100000"]
        megatron_s = timed(megatron, args.repeat, work, path=args.megatron_lm)
        same = all(filecmp.cmp(ours / f"corpus.{ext}", f"{prefix}_text_document.{ext}", shallow=False)
                   for ext in ("bin", "idx"))
        out["results"][f"workers={w}"] = {
            "tokens": tokens, "mcx_s": round(mcx_s, 2), "megatron_lm_s": round(megatron_s, 2),
            "mcx_tokens_per_s": round(tokens / mcx_s), "megatron_lm_tokens_per_s": round(tokens / megatron_s),
            "speedup": round(megatron_s / mcx_s, 2), "byte_identical": same}
        print(json.dumps({f"workers={w}": out["results"][f"workers={w}"]}), file=sys.stderr, flush=True)
    out["encode_tokens_per_s"] = encode_rates(work / "shards" / "part-00000.jsonl", tokenizer)
    out["load_average_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
