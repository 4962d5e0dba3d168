"""`mcx data prepare` on real corpora: JSONL, gzipped JSONL and Parquet shards built here, tokenized by worker
processes into Megatron-Core's indexed format (read back with Megatron-Core), interrupted and resumed, with a
Hugging Face model directory as the tokenizer, and bad shards refused."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcx.data import prepare
from mcx.data.corpus import Corpus
from mcx.data.prepare import TMP_PREFIX, prepare_shards
from mcx.data.shard_work import DONE, PrepareProgress
from mcx.data.shards import find_shards, shard_documents
from mcx.data.tokenizer import EOD_TOKEN, load_saved, train_bpe
from mcx.errors import DataError
from mcx.spec.schema import TokenizerSpec

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:megatron")  # optional CUDA packages missing on CPU

WORDS = ("the model reads a mixture of web text code and books while the data loader shuffles samples "
         "tokens per second rise with more workers json parquet shard megatron core").split()


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def documents(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 120))) + rng.choice(["", "\nü ✓", " 42."])
            for _ in range(n)]


def write_shards(root: Path, n_each: int = 40, seed: int = 0) -> list[str]:
    """Two JSONL shards, a gzipped one and a Parquet one (two row groups); returns every text in input order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    texts: list[str] = []
    for name in ("a.jsonl", "b.jsonl"):
        docs = documents(rng, n_each)
        lines = [json.dumps({"id": i, "text": t}) for i, t in enumerate(docs)]
        lines.insert(3, "")  # a blank line is skipped
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        texts += docs
    docs = documents(rng, n_each)
    with gzip.open(root / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in docs)
    texts += docs
    docs = documents(rng, n_each)
    pq.write_table(pa.table({"url": [f"u{i}" for i in range(n_each)], "text": docs}), root / "d.parquet",
                   row_group_size=n_each // 2)
    texts += docs
    return texts


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face model directory as `mcx import-hf` brings one: config.json and tokenizer.json beside it."""
    root = tmp_path_factory.mktemp("hf") / "model"
    root.mkdir()
    tok = train_bpe(documents(random.Random(7), 300), 400)
    tok.save(root)
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 400}))
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOD_TOKEN}))
    return root


def hf_spec(hf_model: Path) -> TokenizerSpec:
    return TokenizerSpec(kind="huggingface", path=str(hf_model / "tokenizer.json"))


def read_back(directory: Path) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(str(directory / "corpus"))
    return [dataset[i].tolist() for i in range(len(dataset))]


def test_three_formats_give_the_same_bytes_with_one_and_two_workers_as_one_builder(hf_model: Path, tmp_path: Path) -> None:
    texts = write_shards(tmp_path / "shards")
    shards = find_shards([str(tmp_path / "shards")])
    assert [s.path.name for s in shards] == ["a.jsonl", "b.jsonl", "c.jsonl.gz", "d.parquet"]
    events: list[PrepareProgress] = []
    one = prepare_shards(shards, hf_spec(hf_model), tmp_path / "one", workers=1, progress=events.append)
    two = prepare_shards(shards, hf_spec(hf_model), tmp_path / "two", workers=2)
    assert one == two
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")
    assert not list(tmp_path.glob(f"{TMP_PREFIX}*"))  # the work directory is gone once the dataset is whole

    # Every text, in input order, as the tokenizer encodes it plus the end-of-document id (Megatron reads it back)
    tok = load_saved(tmp_path / "one", "huggingface")
    assert read_back(tmp_path / "one") == [tok.encode(t) + [tok.eod] for t in texts]
    assert one["source"]["documents"] == len(texts) and one["source"]["kind"] == "jsonl+parquet"
    assert one["dataset"]["tokens"] == sum(len(tok.encode(t)) + 1 for t in texts)

    # The same bytes as one IndexedDatasetBuilder fed every document (the single-file path, mcx.data.prepare.prepare)
    every = Corpus(description={"kind": "test"}, files=tuple(s.path for s in shards),
                   reader=lambda p: (t for t, _ in shard_documents(next(s for s in shards if s.path == p), "text")))
    prepare(every, hf_spec(hf_model), tmp_path / "single")
    assert {n: b for n, b in tree_bytes(tmp_path / "single").items() if n != "manifest.json"} == {
        n: b for n, b in tree_bytes(tmp_path / "one").items() if n != "manifest.json"}

    last = events[-1]
    assert (last.shards_done, last.documents, last.tokens) == (4, len(texts), one["dataset"]["tokens"])
    assert last.bytes_done == last.bytes_total == sum(s.size for s in shards) and last.shards_resumed == 0
    assert [e.shards_done for e in events] == sorted(e.shards_done for e in events)

    # The same inputs again: the dataset is checked and kept; another tokenizer is refused without --force
    assert prepare_shards(shards, hf_spec(hf_model), tmp_path / "one", workers=2) == one
    with pytest.raises(DataError, match="already holds a different dataset"):
        prepare_shards(shards, TokenizerSpec(kind="bpe", vocab_size=300), tmp_path / "one")


def _cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "DVC_NO_ANALYTICS": "1"}
    return subprocess.Popen([sys.executable, "-m", "mcx", "--project", str(cwd), "data", "prepare", *args], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_interrupted_prepare_resumes_without_redoing_finished_shards(hf_model: Path, tmp_path: Path) -> None:
    """Ctrl-C while two workers tokenize: exit 130, no dataset; run again: the finished shards are reused and the
    bytes are those of a prepare never interrupted."""
    shards = tmp_path / "shards"
    for k in range(6):
        write_shards(shards / f"part{k}", n_each=800, seed=k)
    args = [str(shards), "--tokenizer", str(hf_model), "--workers", "2"]
    work = tmp_path / f"{TMP_PREFIX}ds-work"
    proc = _cli(*args, "--out", "ds", cwd=tmp_path)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        state = json.loads((work / DONE).read_text()) if (work / DONE).exists() else {}
        if len(state.get("shards", {})) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert not (tmp_path / "ds").exists() and not list(work.glob("*.partial.*"))
    finished = len(json.loads((work / DONE).read_text())["shards"])
    assert 2 <= finished < 24

    proc = _cli(*args, "--out", "ds", cwd=tmp_path)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    lines = [line for line in err.splitlines() if line.startswith("prepare: ")]
    assert lines[0].startswith(f"prepare: {finished}/24 shards ({finished} from before)"), err
    assert "24/24 shards" in err and "tokens/s" in err and "ETA" in err
    assert not work.exists()

    proc = _cli(*args, "--out", "whole", cwd=tmp_path)
    assert proc.communicate(timeout=900) and proc.returncode == 0
    assert tree_bytes(tmp_path / "ds") == tree_bytes(tmp_path / "whole")


def test_a_hugging_face_model_directory_is_a_tokenizer(hf_model: Path, tmp_path: Path) -> None:
    from conftest import mcx_inprocess

    write_shards(tmp_path / "shards", n_each=10)
    res = mcx_inprocess(tmp_path, "data", "prepare", "shards/*.jsonl", "--tokenizer", str(hf_model), "--out", "ds",
                        "--json")
    assert res.code == 0, res
    manifest = json.loads(res.out.splitlines()[-1])["manifest"]
    assert manifest["tokenizer"]["kind"] == "huggingface"
    assert (tmp_path / "ds" / "tokenizer.json").read_bytes() == (hf_model / "tokenizer.json").read_bytes()
    assert manifest["source"]["files"] == 2  # the glob: a.jsonl and b.jsonl

    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    res = mcx_inprocess(tmp_path, "data", "prepare", "shards", "--tokenizer", str(empty), "--out", "ds2")
    assert res.code == 2 and "without a tokenizer.json (it holds: config.json)" in res.err, res
    assert not (tmp_path / "ds2").exists()


def _broken_jsonl(root: Path) -> str:
    (root / "b.jsonl").write_text('{"text": "fine"}\n{"text": "cut\n', encoding="utf-8")
    return "b.jsonl:2: malformed JSON"


def _truncated_gzip(root: Path) -> str:
    data = (root / "c.jsonl.gz").read_bytes()
    (root / "c.jsonl.gz").write_bytes(data[: len(data) // 2])
    return "c.jsonl.gz: the gzip stream is broken after line"


def _missing_key(root: Path) -> str:
    (root / "a.jsonl").write_text('{"text": "x"}\n{"content": "y"}\n', encoding="utf-8")
    return 'a.jsonl:2: no "text" field (keys: content)'


def _missing_column(root: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), root / "d.parquet")
    return 'd.parquet: no "text" column (columns: body)'


def _null_row(root: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["x", "y", None]}), root / "d.parquet")
    return 'd.parquet: row 2 (counting from 0) has no "text" (null)'


def _not_parquet(root: Path) -> str:
    (root / "d.parquet").write_bytes(b"PAR1 not really")
    return "d.parquet: not a readable Parquet file"


@pytest.mark.parametrize("damage", [_broken_jsonl, _truncated_gzip, _missing_key, _missing_column, _null_row,
                                    _not_parquet], ids=lambda f: f.__name__.strip("_"))
def test_a_bad_shard_is_refused_with_exit_2_naming_file_and_place(damage, hf_model: Path, tmp_path: Path) -> None:
    from conftest import mcx_inprocess

    write_shards(tmp_path / "shards", n_each=10)
    expected = damage(tmp_path / "shards")
    res = mcx_inprocess(tmp_path, "data", "prepare", "shards", "--tokenizer", str(hf_model), "--out", "ds")
    assert res.code == 2 and expected in " ".join(res.err.split()), res
    assert "Traceback" not in res.err
    assert not (tmp_path / "ds").exists()


def test_inputs_that_match_nothing_are_refused(hf_model: Path, tmp_path: Path) -> None:
    from conftest import mcx_inprocess

    write_shards(tmp_path / "shards", n_each=5)
    (tmp_path / "notes.txt").write_text("a text file")
    for args, expected in ((["shards/*.json"], "the glob 'shards/*.json' matches no file"),
                           (["nope/*.parquet"], "matches no file"),
                           (["shards", "notes.txt"], "mix text files with record shards"),
                           (["notes.txt", "--workers", "2"], "--workers 2 applies to record shards"),
                           (["shards", "--workers", "0"], "--workers 0 is not a number of processes")):
        res = mcx_inprocess(tmp_path, "data", "prepare", *args, "--tokenizer", str(hf_model), "--out", "ds")
        assert res.code == 2 and expected in " ".join(res.err.split()), (args, res)
    assert not (tmp_path / "ds").exists()
