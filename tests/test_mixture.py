"""Data mixtures (D60): named components with weights, through Megatron-Core's BlendedMegatronDatasetBuilder.

Three small prepared datasets (paragraphs of mcx's own modules, split three ways, tokenized with one BPE
tokenizer trained on all of them, prepared by mcx's own `prepare`) are the components. Nothing is
replaced: the spec loader, the fingerprint, the planner and `mcx run` with its real worker train them.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from conftest import e2e_env, mcx_subprocess
from mcx.errors import DataError, InputError, SpecError
from mcx.fingerprint.diff import explain
from mcx.fingerprint.record import collect, run_id
from mcx.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}

SPEC = {
    "name": "mix",
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64},
    "train": {"micro_batch_size": 4, "global_batch_size": 8, "train_iters": 24, "lr": 3e-3, "precision": "fp32",
              "deterministic": True, "eval_interval": 12, "eval_iters": 2},
    "data": {"tokenizer": {"kind": "huggingface", "path": "tok/tokenizer.json"},
             "mix": {name: {"path": f"datasets/{name}", "weight": w} for name, w in WEIGHTS.items()}},
    "smoke": {"enabled": False},
    "checkpoint": {"interval": 8, "async_save": False},
}


def write_spec(project: Path, name: str = "mix.toml", **data: object) -> Path:
    spec = json.loads(json.dumps(SPEC))
    spec["data"].update(data)
    path = project / name
    path.write_text(tomli_w.dumps(spec), encoding="utf-8")
    return path


def _prepare(root: Path, name: str, texts: list[str], tokenizer: str = "tok/tokenizer.json") -> None:
    from mcx.data.corpus import text_corpus
    from mcx.data.prepare import prepare
    from mcx.spec.schema import TokenizerSpec

    src = root / "texts" / name
    src.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        (src / f"{i}.txt").write_text(text, encoding="utf-8")
    prepare(text_corpus([src], unit="paragraph"), TokenizerSpec(kind="huggingface", path=tokenizer),
            root / "datasets" / name, base_dir=root)


def _sources() -> dict[str, list[str]]:
    files = sorted(p for p in (ROOT / "mcx").rglob("*.py") if p.stat().st_size > 4000)
    return {name: [p.read_text(encoding="utf-8") for p in files[i::3]] for i, name in enumerate(WEIGHTS)}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git project holding the three components and their one tokenizer."""
    from mcx.data.tokenizer import train_bpe

    root = tmp_path_factory.mktemp("mixture")
    sources = _sources()
    (root / "tok").mkdir()
    train_bpe([t for texts in sources.values() for t in texts], 1024).save(root / "tok")
    for name, texts in sources.items():
        _prepare(root, name, texts)
    (root / "lockfiles").mkdir()
    shutil.copyfile(ROOT / "lockfiles" / "cpu.txt", root / "lockfiles" / "cpu.txt")
    write_spec(root)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "mixture project"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root


# -- the spec ------------------------------------------------------------------------------------------------


def test_a_single_path_spec_dumps_and_hashes_without_mixture_tables() -> None:
    from mcx.fingerprint.config import canonical_config
    from mcx.spec import dump_spec, spec_to_dict

    spec = load_spec(ROOT / "experiments" / "tiny.toml")
    assert set(spec_to_dict(spec)["data"]) == {"path", "prefix", "split", "tokenizer"}
    assert "mix" not in dump_spec(spec) and "mix" not in canonical_config(spec)["data"]


def test_bad_mixtures_are_named_at_once(tmp_path: Path) -> None:
    path = write_spec(tmp_path, path="data/quickstart",
                      mix={"web": {"path": "a", "weight": 0.0}, "code": {"path": "", "weight": -2.0}},
                      valid={"wiki": {"path": "b", "weight": 1.0}}, split="90,5,5")
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    assert exc.value.exit_code == 2
    found = dict(exc.value.problems)
    assert set(found) == {"data.mix", "data.split", "data.mix.web.weight", "data.mix.code.path",
                          "data.mix.code.weight"}, found
    assert "both set" in found["data.mix"] and "must be positive, got -2" in found["data.mix.code.weight"]
    spec = json.loads(json.dumps(SPEC))
    del spec["data"]["mix"]
    (tmp_path / "none.toml").write_text(tomli_w.dumps(spec), encoding="utf-8")
    with pytest.raises(SpecError) as exc:
        load_spec(tmp_path / "none.toml")
    assert ("data.path", "required key is missing; add it") in exc.value.problems
    (tmp_path / "inf.toml").write_text(
        (tmp_path / "none.toml").read_text() + '\n[data.mix.web]\npath = "a"\nweight = inf\n', encoding="utf-8")
    with pytest.raises(SpecError) as exc:
        load_spec(tmp_path / "inf.toml")
    assert exc.value.problems == [("data.mix.web.weight", "must be a finite number, got inf")]


def test_a_missing_component_and_another_tokenizer_are_bad_input(project: Path, tmp_path: Path) -> None:
    from mcx.data.tokenizer import train_bpe

    missing = write_spec(project, "missing.toml", mix={**SPEC["data"]["mix"], "books": {"path": "datasets/books",
                                                                                         "weight": 1.0}})
    runs = project / ".mcx" / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    result = mcx_subprocess(project, "run", missing.name)  # (`mcx plan` plans without it, warning)
    assert result.code == 2 and "data.mix.books.path" in result.err and "datasets/books" in result.err, result
    assert (set(runs.iterdir()) if runs.exists() else set()) == before  # nothing written
    other = tmp_path / "other"
    (other / "tok").mkdir(parents=True)
    train_bpe(_sources()["web"][:20], 512).save(other / "tok")
    _prepare(other, "books", _sources()["math"][:5])
    shutil.copytree(other / "datasets" / "books", project / "datasets" / "books")
    try:
        result = mcx_subprocess(project, "plan", missing.name)
    finally:
        shutil.rmtree(project / "datasets" / "books")
        missing.unlink()
    assert result.code == 2 and "data.mix.books" in result.err and "another tokenizer" in result.err, result
    assert "Traceback" not in result.err


# -- the run ID ----------------------------------------------------------------------------------------------


def test_a_weight_or_a_components_bytes_change_the_id_and_explain_names_it(project: Path) -> None:
    base = collect(load_spec(project / "mix.toml"), project)
    reweighted = collect(load_spec(project / "mix.toml", ["data.mix.web.weight=0.6"]), project)
    assert run_id(base) != run_id(reweighted)
    changes = [(d.component, c.key, c.a, c.b) for d in explain(base, reweighted).components for c in d.changes]
    assert changes == [("config", "data.mix.web.weight", 0.5, 0.6)]
    moved = project / "moved"
    shutil.copytree(project / "datasets" / "code", moved / "code")
    try:  # a component elsewhere with the same bytes: the same run
        assert run_id(collect(load_spec(project / "mix.toml", ['data.mix.code.path="moved/code"']), project)) \
            == run_id(base)
        bin_path = moved / "code" / "corpus.bin"
        raw = bytearray(bin_path.read_bytes())
        raw[100], raw[101] = raw[102], raw[103]  # two token ids swapped: same size, other content
        bin_path.write_bytes(bytes(raw))
        edited = collect(load_spec(project / "mix.toml", ['data.mix.code.path="moved/code"']), project)
    finally:
        shutil.rmtree(moved)
    assert run_id(edited) != run_id(base)
    diff = explain(base, edited).components
    assert [d.component for d in diff] == ["data"] and [c.key for c in diff[0].changes] == ["mix.code.value"]


# -- training ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(project: Path) -> dict:
    """The mixture trained once, uninterrupted: `mcx run --json`'s summary."""
    result = mcx_subprocess(project, "run", "mix.toml", "--json")
    assert result.code == 0, result
    return result.json()


def _train_lines(stage: Path) -> list[dict]:
    lines = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: r[k] for k in ("step", "loss", "grad_norm", "lr")} for r in lines if r.get("kind") == "train"]


def test_a_mixture_trains_and_draws_its_weights(project: Path, trained: dict) -> None:
    record = json.loads((Path(trained["run_dir"]) / "full" / "result.json").read_text())
    drawn = record["details"]["mixture"]
    consumed = SPEC["train"]["train_iters"] * SPEC["train"]["global_batch_size"]
    assert sum(c["samples"] for c in drawn.values()) == consumed
    for name, weight in WEIGHTS.items():
        part = drawn[f"mix.{name}"]
        band = 3 * math.sqrt(weight * (1 - weight) / consumed)  # three standard deviations of a binomial share
        assert part["requested"] == pytest.approx(weight) and abs(part["share"] - weight) <= band, drawn
    shown = mcx_subprocess(project, "show", trained["run_id"])
    assert shown.code == 0, shown
    assert "mix.web" in shown.out and "50.0% -> 50.0% (96 samples)" in " ".join(shown.out.split()), shown.out
    # ... and MLflow's run holds them as metrics (data/<component>/samples, /share; a smoke stage's prefixed).
    from mlflow import MlflowClient

    assert trained["tracking"]["state"] == "synced", trained["tracking"]
    client = MlflowClient(tracking_uri=f"sqlite:///{project / '.mcx' / 'mlflow.db'}")
    logged = client.get_run(trained["tracking"]["mlflow_run"]).data.metrics
    for name in WEIGHTS:
        assert logged[f"data/mix.{name}/samples"] == drawn[f"mix.{name}"]["samples"]
        assert logged[f"data/mix.{name}/share"] == pytest.approx(drawn[f"mix.{name}"]["share"])


def test_a_mixture_killed_and_resumed_trains_the_same_samples_bitwise(project: Path, trained: dict) -> None:
    """The worker SIGKILLed after the checkpoint at step 8 (or 16, on a loaded machine), `mcx run` again: it resumes
    there and every step's loss, gradient norm and learning rate are the uninterrupted run's, bit for bit (the
    same samples)."""
    import os
    import signal
    import sys
    import time

    from mcx.launch.process import child_pids

    stage = Path(trained["run_dir"]) / "full"
    reference = _train_lines(stage)
    reference_drawn = json.loads((stage / "result.json").read_text())["details"]["mixture"]
    since = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "mcx", "--project", str(project), "run", "mix.toml", "--force"],
                            cwd=project, env=e2e_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        worker, deadline = None, time.monotonic() + 600
        while time.monotonic() < deadline:
            worker = worker or next((p for p in child_pids(proc.pid)
                                     if b"mcx.train" in Path(f"/proc/{p}/cmdline").read_bytes()), None)
            metrics = stage / "metrics.jsonl"
            done = [r["step"] for r in (_train_lines(stage) if metrics.exists() else [])
                    if r["step"] > 0] if metrics.exists() and metrics.stat().st_mtime >= since else []
            if worker is not None and done and max(done) >= 9:
                # Frozen first, so the newest checkpoint cannot move on while it is read: on a loaded machine the
                # worker can train several steps between two polls (then it resumes from step 16, not 8).
                os.kill(worker, signal.SIGSTOP)
                job = json.loads((stage / "job.json").read_text())
                newest = (Path(job["checkpoint_dir"]) / "latest").read_text().strip()
                os.kill(worker, signal.SIGKILL)
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        else:
            raise AssertionError("the worker did not reach step 9")
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1 and "SIGKILL" in " ".join(err.split()), err[-3000:]
    resumed = mcx_subprocess(project, "run", "mix.toml", "--json")
    assert newest in ("iter_0000008", "iter_0000016"), newest  # killed mid-stage, after its first checkpoint
    assert resumed.code == 0 and f"resuming from {newest}" in " ".join(resumed.err.split()), resumed
    again = _train_lines(stage)
    by_step = {r["step"]: r for r in again}  # steps after the checkpoint ran twice: the resumed run's lines come last
    assert sorted(by_step) == [r["step"] for r in reference]
    assert [by_step[r["step"]] for r in reference] == reference
    assert json.loads((stage / "result.json").read_text())["details"]["mixture"] == reference_drawn


def test_a_resumed_mixture_reads_the_same_samples(project: Path, tmp_path: Path) -> None:
    """The blend's sample order from a checkpoint's consumed_samples is the uninterrupted order, and the
    index cache built again (a fresh stage directory) gives the same samples."""
    from mcx.train.datasets import datasets_from_spec, iterate_batches

    spec = load_spec(project / "mix.toml")
    whole = datasets_from_spec(spec, project, tmp_path / "a")
    again = datasets_from_spec(spec, project, tmp_path / "b")
    batches = [b["tokens"] for b in iterate_batches(whole.train, 0, 4, 0, 1, total_samples=64)]
    resumed = [b["tokens"] for b in iterate_batches(again.train, 32, 4, 0, 1, total_samples=64)]
    assert len(batches) == 16 and all(np.array_equal(x, y) for x, y in zip(batches[8:], resumed, strict=True))
    assert whole.drawn(64) == again.drawn(64) and sum(whole.drawn(64).values()) == 64


# -- Megatron-LM interop -------------------------------------------------------------------------------------


def _script(data_args: str) -> str:
    return ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 "
            "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --train-iters 10 --lr 1e-3 --eval-interval 5 "
            f"--tokenizer-type GPT2BPETokenizer --vocab-file v.json --merge-file m.txt {data_args}\n")


def _mixture(result) -> dict[str, tuple[str, str, float]]:
    return {name: (p.path, p.prefix, p.weight) for name, p in result.spec.data.mix.items()}


def test_weighted_and_per_split_megatron_data_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcx.interop.importer import import_script

    weighted = import_script(_script("--data-path 0.3 /data/web_text_document 0.7 /data/code_text_document"),
                             name="w")
    assert weighted.spec.data.path is None and not weighted.problems, weighted.problems
    assert _mixture(weighted) == {"web_text_document": ("/data", "web_text_document", 0.3),
                                  "code_text_document": ("/data", "code_text_document", 0.7)}
    per_split = import_script(_script("--train-data-path 2 d/web/corpus 1 d/code/corpus --valid-data-path d/wiki/corpus "
                                      "--test-data-path 1 d/wiki/corpus 1 d/books/corpus --split 90,5,5"), name="p")
    data = per_split.spec.data
    assert _mixture(per_split) == {"web": ("d/web", "corpus", 2.0), "code": ("d/code", "corpus", 1.0)}
    assert {n: p.weight for n, p in data.valid.items()} == {"wiki": 1.0}
    assert {n: p.path for n, p in data.test.items()} == {"wiki": "d/wiki", "books": "d/books"}
    assert data.split == "969,30,1" and any("--split is given with per-split" in p for p in per_split.problems)
    # Megatron-LM weights unweighted prefixes by the datasets' sizes, which no script says: the one missing-values
    # error (exit 2) names --data-path and why its value cannot be read.
    with pytest.raises(InputError) as refused:
        import_script(_script("--data-path a/x b/y"), name="u")
    assert refused.value.exit_code == 2 and "--data-path (its value cannot be read: prefixes without weights, which Megatron-LM weights by the datasets' sizes)" in \
        str(refused.value)
    monkeypatch.chdir(tmp_path)  # Megatron-LM reads the args files where it starts; mcx import, where it runs
    (tmp_path / "blend.txt").write_text("0.25 /d/a_text_document\n0.75 /d/b_text_document\n", encoding="utf-8")
    (tmp_path / "splits.json").write_text(json.dumps({"train": "1 /d/a_text_document", "valid": ["/d/v_text_document"],
                                                      "test": None}), encoding="utf-8")
    from_file = import_script(_script("--data-args-path blend.txt"), name="f")
    assert _mixture(from_file) == {"a_text_document": ("/d", "a_text_document", 0.25),
                                   "b_text_document": ("/d", "b_text_document", 0.75)}
    split_file = import_script(_script("--per-split-data-args-path splits.json"), name="s").spec.data
    assert list(split_file.mix) == ["a_text_document"] and list(split_file.valid) == ["v_text_document"]
    assert not split_file.test


@pytest.mark.parametrize("data", [
    {"mix": {"web": {"path": "datasets/web", "weight": 0.7}, "code": {"path": "datasets/code", "weight": 0.3}}},
    {"mix": {"web": {"path": "datasets/web", "weight": 2.0}},
     "valid": {"wiki": {"path": "datasets/wiki", "prefix": "text", "weight": 1.0}},
     "test": {"a": {"path": "datasets/a", "weight": 1.0}, "b": {"path": "datasets/b", "weight": 3.0}}},
])
def test_a_mixture_exports_and_imports_back_to_its_run_id(tmp_path: Path, data: dict) -> None:
    from mcx.fingerprint.config import canonical_config
    from mcx.interop.exporter import export
    from mcx.interop.importer import import_script
    from mcx.plan.planner import make_plan

    spec_path = write_spec(tmp_path, **data)
    text = spec_path.read_text() + "\n[hardware]\ngpu = \"H100\"\n"
    spec_path.write_text(text.replace("[model]\n", "[model]\nvocab_size = 1024\n"), encoding="utf-8")
    spec = load_spec(spec_path)
    script = export(spec, make_plan(spec, te_available=True).layout, script=True)
    per_split = "valid" in data
    assert ("--train-data-path" in script and "--split" not in script) if per_split else "--data-path 0.7" in script
    back = import_script(script, name="mix").spec
    assert canonical_config(back) == canonical_config(spec)  # with the same data, the same run ID
    assert back.data == spec.data


# -- sweeps --------------------------------------------------------------------------------------------------


def test_a_mixture_sweep_plans_and_runs_two_trials(project: Path) -> None:
    """A sweep over one component's weight: two ordinary runs whose drawn shares are the renormalised weights."""
    (project / "mixsweep.toml").write_text(
        'extends = "mix.toml"\nname = "mixsweep"\n\n[train]\ntrain_iters = 8\neval_interval = 8\n\n'
        '[sweep.parameters]\n"data.mix.web.weight" = [0.5, 1.0]\n', encoding="utf-8")
    dry = mcx_subprocess(project, "sweep", "mixsweep.toml", "--dry-run", "--json")
    assert dry.code == 0, dry
    planned = dry.json()["trials"]
    assert [t["params"] for t in planned] == [{"data.mix.web.weight": 0.5}, {"data.mix.web.weight": 1.0}]
    assert len({t["run_id"] for t in planned}) == 2
    res = mcx_subprocess(project, "sweep", "mixsweep.toml", "--json")
    assert res.code == 0, res
    out = res.json()
    assert out["status"] == "finished" and sorted(t["run_id"] for t in out["trials"]) == \
        sorted(t["run_id"] for t in planned)
    for t in out["trials"]:
        drawn = json.loads((project / ".mcx" / "runs" / t["run_id"] / "full" / "result.json").read_text())
        shares = {name: part["requested"] for name, part in drawn["details"]["mixture"].items()}
        total = t["params"]["data.mix.web.weight"] + WEIGHTS["code"] + WEIGHTS["math"]
        assert shares == pytest.approx({"mix.web": t["params"]["data.mix.web.weight"] / total,
                                        "mix.code": WEIGHTS["code"] / total, "mix.math": WEIGHTS["math"] / total})
    # `mcx compare` of the two trials: the realised mixture beside the requested one, in every format.
    ids = [t["run_id"] for t in out["trials"]]
    doc = mcx_subprocess(project, "compare", *ids, "--format", "json")
    assert doc.code == 0, doc
    mixture = json.loads(doc.out)["mixture"]  # the report, indented
    assert sorted(mixture) == ["mix.code", "mix.math", "mix.web"]
    for t in out["trials"]:
        drawn = json.loads((project / ".mcx" / "runs" / t["run_id"] / "full" / "result.json").read_text())
        assert {n: mixture[n][t["run_id"]] for n in mixture} == drawn["details"]["mixture"]
    web = mixture["mix.web"]
    assert web[ids[0]]["share"] != web[ids[1]]["share"]
    first = f"{web[ids[0]]['requested']:.1%} -> {web[ids[0]]['share']:.1%}"
    table = mcx_subprocess(project, "compare", *ids)
    assert table.code == 0 and "Data mixture" in table.out and first in table.out, table.out
    md = mcx_subprocess(project, "compare", *ids, "--format", "md")
    assert md.code == 0 and "### Data mixture" in md.out and f"`mix.web` | {first}" in md.out, md.out
    html = mcx_subprocess(project, "compare", *ids, "--format", "html")
    assert html.code == 0 and '<section id="mixture">' in html.out and first.replace(">", "&gt;") in html.out
