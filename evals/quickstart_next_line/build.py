"""Rebuild the quickstart's evaluation task, ``mcx_quickstart_next_line`` (README "Evaluation", D68).

A multiple-choice cloze task over source code the quickstart run never trains on: the documents of the
bundled corpus (the megatron-core wheel's Python files, ``mcx.data.corpus.megatron_core_corpus``) that
``experiments/tiny.toml``'s ``data.split = "969,30,1"`` puts in its validation and test splits. Each item is
a few lines of a held-out file and four candidate next lines: the true one and three other lines of the
same file, in a seeded random order. The model picks the line it finds likeliest (lm-eval's ``acc``; ``acc_norm``
divides by the line's length). Every choice is drawn from the file itself, so chance is 25% and a model
scores above it only by having learnt how Python code goes on.

Run from the project root with the locked environment (``./dev`` installs megatron-core 0.19.2):

    .venv/bin/python evals/quickstart_next_line/build.py

It writes ``test.jsonl`` beside itself; the same wheel always gives the same bytes.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from mcx.data.corpus import megatron_core_corpus
from mcx.data.dataset import split_ranges

SPLIT = "969,30,1"  # experiments/tiny.toml's data.split: the documents after the train split are held out
CONTEXT_LINES = 4  # non-blank lines before the one to predict
MIN_CHARS, MAX_CHARS = 16, 72  # a line to predict: long enough to say something, short enough for 128 tokens
MAX_CONTEXT_CHARS = 240
CHOICES = 4
EVERY = 7  # one item per this many eligible lines, spread over each file
SEED = 39
OUT = Path(__file__).resolve().parent / "test.jsonl"


def _eligible(line: str) -> bool:
    text = line.strip()
    return MIN_CHARS <= len(line) <= MAX_CHARS and not text.startswith("#") and text not in ('"""', "'''")


def items(documents: list[str]) -> list[dict[str, object]]:
    """The task's items, in corpus order: context, four choices, the true one's index, the source file."""
    rng = random.Random(SEED)
    out: list[dict[str, object]] = []
    for doc in documents:
        header, _, body = doc.partition("\n")
        lines = [line.rstrip() for line in body.split("\n")]
        candidates = sorted({line for line in lines if _eligible(line)})
        seen = 0
        for i, line in enumerate(lines):
            before = [x for x in lines[:i] if x.strip()][-CONTEXT_LINES:]
            if not _eligible(line) or len(before) < CONTEXT_LINES:
                continue
            seen += 1
            if seen % EVERY:
                continue
            context = "\n".join(before) + "\n"
            others = [c for c in candidates if c != line]
            if len(context) > MAX_CONTEXT_CHARS or len(others) < CHOICES - 1:
                continue
            choices = rng.sample(others, CHOICES - 1)
            answer = rng.randrange(CHOICES)
            choices.insert(answer, line)
            out.append({"context": context, "choices": choices, "answer": answer, "source": header[2:]})
    return out


def main() -> int:
    corpus = megatron_core_corpus()
    documents = list(corpus.documents())
    _train, valid, test = split_ranges(SPLIT, len(documents))
    held = [documents[i] for bounds in (valid, test) if bounds for i in range(*bounds)]
    rows = items(held)
    OUT.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows), encoding="utf-8")
    print(f"{OUT}: {len(rows)} items from {len(held)} held-out files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
