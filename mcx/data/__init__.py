"""Datasets: corpora, tokenizers, and `mcx data prepare` (Megatron-Core indexed datasets).

Importing this package is cheap: torch, megatron and the tokenizer libraries load inside the
functions that need them.

Modules: ``corpus.py`` (megatron-core sources verified against RECORD, text, JSONL); ``tokenizer.py`` (BPE
trained on the corpus, HF tokenizer.json, SentencePiece, GPT-2); ``vocab.py`` (a tokenizer's vocabulary
size read from the dataset manifest or the tokenizer file, for the planner, without a tokenizer library);
``shards.py`` (record shards: JSONL, .jsonl.gz, Parquet, found by file, directory or glob, read streaming);
``shard_work.py`` (shards tokenized by worker processes into partials, the record of finished ones for resuming,
merged in order; its progress event); ``prepare.py`` (deterministic, atomic .bin/.idx + manifest); ``dataset.py``
(checks, split arithmetic without torch); ``mixture.py`` (a mixture's components on disk: tokens, the smoke
stage's share, D60); ``dvc_hash.py`` (DVC's directory md5). Side effects: files.
"""

from mcx.data.corpus import Corpus, jsonl_corpus, megatron_core_corpus, text_corpus
from mcx.data.dataset import check_dataset, read_manifest
from mcx.data.dvc_hash import DirHash, DvcCheck, directory_md5, verify_against_dvc
from mcx.data.prepare import QuickstartRecipe, prepare, prepare_quickstart, prepare_shards, quickstart_recipe
from mcx.data.shards import Shard, find_shards

__all__ = [
    "Corpus",
    "DirHash",
    "DvcCheck",
    "QuickstartRecipe",
    "check_dataset",
    "directory_md5",
    "jsonl_corpus",
    "megatron_core_corpus",
    "prepare",
    "prepare_quickstart",
    "prepare_shards",
    "quickstart_recipe",
    "read_manifest",
    "Shard",
    "find_shards",
    "text_corpus",
    "verify_against_dvc",
]
