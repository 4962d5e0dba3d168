"""What a run ID covers (docs/decisions.md D52), on real projects: real git, DVC, training and export.

The code component hashes the mcx modules a run executes, by content; the repository's commit, branch and
other files are provenance beside the ID. So the workflow a team follows in its repository (commit the
checkpoint pointer mcx asks for, version a new dataset, export a model, write another spec) leaves a
trained spec's ID as it was, and editing a module that a run executes makes another ID, whose reproduction
rebuilds the recorded tree.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mcx
from conftest import _git, e2e_env, git_head, make_e2e_project, mcx_inprocess, mcx_subprocess
from test_e2e import FAST, SPEC

RUN = [*FAST, "--skip-smoke"]  # the full stage only: whether the smoke stage ran is recorded, not hashed into the ID

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("e2e_clean_env")]

CORPUS = "".join(f"def step_{i}(model, batch):\n    return model(batch) * {i}\n\n" for i in range(400))


def commit(project: Path, message: str, *paths: str) -> None:
    _git(project, "add", *(paths or ("-A",)))
    _git(project, "commit", "-q", "-m", message)


def test_a_teams_repository_workflow_keeps_a_trained_specs_id(tmp_path: Path) -> None:
    project = make_e2e_project(tmp_path / "project")
    trained = mcx_inprocess(project, "run", SPEC, *RUN, "--json", "--quiet")
    assert trained.code == 0, trained
    rid, first_commit = trained.json()["run_id"], git_head(project)

    # The checkpoint pointers, committed as mcx's own message asks.
    assert f"git add .mcx/checkpoints/{rid}" in trained.err
    commit(project, f"mcx run {rid}", f".mcx/checkpoints/{rid}")
    # A new dataset beside data/, prepared, versioned with DVC and committed.
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    prepared = mcx_inprocess(project, "data", "prepare", str(tmp_path / "corpus.txt"), "--out", "datasets/mine",
                             "--vocab-size", "300")
    assert prepared.code == 0, prepared
    subprocess.run([sys.executable, "-m", "dvc", "add", "-q", "datasets/mine"], cwd=project, check=True,
                   env=e2e_env(), capture_output=True)
    commit(project, "a second dataset", "datasets/mine.dvc", "datasets/.gitignore")
    # The run exported as a Hugging Face model under hf/, committed; a new spec and notes left uncommitted.
    exported = mcx_inprocess(project, "export-hf", rid, "-o", "hf/tiny")
    assert exported.code == 0, exported
    commit(project, "the exported model", "hf")
    (project / "experiments" / "tiny_low_lr.toml").write_text(
        'extends = "tiny.toml"\nname = "tiny-low-lr"\n\n[train]\nlr = 1e-3\n', encoding="utf-8")
    (project / "NOTES.md").write_text("what we tried\n", encoding="utf-8")
    assert git_head(project) != first_commit

    planned = mcx_inprocess(project, "plan", SPEC, *FAST, "--json")
    assert planned.code == 0 and planned.json()["run_id"] == rid, planned
    again = mcx_inprocess(project, "run", SPEC, *RUN, "--json", "--quiet")
    assert again.code == 0, again
    assert again.json()["run_id"] == rid and again.json()["cached"] is True
    same = mcx_inprocess(project, "explain", rid, SPEC, *FAST)
    assert same.code == 0 and "same run ID, nothing differs" in same.out, same
    # The provenance stays the first run's, beside its ID.
    shown = mcx_inprocess(project, "show", rid)
    assert shown.code == 0, shown
    assert f"commit {first_commit[:12]} on main" in shown.out and "modules hashed into the run ID" in shown.out
    fp = json.loads((project / ".mcx" / "runs" / rid / "fingerprint.json").read_text())
    assert fp["code"]["info"]["commit"] == first_commit and fp["code"]["info"]["dirty"] is False


def test_an_edited_module_is_another_run_whose_reproduction_rebuilds_the_recorded_tree(tmp_path: Path) -> None:
    """A project that holds mcx itself (mcx's own developers): the control plane and the worker import the
    project's mcx (PYTHONPATH), as with an editable install."""
    project = make_e2e_project(tmp_path / "project")
    shutil.copytree(Path(mcx.__file__).parent, project / "mcx", ignore=shutil.ignore_patterns("__pycache__"))
    commit(project, "mcx, vendored")
    env = e2e_env(PYTHONPATH=str(project))
    trained = mcx_subprocess(project, "run", SPEC, *RUN, "--json", "--quiet", env=env)
    assert trained.code == 0, trained
    rid, recorded_commit = trained.json()["run_id"], git_head(project)
    fp = json.loads((project / ".mcx" / "runs" / rid / "fingerprint.json").read_text())
    assert fp["code"]["info"]["mcx_root"] == str((project / "mcx").resolve())

    loop = project / "mcx" / "train" / "loop.py"
    loop.write_text(loop.read_text(encoding="utf-8") + "\n# a change that does not alter training\n", encoding="utf-8")
    commit(project, "moved on")
    planned = mcx_subprocess(project, "plan", SPEC, *FAST, "--json", env=env)
    assert planned.code == 0 and planned.json()["run_id"] != rid, planned
    why = mcx_subprocess(project, "explain", rid, SPEC, *FAST, "--json", env=env)
    assert why.code == 0, why
    diff = json.loads(why.out)
    assert [c["component"] for c in diff["components"]] == ["code"]
    assert [c["key"] for c in diff["components"][0]["changes"]] == ["modules.mcx/train/loop.py"]

    res = mcx_subprocess(project, "reproduce", rid, "--json", env=env)
    assert res.code == 0, res
    v = json.loads(res.out.strip().splitlines()[-1])
    assert v["verdict"] == "bitwise" and v["status"] == "finished", v
    assert v["code"]["rebuilt"] is True and v["code"]["commit"] == recorded_commit and v["code"]["drift"] == []
    assert not Path(v["code"]["worktree"]).exists()
    rerun = json.loads((Path(v["reproduction_dir"]) / "fingerprint.json").read_text())  # its worker's mcx: the tree's
    assert rerun["code"]["info"]["mcx_root"] == str(Path(v["code"]["worktree"]).resolve() / "mcx")
    assert rerun["code"]["id"] == fp["code"]["id"]
