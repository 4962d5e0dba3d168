"""The data pipeline against the real components: tokenizers, SentencePiece, Megatron-Core's indexed
datasets and GPTDataset builder, DVC, and torch.distributed (gloo)."""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from mcx.data import (
    check_dataset,
    directory_md5,
    jsonl_corpus,
    megatron_core_corpus,
    prepare,
    prepare_quickstart,
    quickstart_recipe,
    text_corpus,
    verify_against_dvc,
)
from mcx.data.corpus import Corpus
from mcx.data.dataset import smoke_samples_limit, split_ranges, split_samples
from mcx.data.dvc_hash import read_dvc_file
from mcx.data.prepare import TMP_PREFIX
from mcx.data.tokenizer import EOD_TOKEN, load_saved, load_tokenizer, train_bpe
from mcx.errors import DataError
from mcx.spec.schema import TokenizerSpec

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:megatron")  # optional CUDA packages missing on CPU

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
ENV = {**os.environ, "DVC_NO_ANALYTICS": "1", "PYTHONWARNINGS": "ignore"}


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart dataset, built twice: in another process (one Rayon thread, another hash
    seed) and here, at the same time. Returns this process's project root."""
    other, here = tmp_path_factory.mktemp("other"), tmp_path_factory.mktemp("here")
    code = f"from pathlib import Path; from mcx.data import prepare_quickstart; prepare_quickstart(Path({str(other)!r}))"
    env = {**ENV, "RAYON_NUM_THREADS": "1", "PYTHONHASHSEED": "12345"}
    proc = subprocess.Popen([PYTHON, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    prepare_quickstart(here)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    first, second = tree_bytes(other / "data"), tree_bytes(here / "data")
    assert sorted(first) == ["quickstart/corpus.bin", "quickstart/corpus.idx", "quickstart/manifest.json", "quickstart/tokenizer.json"]
    for name in first:
        assert first[name] == second[name], f"{name} differs between two builds"
    return here


# --- the quickstart dataset and DVC ---------------------------------------------------------------


def test_quickstart_is_bit_identical_and_matches_data_dvc(quickstart: Path) -> None:
    _, recorded = read_dvc_file(ROOT / "data.dvc")
    assert directory_md5(quickstart / "data") == recorded
    manifest = check_dataset(quickstart / "data/quickstart", contents=True)
    recipe = quickstart_recipe()
    assert manifest["prefix"] == recipe.prefix == "corpus"
    assert manifest["source"]["package"] == "megatron-core" and manifest["source"]["version"] == "0.19.2"
    assert manifest["tokenizer"]["kind"] == "bpe" and manifest["tokenizer"]["vocab_size"] == 4096
    assert manifest["dataset"]["dtype"] == "uint16"
    assert manifest["dataset"]["documents"] == manifest["source"]["documents"] > 500


def test_directory_md5_is_what_dvc_add_records(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "b" / "c").mkdir(parents=True)
    (data / "a.txt").write_text("x\r\ny\n")  # CRLF: DVC 3 hashes raw bytes, no dos2unix
    (data / "b" / "c" / "z.bin").write_bytes(bytes(range(256)) * 9)
    (data / "b" / "empty").mkdir()
    (data / f"{TMP_PREFIX}quickstart-x").mkdir()  # a killed prepare's leftovers: .dvcignore hides them
    (data / f"{TMP_PREFIX}quickstart-x" / "corpus.bin").write_bytes(b"partial")
    subprocess.run([ROOT / ".venv/bin/dvc", "init", "--no-scm", "-q"], cwd=tmp_path, env=ENV, check=True)
    shutil.copy(ROOT / ".dvcignore", tmp_path / ".dvcignore")
    subprocess.run([ROOT / ".venv/bin/dvc", "add", "-q", "data"], cwd=tmp_path, env=ENV, check=True)
    _, recorded = read_dvc_file(tmp_path / "data.dvc")
    assert directory_md5(data) == recorded
    assert recorded.nfiles == 2


def test_verify_against_dvc_detects_changes(quickstart: Path, tmp_path: Path) -> None:
    shutil.copy(ROOT / "data.dvc", tmp_path / "data.dvc")
    shutil.copytree(quickstart / "data", tmp_path / "data")
    assert verify_against_dvc(tmp_path).matches
    with open(tmp_path / "data/quickstart/corpus.bin", "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))
    assert not verify_against_dvc(tmp_path).matches
    shutil.rmtree(tmp_path / "data")
    with pytest.raises(DataError, match="does not exist"):
        verify_against_dvc(tmp_path)


# --- prepare: refuse, keep, replace, never half-written ---------------------------------------


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real text: 12 Megatron-Core source files as .txt files."""
    root = tmp_path_factory.mktemp("texts")
    for i, doc in enumerate(itertools.islice(megatron_core_corpus().documents(), 40, 52)):
        (root / f"doc{i:02d}.txt").write_text(doc, encoding="utf-8")
    return root


def test_prepare_keeps_identical_refuses_different_replaces_with_force(texts: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    spec = TokenizerSpec(kind="bpe", vocab_size=400)
    first = prepare(text_corpus([texts]), spec, out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert prepare(text_corpus([texts]), spec, out) == first
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes  # kept, not rebuilt
    other = TokenizerSpec(kind="bpe", vocab_size=500)
    with pytest.raises(DataError, match="already holds a different dataset") as err:
        prepare(text_corpus([texts]), other, out)
    assert "force" in str(err.value)
    assert prepare(text_corpus([texts]), other, out, force=True)["tokenizer"]["vocab_size"] == 500
    assert check_dataset(out, contents=True)["tokenizer"]["vocab_size"] == 500
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_interrupted_prepare_leaves_nothing(texts: Path, tmp_path: Path) -> None:
    files = tuple(sorted(texts.iterdir()))
    reads = itertools.count()

    def read(path: Path):
        # Pass 1 hashes, pass 2 trains the BPE, pass 3 writes the .bin: stop in the middle of it.
        if next(reads) == 2 * len(files) + len(files) // 2:
            raise KeyboardInterrupt
        yield path.read_text(encoding="utf-8")

    corpus = Corpus(description={"kind": "text"}, files=files, reader=read)
    with pytest.raises(KeyboardInterrupt):
        prepare(corpus, TokenizerSpec(kind="bpe", vocab_size=400), tmp_path / "ds")
    assert list(tmp_path.iterdir()) == []


def test_bpe_spec_with_files_is_refused(texts: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data.tokenizer.path"):
        prepare(text_corpus([texts]), TokenizerSpec(kind="bpe", path="tokenizer.json"), tmp_path / "ds")


# --- corpora ------------------------------------------------------------------------------------


def test_malformed_jsonl_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two"}\n{"text": "three",\n')
    with pytest.raises(DataError) as err:
        list(jsonl_corpus([path]).documents())
    assert f"{path}:4: malformed JSON" in err.value.message and err.value.hint
    path.write_text('{"text": "one", "body": ""}\n{"body": "two"}\n')
    with pytest.raises(DataError, match=f'{path}:2: no "text" field'):
        list(jsonl_corpus([path]).documents())
    assert list(jsonl_corpus([path], text_key="body").documents()) == ["two"]  # empty texts are skipped
    path.write_text('["text"]\n')
    with pytest.raises(DataError, match=f"{path}:1: expected a JSON object"):
        prepare(jsonl_corpus([path]), TokenizerSpec(vocab_size=300), tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_text_corpus_units_and_encoding(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("first para\nline two\n\n  \n\nsecond para\n")
    (tmp_path / "b.txt").write_text("")
    assert list(text_corpus([tmp_path]).documents()) == ["first para\nline two\n\n  \n\nsecond para\n"]
    assert list(text_corpus([tmp_path], unit="paragraph").documents()) == ["first para\nline two", "second para"]
    (tmp_path / "c.txt").write_bytes(b"ok\n\xff\xfe")
    with pytest.raises(DataError, match=r"c.txt:2: not UTF-8"):
        list(text_corpus([tmp_path / "c.txt"]).documents())
    with pytest.raises(DataError, match="does not exist"):
        text_corpus([tmp_path / "nope.txt"])


def test_megatron_core_corpus_is_checked_against_record() -> None:
    corpus = megatron_core_corpus()
    assert len(corpus.files) > 500 and list(corpus.files) == sorted(corpus.files)
    first = next(corpus.documents())
    assert first.startswith("# megatron/core/")
    with pytest.raises(DataError, match="reinstall megatron-core==0.0.1"):
        megatron_core_corpus("0.0.1")


# --- tokenizers ---------------------------------------------------------------------------------


def _tokenizer_files(kind: str, texts: Path, tmp: Path) -> TokenizerSpec:
    """Real tokenizer files of each kind, trained here on the test texts."""
    docs = [p.read_text(encoding="utf-8") for p in sorted(texts.iterdir())]
    if kind == "huggingface":
        (tmp / "hf").mkdir()
        train_bpe(docs, 500).save(tmp / "hf")
        return TokenizerSpec(kind="huggingface", path="hf/tokenizer.json")
    if kind == "sentencepiece":
        import sentencepiece

        (tmp / "corpus.txt").write_text("\n".join(docs), encoding="utf-8")
        sentencepiece.SentencePieceTrainer.train(
            input=str(tmp / "corpus.txt"), model_prefix=str(tmp / "sp"), vocab_size=400, model_type="bpe",
            byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,  # as Llama 2's
            num_threads=1, minloglevel=2,
        )
        return TokenizerSpec(kind="sentencepiece", path="sp.model")
    from tokenizers.implementations import ByteLevelBPETokenizer

    gpt2 = ByteLevelBPETokenizer()
    gpt2.train_from_iterator(docs, vocab_size=500, special_tokens=[EOD_TOKEN], show_progress=False)
    (tmp / "gpt2").mkdir()
    gpt2.save_model(str(tmp / "gpt2"))
    return TokenizerSpec(kind="gpt2", path="gpt2/vocab.json", merges="gpt2/merges.txt")


@pytest.mark.parametrize("kind", ["huggingface", "sentencepiece", "gpt2"])
def test_tokenizer_kinds_load_prepare_and_reload(kind: str, texts: Path, tmp_path: Path) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    spec = _tokenizer_files(kind, texts, tmp_path)
    tok = load_tokenizer(spec, tmp_path)
    sample = "def f(x):\n    return x + 1  # héllo"
    assert tok.decode(tok.encode(sample)) == sample
    assert 0 <= tok.eod < tok.vocab_size and tok.kind == kind

    manifest = prepare(text_corpus([texts], unit="paragraph"), spec, tmp_path / "ds", base_dir=tmp_path)
    assert manifest["tokenizer"] == {**manifest["tokenizer"], "kind": kind, "eod": tok.eod, "vocab_size": tok.vocab_size}
    saved = load_saved(tmp_path / "ds", kind)
    assert saved.identity() == tok.identity()
    indexed = IndexedDataset(str(tmp_path / "ds" / "corpus"))
    docs = list(text_corpus([texts], unit="paragraph").documents())
    assert len(indexed) == len(docs) == manifest["dataset"]["documents"]
    for i in (0, len(docs) // 2, len(docs) - 1):
        assert indexed[i].tolist() == tok.encode(docs[i]) + [tok.eod]


def test_bad_tokenizer_files_are_data_errors(texts: Path, tmp_path: Path) -> None:
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(DataError, match="is not a tokenizer.json"):
        load_tokenizer(TokenizerSpec(kind="huggingface", path="junk.json"), tmp_path)
    with pytest.raises(DataError, match="is not a SentencePiece model"):
        load_tokenizer(TokenizerSpec(kind="sentencepiece", path="junk.json"), tmp_path)
    with pytest.raises(DataError, match="data.tokenizer.merges"):
        load_tokenizer(TokenizerSpec(kind="gpt2", path="junk.json"), tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer(TokenizerSpec(kind="huggingface", path="missing.json"), tmp_path)
    # A tokenizer.json without any end-of-document token.
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    plain = Tokenizer(models.BPE())
    plain.pre_tokenizer = pre_tokenizers.ByteLevel()
    plain.train_from_iterator(["abc abd"], trainers.BpeTrainer(vocab_size=300, show_progress=False))
    plain.save(str(tmp_path / "noeod.json"))
    with pytest.raises(DataError, match="no end-of-document token"):
        load_tokenizer(TokenizerSpec(kind="huggingface", path="noeod.json"), tmp_path)


# --- loading: corrupt files are DataErrors --------------------------------------------------------


def _copy_dataset(quickstart: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(quickstart / "data/quickstart", tmp_path / "ds"))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: _truncate(d / "corpus.bin", 2), "corpus.bin has .* bytes.*truncated"),
        (lambda d: _truncate(d / "corpus.idx", 8), "corpus.idx is corrupt:.*truncated"),
        (lambda d: _truncate(d / "corpus.idx", 10_000), "corpus.idx is corrupt:.*truncated"),
        (lambda d: _patch(d / "corpus.idx", 0, b"XX"), "corpus.idx is corrupt: not a Megatron-Core index"),
        (lambda d: _patch(d / "corpus.idx", 40, b"\xff\xff"), "corpus.idx is corrupt"),
        (lambda d: (d / "corpus.bin").unlink(), "corpus.bin is missing"),
        (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json is missing"),
        (lambda d: (d / "manifest.json").write_text("{"), "manifest.json:1: malformed JSON"),
        (lambda d: (d / "manifest.json").write_text('{"format": 1, "prefix": "corpus"}'), "lacks fields"),
    ],
)
def test_damaged_dataset_is_a_data_error_when_loading(quickstart: Path, tmp_path: Path, damage, message: str) -> None:
    from mcx.train.datasets import build_datasets

    ds = _copy_dataset(quickstart, tmp_path)
    damage(ds)
    with pytest.raises(DataError, match=message):
        build_datasets(ds, prefix="corpus", split="969,30,1", seq_length=64, seed=1, samples=(8, 8, 8), cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_flipped_byte_is_caught_by_content_check(quickstart: Path, tmp_path: Path) -> None:
    ds = _copy_dataset(quickstart, tmp_path)
    _patch(ds / "corpus.bin", 4096, b"\x07\x00")
    check_dataset(ds)  # structure is intact
    with pytest.raises(DataError, match="corpus.bin differs from the sha256"):
        check_dataset(ds, contents=True)
    with pytest.raises(DataError, match="data.prefix = 'other'"):
        check_dataset(ds, "other")


def _truncate(path: Path, n: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - n)


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# --- Megatron-Core datasets and the batch iterator ----------------------------------------------


def test_split_arithmetic_matches_megatron_core(quickstart: Path, tmp_path: Path) -> None:
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    from mcx.train.datasets import build_datasets

    for split in ("969,30,1", "98,2,0", "1,1,1", "0.7, 0.2, 0.1", "100", "3,0,1"):
        for n in (1, 3, 542, 1001):
            matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
            expected = [None if m is None else (int(round(m[0] * float(n))), int(round(m[1] * float(n)))) for m in matrix]
            assert split_ranges(split, n) == expected, (split, n)
    data = quickstart / "data/quickstart"
    built = build_datasets(data, prefix="corpus", split="969,30,1", seq_length=128, seed=7, samples=(1, 1, 1), cache_dir=tmp_path)
    assert split_samples(data, "969,30,1", 128) == (len(built.train), len(built.valid), len(built.test))
    assert smoke_samples_limit(data, "969,30,1", 128, 0.05) == -(-len(built.train) * 5 // 100)


def test_empty_split_is_a_data_error(texts: Path, tmp_path: Path) -> None:
    from mcx.train.datasets import build_datasets

    prepare(text_corpus([texts]), TokenizerSpec(vocab_size=300), tmp_path / "ds")  # 12 documents
    with pytest.raises(DataError, match="gives the valid split none of the 12 documents"):
        build_datasets(tmp_path / "ds", prefix="corpus", split="98,1,1", seq_length=32, seed=1, samples=(4, 4, 4), cache_dir=tmp_path / "c")


def test_sampler_order_is_megatrons() -> None:
    from megatron.training.datasets.data_samplers import MegatronPretrainingSampler

    from mcx.train.datasets import sample_indices

    for total, consumed, mbs, dp in [(100, 0, 4, 1), (100, 24, 2, 2), (97, 8, 3, 4), (64, 63, 1, 1)]:
        for rank in range(dp):
            ours = [list(r) for r in sample_indices(consumed, total, mbs, rank, dp)]
            theirs = list(MegatronPretrainingSampler(total, consumed, mbs, rank, dp))
            assert ours == theirs


def test_batches_resume_exactly_and_split_across_dp_ranks(quickstart: Path, tmp_path: Path) -> None:
    import torch

    from mcx.train.datasets import build_datasets, iterate_batches, num_samples

    data = quickstart / "data/quickstart"
    before = directory_md5(quickstart / "data")
    gbs, mbs, iters = 8, 2, 6
    samples = num_samples(iters, gbs, eval_interval=3, eval_iters=2)
    assert samples == (48, 48, 16)
    ds = build_datasets(data, prefix="corpus", split="969,30,1", seq_length=64, seed=1234, samples=samples, cache_dir=tmp_path / "c1")
    assert directory_md5(quickstart / "data") == before  # the cache stays out of the DVC-tracked data
    assert sorted({p.name.split("-", 1)[1] for p in (tmp_path / "c1").iterdir()}) == sorted(
        f"GPTDataset-{s}-{k}" for s in ("train", "valid", "test") for k in ("description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy")
    )

    full = list(iterate_batches(ds.train, 0, mbs, 0, 1, total_samples=samples[0]))
    assert len(full) == iters * gbs // mbs
    b = full[0]
    assert b["attention_mask"] is None and b["tokens"].shape == (mbs, 64) and b["tokens"].dtype == torch.int64
    assert torch.equal(b["tokens"][:, 1:], b["labels"][:, :-1])
    assert torch.equal(b["position_ids"][0], torch.arange(64)) and b["loss_mask"].dtype == torch.float32

    # Resume after 2 iterations: exactly the remaining micro-batches.
    resumed = list(iterate_batches(ds.train, 2 * gbs, mbs, 0, 1, total_samples=samples[0]))
    assert len(resumed) == len(full) - 2 * gbs // mbs
    for a, r in zip(full[2 * gbs // mbs :], resumed, strict=True):
        assert all(torch.equal(a[k], r[k]) for k in ("tokens", "labels", "loss_mask", "position_ids"))

    # Two data-parallel ranks: each step's two halves are the single rank's 2*mbs samples, no overlap.
    wide = list(iterate_batches(ds.train, 0, 2 * mbs, 0, 1, total_samples=samples[0]))
    rank0 = list(iterate_batches(ds.train, 0, mbs, 0, 2, total_samples=samples[0]))
    rank1 = list(iterate_batches(ds.train, 0, mbs, 1, 2, total_samples=samples[0]))
    assert len(rank0) == len(rank1) == len(wide)
    for w, r0, r1 in zip(wide, rank0, rank1, strict=True):
        assert torch.equal(torch.cat([r0["tokens"], r1["tokens"]]), w["tokens"])

    # A second build hits the cache and a build elsewhere writes identical cache files.
    again = build_datasets(data, prefix="corpus", split="969,30,1", seq_length=64, seed=1234, samples=samples, cache_dir=tmp_path / "c1")
    fresh = build_datasets(data, prefix="corpus", split="969,30,1", seq_length=64, seed=1234, samples=samples, cache_dir=tmp_path / "c2")
    assert tree_bytes(tmp_path / "c1") == tree_bytes(tmp_path / "c2")
    for other in (again, fresh):
        assert all(torch.equal(other.train[i]["tokens"], ds.train[i]["tokens"]) for i in range(0, 48, 7))


def test_smoke_subset_repeats_distinct_samples(quickstart: Path, tmp_path: Path) -> None:
    import torch

    from mcx.train.datasets import build_datasets, iterate_batches

    data = quickstart / "data/quickstart"
    ds = build_datasets(data, prefix="corpus", split="969,30,1", seq_length=64, seed=1, samples=(40, 8, 8), cache_dir=tmp_path, train_samples_limit=10)
    assert len(ds.train) == 40
    tokens = torch.cat([b["tokens"] for b in iterate_batches(ds.train, 0, 5, 0, 1)])
    assert torch.equal(tokens[:10], tokens[10:20]) and torch.equal(tokens[:10], tokens[30:40])
    assert len({tuple(t.tolist()) for t in tokens[:10]}) == 10


def _gloo_rank(rank: int, tmp: Path, data: Path) -> None:
    """One data-parallel rank (a forked process: megatron is already imported)."""
    try:
        import torch
        import torch.distributed as dist

        from mcx.train.datasets import build_datasets, iterate_batches

        dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2)
        ds = build_datasets(data, prefix="corpus", split="969,30,1", seq_length=64, seed=1234, samples=(48, 48, 16), cache_dir=tmp / "cache")
        batches = list(iterate_batches(ds.train, 8, 2, rank, 2, total_samples=ds.samples[0]))
        torch.save(torch.stack([b["tokens"] for b in batches]), tmp / f"rank{rank}.pt")
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def test_gloo_ranks_build_once_and_split_the_global_batch(quickstart: Path, tmp_path: Path) -> None:
    import torch

    from mcx.train.datasets import build_datasets, iterate_batches

    data = quickstart / "data/quickstart"
    assert not torch.distributed.is_initialized()
    fork = multiprocessing.get_context("fork")
    ranks = [fork.Process(target=_gloo_rank, args=(r, tmp_path, data)) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=120)
    assert [p.exitcode for p in ranks] == [0, 0]
    ref = build_datasets(data, prefix="corpus", split="969,30,1", seq_length=64, seed=1234, samples=(48, 48, 16), cache_dir=tmp_path / "ref")
    wide = torch.stack([b["tokens"] for b in iterate_batches(ref.train, 8, 4, 0, 1, total_samples=48)])
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert r0.shape == r1.shape == (10, 2, 64)
    assert torch.equal(torch.cat([r0, r1], dim=1), wide)
    assert tree_bytes(tmp_path / "cache") == tree_bytes(tmp_path / "ref")


def test_manifest_is_canonical_json(quickstart: Path) -> None:
    path = quickstart / "data/quickstart/manifest.json"
    text = path.read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    manifest = json.loads(text)
    for name, sha in {**manifest["dataset"]["files"], **manifest["tokenizer"]["files"]}.items():
        assert hashlib.sha256((path.parent / name).read_bytes()).hexdigest() == sha


# --- mcx data prepare beside a DVC-tracked data/ (the README's example) ----------------------------------


def _readme_commands() -> list[str]:
    """The README tour's `mcx data prepare` line and the `dvc add` line after it, as written."""
    import re

    readme = (ROOT / "README.md").read_text()
    found = re.search(r"^(mcx data prepare [^#\n]*?)\s+#.*\n(dvc add [^#\n]*?)\s+#", readme, re.M)
    assert found, "the README's data prepare example is gone"
    return [found.group(1), found.group(2)]


@pytest.mark.slow
def test_the_readme_example_prepares_beside_data_and_the_quickstart_still_plans(tmp_path: Path) -> None:
    import shlex

    from conftest import make_e2e_project, mcx_subprocess

    project = make_e2e_project(tmp_path / "project")
    with open(project / "corpus.jsonl", "w", encoding="utf-8") as f:
        for doc in itertools.islice(megatron_core_corpus().documents(), 40, 60):
            f.write(json.dumps({"text": doc}) + "\n")

    def dvc(*args: str) -> None:
        subprocess.run([PYTHON, "-m", "dvc", *args], cwd=project, env=ENV, check=True, capture_output=True)

    prepare_line, add_line = _readme_commands()
    res = mcx_subprocess(project, *shlex.split(prepare_line)[1:])
    assert res.code == 0, res
    assert f"`{add_line}`" in res.out  # the command prints what the README says to run next
    dvc(*shlex.split(add_line)[1:])
    out = shlex.split(prepare_line)[shlex.split(prepare_line).index("--out") + 1]
    assert (project / f"{out}.dvc").is_file()
    assert mcx_subprocess(project, "plan", "experiments/tiny.toml").code == 0

    # Inside data/ (data.dvc): refused, nothing written; with --inside-tracked written, and the
    # quickstart specs exit 2 until the new version of data/ is recorded as the command says.
    data = tree_bytes(project / "data")
    res = mcx_subprocess(project, "data", "prepare", "corpus.jsonl", "--out", "data/mine")
    assert res.code == 2 and "--inside-tracked" in res.err, res
    assert tree_bytes(project / "data") == data
    res = mcx_subprocess(project, "data", "prepare", "corpus.jsonl", "--out", "data/mine", "--inside-tracked")
    assert res.code == 0, res
    assert "data/mine is inside data: record the new version of data with `dvc add data` and commit data.dvc" in res.out
    res = mcx_subprocess(project, "plan", "experiments/tiny.toml")
    assert res.code == 2 and "data.dvc" in res.err, res
    dvc("add", "data")
    assert mcx_subprocess(project, "plan", "experiments/tiny.toml").code == 0


# ---------------------------------------------------------------- token ids against the vocabulary


def test_largest_token_id_is_kept_with_the_files_hash_and_read_again_only_when_the_file_changes(tmp_path: Path) -> None:
    import numpy as np

    from mcx.fingerprint.filehashes import FileHashes, cache_path, load

    (tmp_path / ".mcx").mkdir()
    path = tmp_path / "corpus.bin"
    np.array([3, 70000, 12, 69999], dtype=np.int32).tofile(path)
    past = (int(1e9) * (int(os.path.getmtime(path)) - 60),) * 2
    os.utime(path, ns=past)  # older than the racy window: kept
    hashes = FileHashes.for_project(tmp_path)
    assert hashes.largest(path, "int32") == 70000 and hashes.read == 1
    hashes.hash(path, "sha256")
    hashes.save()
    entry = load(cache_path(tmp_path))[str(path)]
    assert entry[3]["max:int32"] == 70000 and len(entry[3]["sha256"]) == 64  # one entry: the bound beside the hash
    again = FileHashes.for_project(tmp_path)
    assert again.largest(path, "int32") == 70000 and again.read == 0  # this version's bound is not read again
    assert again.largest(path, "uint16") == 0x1170  # 70000 = 0x1_1170: another reading, another bound
    np.array([3, 5], dtype=np.int32).tofile(path)
    os.utime(path, ns=past)  # same mtime, another size: another version
    assert FileHashes.for_project(tmp_path).largest(path, "int32") == 5
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert FileHashes.for_project(tmp_path).largest(empty, "uint16") is None


def test_token_ids_past_the_vocabulary_are_refused_before_training(tmp_path: Path) -> None:
    """An untracked copy of the quickstart with 0xFF bytes written over it: `mcx plan` and `mcx run` exit 2
    naming data.path, the largest id and the vocabulary; the clean copy's bound is in the data's info."""
    import numpy as np

    from conftest import make_e2e_project, mcx_subprocess

    from mcx.fingerprint.data import collect_data
    from mcx.spec import load_spec

    project = make_e2e_project(tmp_path / "project")
    (project / ".mcx").mkdir()
    mine = project / "corpora" / "mine"
    shutil.copytree(project / "data" / "quickstart", mine)
    spec = load_spec(project / "experiments" / "tiny.toml", ["data.path=corpora/mine"])
    clean = collect_data(spec, project)
    top = int(np.fromfile(mine / "corpus.bin", dtype=np.uint16).max())
    assert clean["info"]["dataset"]["max_token_id"] == top < 4096
    assert "max_token_id" not in json.dumps(clean["id"])  # info, not the identity
    with open(mine / "corpus.bin", "r+b") as f:
        f.seek(1000)
        f.write(b"\xff" * 64)
    for verb in (["plan"], ["run"], ["run", "--dry-run"]):
        res = mcx_subprocess(project, *verb, "experiments/tiny.toml", "--set", "data.path=corpora/mine")
        assert res.code == 2, res
        assert "data.path: 'corpora/mine' holds token id 65535 in corpus.bin" in res.err, res.err
        assert "the tokenizer's vocabulary has 4096 ids (0 to 4095)" in res.err and "Traceback" not in res.err
    assert sorted(p.name for p in (project / ".mcx").iterdir()) == ["file-hashes.json"]  # nothing trained
