"""Runs that start from other runs ([init] from = "run:<id>"): the parent's identity in the child's ID, the
weights carried over exactly, the chain listed by `mcx lineage`, and every bad source refused (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import make_e2e_project, mcx_subprocess

SHORT = ["--skip-smoke", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=10"]


@pytest.mark.slow
def test_a_run_continues_from_another_runs_checkpoint_and_the_chain_is_recorded(tmp_path: Path) -> None:
    project = make_e2e_project(tmp_path / "project")
    parent = mcx_subprocess(project, "run", "experiments/tiny.toml", *SHORT, "--set", "train.train_iters=20", "--json")
    assert parent.code == 0, parent.err
    pid = parent.json()["run_id"]
    runs = project / ".mcx" / "runs"
    # lr 0: the child's weights stay the parent's final ones, so its test loss (the same first test
    # samples) is the parent's, bit for bit
    child_args = [*SHORT, "--set", "train.train_iters=10", "--set", "train.lr=0.0", "--set", "train.min_lr=0.0",
                  "--set", f'init.from="run:{pid}"']
    child = mcx_subprocess(project, "run", "experiments/tiny.toml", *child_args, "--json")
    assert child.code == 0, child.err
    cid = child.json()["run_id"]

    def test_loss(run_id: str) -> float:
        lines = (runs / run_id / "full" / "metrics.jsonl").read_text().splitlines()
        return next(json.loads(x)["loss"] for x in lines if json.loads(x)["kind"] == "test")

    assert test_loss(cid) == test_loss(pid)
    first = json.loads((runs / cid / "full" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss"] < 7.0 < 8.3  # not a random start (ln 4096 = 8.3)
    init = json.loads((runs / cid / "fingerprint.json").read_text())["init"]
    assert init["id"]["kind"] == "run" and init["id"]["run_id"] == pid and init["id"]["step"] == 20
    assert "init" in json.loads((runs / cid / "fingerprint.json").read_text())["component_hashes"]
    assert "init" not in json.loads((runs / pid / "fingerprint.json").read_text())  # random weights: no component

    chain = mcx_subprocess(project, "lineage", cid, "--json").json()
    assert [a["run_id"] for a in chain["ancestors"]] == [pid] and chain["descendants"] == []
    down = mcx_subprocess(project, "lineage", pid, "--json").json()
    assert [(d["run_id"], d["depth"], d["step"]) for d in down["descendants"]] == [(cid, 1, 20)]
    table = mcx_subprocess(project, "lineage", cid)
    assert table.code == 0 and f"{pid} step 20" in table.out and "random weights" in table.out

    # the same child again is the same run (served from the run cache); a child of another step is another
    again = mcx_subprocess(project, "run", "experiments/tiny.toml", *child_args, "--json")
    assert again.code == 0 and again.json()["run_id"] == cid and again.json()["cached"] is True

    before = sorted(p.name for p in runs.iterdir())
    for extra, key, words in (
            (["--set", "model.num_layers=2"], "model.num_layers", "2 here, 4 in run"),
            (["--set", "init.step=7"], "init.step", "saved steps: 20"),
            (["--set", 'init.from="run:0123456789ab"'], "init.from", "no run 0123456789ab in this project")):
        bad = mcx_subprocess(project, "run", "experiments/tiny.toml", *child_args, *extra)
        assert bad.code == 2 and f"{key}: " in bad.err and words in bad.err and "Traceback" not in bad.err, bad.err
    assert sorted(p.name for p in runs.iterdir()) == before  # nothing written

    # the parent's checkpoint gone from the workspace: the child's reproduction fetches it from DVC by the
    # parent's committed pointer, checks its content against the child's record, and reruns bitwise
    shutil.rmtree(runs / pid / "full" / "checkpoints" / "iter_0000020")
    rep = mcx_subprocess(project, "reproduce", cid, "--json")
    assert rep.code == 0, rep.err
    verdict = rep.json()
    assert verdict["verdict"] == "bitwise", verdict["text"]
    assert verdict["parent"]["run_id"] == pid and verdict["parent"]["pulled"] is True
    assert (runs / pid / "full" / "checkpoints" / "iter_0000020" / "state.pt").is_file()


def _fake_run(root: Path, run_id: str, crc: str, status: str = "finished") -> Path:
    """A run directory as mcx leaves it, with a final checkpoint of one file (its CRC given)."""
    run = root / ".mcx" / "runs" / run_id
    ckpts = root / "elsewhere" / run_id
    it = ckpts / "iter_0000020"
    it.mkdir(parents=True)
    (it / "state.pt").write_bytes(b"weights")
    meta = json.dumps({"step": 20, "consumed_samples": 160, "saved_at": 1.0})
    (it / "meta.json").write_text(meta)
    (it / "checksums.json").write_text(json.dumps({"algorithm": "crc32", "files": {  # sizes as written: the plan checks them
        "state.pt": {"size": 7, "crc32": crc}, "meta.json": {"size": len(meta), "crc32": "00000000"}}}))
    (ckpts / "latest").write_text("iter_0000020\n")
    (run / "full").mkdir(parents=True)
    (run / "full" / "job.json").write_text(json.dumps({"checkpoint_dir": str(ckpts)}))
    (run / "run.json").write_text(json.dumps({"status": status}))
    return ckpts


def test_the_parents_checkpoint_content_is_the_childs_identity_not_its_place(tmp_path: Path) -> None:
    from mcx.errors import InputError
    from mcx.fingerprint.init_from import run_source

    ckpts = _fake_run(tmp_path, "aaaaaaaaaaaa", "1c291ca3")
    first = run_source(tmp_path, "aaaaaaaaaaaa", None)
    assert first["id"]["run_id"] == "aaaaaaaaaaaa" and first["id"]["step"] == 20
    assert first["info"]["format"] == "torch" and first["info"]["path"] == str(ckpts / "iter_0000020")
    # moved: the same identity
    moved = tmp_path / "moved"
    shutil.move(ckpts, moved)
    (tmp_path / ".mcx" / "runs" / "aaaaaaaaaaaa" / "full" / "job.json").write_text(json.dumps({"checkpoint_dir": str(moved)}))
    assert run_source(tmp_path, "aaaaaaaaaaaa", None)["id"] == first["id"]
    # meta.json's save time is not content; a changed file is
    meta = moved / "iter_0000020" / "meta.json"
    meta.write_text(json.dumps({"step": 20, "consumed_samples": 160, "saved_at": 2.0}))
    assert run_source(tmp_path, "aaaaaaaaaaaa", None)["id"] == first["id"]
    _fake_run(tmp_path / "other", "aaaaaaaaaaaa", "ffffffff")
    assert run_source(tmp_path / "other", "aaaaaaaaaaaa", None)["id"]["checkpoint"] != first["id"]["checkpoint"]
    # a parent that never finished has no final checkpoint; a step it did not save is named with those it did
    _fake_run(tmp_path / "running", "bbbbbbbbbbbb", "1c291ca3", status="running")
    with pytest.raises(InputError, match=r"never finished \(status running\).*saved steps: 20"):
        run_source(tmp_path / "running", "bbbbbbbbbbbb", None)
    assert run_source(tmp_path / "running", "bbbbbbbbbbbb", 20)["id"]["step"] == 20
    with pytest.raises(InputError, match="no checkpoint of step 5"):
        run_source(tmp_path / "running", "bbbbbbbbbbbb", 5)
    # a file cut short is named by its size, without reading the weights (D48)
    (moved / "iter_0000020" / "state.pt").write_bytes(b"wei")
    with pytest.raises(InputError, match=r"init.from: run aaaaaaaaaaaa's checkpoint .*iter_0000020 is damaged: "
                                         r"state.pt: 3 B, expected 7 B .*train run aaaaaaaaaaaa again"):
        run_source(tmp_path, "aaaaaaaaaaaa", None)


def test_init_keys_are_checked_with_the_spec() -> None:
    from mcx.errors import SpecError
    from mcx.spec.load import load_spec

    root = Path(__file__).resolve().parents[1]
    cases = {
        ('init.from="run:xyz"',): "init.from: 'run:xyz' is not a source",
        ('init.from="s3:bucket"',): "init.from: 's3:bucket' is not a source",
        ("init.step=3",): "init.step: needs init.from",
        ('init.from="hf:models/llama"', "init.load_optimizer=true"): "init.load_optimizer: a Hugging Face model",
        ('init.from="hf:models/llama"', "init.step=2"): "init.step: names a step of a run",
        ('init.from="run:0123456789ab"', "init.step=0"): "init.step: must be a step >= 1",
        ("init.source=1",): "init.source: unknown key; known keys: from, step, load_optimizer, reset_step",
    }
    for overrides, message in cases.items():
        with pytest.raises(SpecError, match=None) as exc:
            load_spec(root / "experiments" / "tiny.toml", list(overrides))
        assert message in str(exc.value), (overrides, str(exc.value))
    spec = load_spec(root / "experiments" / "tiny.toml", ['init.from="run:0123456789ab"', "init.step=5"])
    assert spec.init.source == "run:0123456789ab" and spec.init.step == 5 and spec.init.reset_step


def test_a_megatron_source_is_found_checked_and_identified_by_content(tmp_path: Path) -> None:
    """init.from = "megatron:<dir>": Megatron-LM's save directory (its tracker names the iteration), mcx's
    checkpoint directory (``latest``) or the iteration itself; a legacy or foreign directory is named with
    what to do; the checkpoint's files are the child's identity (docs/lineage.md)."""
    from mcx.errors import InputError
    from mcx.fingerprint.init_from import collect_init, megatron_checkpoint
    from mcx.spec.load import load_spec

    save = tmp_path / "megatron" / "save"
    it = save / "iter_0000300"
    it.mkdir(parents=True)
    (it / ".metadata").write_bytes(b"torch.distributed.checkpoint metadata")
    (it / "__0_0.distcp").write_bytes(b"shard 0")
    (save / "latest_checkpointed_iteration.txt").write_text("300\n")
    assert megatron_checkpoint(save) == it and megatron_checkpoint(it) == it

    spec_path = Path(__file__).resolve().parents[1] / "experiments" / "tiny.toml"
    spec = load_spec(spec_path, ['init.from="megatron:megatron/save"'])
    first = collect_init(spec, tmp_path)
    assert first["id"]["kind"] == "megatron" and first["info"]["path"] == str(it) and first["info"]["format"] == "dist"
    (it / "__0_0.distcp").write_bytes(b"shard 1")
    assert collect_init(spec, tmp_path)["id"]["content"] != first["id"]["content"]

    (save / "latest_checkpointed_iteration.txt").write_text("400\n")
    with pytest.raises(InputError, match="names iter_0000400 as its newest checkpoint"):
        megatron_checkpoint(save)
    legacy = tmp_path / "legacy" / "iter_0000001"
    (legacy / "mp_rank_00").mkdir(parents=True)
    with pytest.raises(InputError, match=r"legacy Megatron-LM checkpoint.*--saver mcore"):
        megatron_checkpoint(legacy)
    with pytest.raises(InputError, match=r"not a torch_dist distributed checkpoint \(it has no .metadata\)"):
        megatron_checkpoint(tmp_path / "legacy")
