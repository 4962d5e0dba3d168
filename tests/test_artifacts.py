"""Damaged artifacts are named where they are used (D48), against the real engines: one CPU run of the
quickstart shared as a team shares it (test_share's clones, bare origin and local-directory DVC remote).

- a checkpoint object damaged on the DVC remote: `mcx pull` in a second clone names the file, removes it,
  exits 2; once the remote is mended the same command fetches the intact bytes;
- a checkpoint damaged before `dvc add` (its DVC record holds the damage): `mcx pull` names it by its checksums;
- a checkpoint cut short here: a child's plan (`init.from = "run:..."`), `export-hf` and `mcx pull` name it
  (exit 2, nothing written), and the fix they give (remove it, `mcx pull`) brings back the recorded bytes;
- one flipped byte, its size kept: the child's plan passes (it reads no weights), `mcx run` of the child and
  `export-hf` check every CRC-32 and refuse it before anything is written;
- a run record cut short or replaced by `[]`: `show` and `compare` exit 2 naming it, `ls` lists it as damaged
  beside the intact runs; running its spec again writes it anew.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from conftest import mcx_inprocess, mcx_subprocess
from test_e2e import FAST, SPEC
# test_share's module fixtures, imported so that this module trains and shares its own run (one per module)
from test_share import ckpt, clone, dvc, run, rid, shared, team, workspace  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("e2e_clean_env")]


def digests(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def said(res) -> str:
    """stderr as one line (rich wraps nothing off a terminal, but a paragraph may still hold newlines)."""
    assert res.err.startswith("mcx: error: ") and "Traceback" not in res.err, res
    return " ".join(res.err.split())


def flip_last_byte(path: Path) -> bytes:
    """Flip the last byte of ``path`` in place (its size kept); returns the bytes it held."""
    good = path.read_bytes()
    os.chmod(path, 0o644)  # DVC's objects are read-only
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 0x01]))
    return good


def child(rid: str) -> list[str]:
    return ["--set", f'init.from="run:{rid}"', "--set", "train.lr_warmup_iters=0"]


def runs_here(project: Path) -> list[str]:
    return sorted(p.name for p in (project / ".mcx" / "runs").iterdir())


def test_running_the_spec_again_writes_a_damaged_run_record_anew(team, run, rid):
    """The fix `mcx show` gives: the finished stages are reused, nothing is trained again. First in this module:
    the same code is the same commit, before the shared run's pointers are committed."""
    first = team.first
    record = first / ".mcx" / "runs" / rid / "run.json"
    record.write_text("[]\n")
    assert mcx_inprocess(first, "show", rid).code == 2
    res = mcx_subprocess(first, "run", SPEC, *FAST, "--json")
    assert res.code == 0 and res.json()["run_id"] == rid, res
    assert "already finished" in res.err and "reusing it" in res.err, res.err[-2000:]
    shown = mcx_inprocess(first, "show", rid, "--json")
    assert shown.code == 0 and shown.json()["status"] == "finished", shown


def test_a_checkpoint_object_damaged_on_the_remote_is_named_removed_and_pulled_again_once_mended(shared, rid):
    """DVC pulls a remote's damaged object without a word (the issue: exit 0, "fetched"); `mcx pull` compares
    each fetched file with the DVC record and the checkpoint's checksums.json."""
    full = ckpt(shared.first, rid, "full")
    rel = full.relative_to(shared.first).as_posix()
    md5 = hashlib.md5((full / "state.pt").read_bytes()).hexdigest()
    obj = shared.shared / "files" / "md5" / md5[:2] / md5[2:]
    good = flip_last_byte(obj)
    second = clone(shared, "damaged-checkpoint")
    try:
        res = mcx_subprocess(second, "pull", rid)
        assert res.code == 2, res
        text = said(res)
        assert f"1 file pulled from DVC remote 'team' for {rel} differs from the recorded md5 ({rel}/state.pt)" \
               in text, text
        assert f"then `mcx pull {rid}` here" in text, text
        assert not (second / rel / "state.pt").exists()
        assert not list((second / ".dvc" / "cache").rglob(md5[2:]))
    finally:
        obj.write_bytes(good)
    res = mcx_subprocess(second, "pull", rid)  # the remote mended: the fix the error gave
    assert res.code == 0, res
    assert digests(second / rel) == digests(full)


def test_a_checkpoint_damaged_before_dvc_add_is_named_by_its_checksums_on_pull(shared, rid):
    """Its files match their DVC record (DVC hashed the damage), so only its checksums.json tells: `mcx pull`
    names and removes the damaged file, and says every copy of that version is damaged."""
    rel = ckpt(shared.first, rid, "full").relative_to(shared.first).as_posix()
    pointer = f".mcx/checkpoints/{rid}/full.dvc"
    maker = clone(shared, "damaged-before-add")
    assert mcx_subprocess(maker, "pull", rid).code == 0
    flip_last_byte(maker / rel / "state.pt")
    for args in (["commit", "-f", pointer], ["push", pointer]):  # the damage recorded and pushed, as DVC would
        done = dvc(maker, *args)
        assert done.returncode == 0, done.stderr
    user = clone(shared, "pulls-damaged-version")
    shutil.copyfile(maker / pointer, user / pointer)  # the pointer as a `git pull` of the maker's commit brings it
    res = mcx_subprocess(user, "pull", rid)
    assert res.code == 2, res
    text = said(res)
    assert f"the full stage checkpoint pulled for run {rid} ({rel}) matches its DVC record but not its own " \
           f"checksums.json (state.pt: crc32 " in text, text
    assert "so every copy of this version is" in text and "`mcx run SPEC --force`" in text, text
    assert not (user / rel / "state.pt").exists() and (user / rel / "meta.json").is_file()


def test_a_truncated_checkpoint_is_named_by_a_childs_plan_export_hf_and_pull_and_mended_by_pull(shared, rid):
    """The issue: export-hf died in torch with exit 1, pull blamed the remote and advised a --force it does
    not have, and the child's plan passed."""
    first = shared.first
    full = ckpt(first, rid, "full")
    rel = full.relative_to(first).as_posix()
    intact = digests(full)
    state = full / "state.pt"
    size = state.stat().st_size
    with open(state, "r+b") as f:
        f.truncate(size // 2)
    problem = f"state.pt: {size // 2} B, expected {size} B"
    fix = f"remove it (rm -r {rel}), then `mcx pull {rid}` fetches the recorded version from DVC"

    plan = mcx_inprocess(first, "plan", SPEC, *child(rid))
    assert plan.code == 2 and plan.out == "", plan
    assert f"init.from: run {rid}'s checkpoint {rel} is damaged: {problem}" in said(plan) and fix in said(plan)

    export = mcx_inprocess(first, "export-hf", rid, "-o", "hf/tiny")
    assert export.code == 2 and export.out == "", export
    assert f"export-hf: run {rid}'s checkpoint {rel} is damaged: {problem}" in said(export)
    assert fix in said(export) and not (first / "hf").exists()

    before = workspace(first)
    pull = mcx_subprocess(first, "pull", rid)
    assert pull.code == 2 and pull.out == "", pull
    text = said(pull)
    assert f"full stage: run {rid}'s checkpoint {rel} is damaged: {problem}" in text and fix in text, text
    assert "--force" not in text and "does not hold version" not in text
    assert workspace(first) == before

    shutil.rmtree(full)  # the fix, as given
    mended = mcx_subprocess(first, "pull", rid)
    assert mended.code == 0, mended
    assert digests(full) == intact
    assert mcx_inprocess(first, "plan", SPEC, *child(rid)).code == 0


def test_a_flipped_byte_passes_the_childs_plan_and_stops_its_run_and_export_hf(shared, rid):
    """The plan checks sizes only (no weights read); what reads the weights checks every CRC-32 first."""
    first = shared.first
    full = ckpt(first, rid, "full")
    rel = full.relative_to(first).as_posix()
    good = flip_last_byte(full / "state.pt")
    try:
        assert mcx_inprocess(first, "plan", SPEC, *child(rid)).code == 0
        runs = runs_here(first)
        for verb, args, key in (("run", [SPEC, *FAST, *child(rid)], "init.from"),
                                ("export-hf", [rid, "-o", "hf/tiny"], "export-hf")):
            res = mcx_subprocess(first, verb, *args)
            assert res.code == 2, res
            text = said(res)
            assert f"{key}: run {rid}'s checkpoint {rel} is damaged: state.pt: crc32 " in text, text
            assert f"at the recorded size of {len(good)} B" in text and f"rm -r {rel}" in text, text
            assert runs_here(first) == runs and not (first / "hf").exists()
    finally:
        (full / "state.pt").write_bytes(good)


@pytest.mark.parametrize("damage", ["truncated", "array"])
def test_a_damaged_run_record_is_named_by_show_and_compare_and_marked_by_ls(shared, rid, damage):
    """The issue: show called the finished run "interrupted", ls showed "-", compare of `[]` exited 0."""
    project = clone(shared, f"records-{damage}")
    other = "0123456789ab"
    for name in (rid, other):  # the run's records (its checkpoints stay in the first clone)
        shutil.copytree(shared.first / ".mcx" / "runs" / rid, project / ".mcx" / "runs" / name,
                        ignore=shutil.ignore_patterns("checkpoints", "lock"))
    record = project / ".mcx" / "runs" / other / "run.json"
    text = record.read_text()
    record.write_text(text[: len(text) // 2] if damage == "truncated" else "[]\n")
    what = f"run.json: {len(text) // 2} B that are not JSON" if damage == "truncated" else \
        "run.json: a JSON array, not an object"

    ls = mcx_subprocess(project, "ls")
    assert ls.code == 0, ls
    rows = {line.split("\t")[0]: line.split("\t") for line in ls.out.splitlines()[1:]}
    assert rows[rid][2] == "finished" and rows[other][2] == "damaged", ls.out
    assert f"run {other}: its record is damaged ({what}" in " ".join(ls.err.split()), ls.err

    for args in (["show", other], ["compare", rid, other]):
        res = mcx_inprocess(project, *args)
        assert res.code == 2 and res.out == "", res
        line = said(res)
        assert f"run {other}'s record in .mcx/runs/{other}/ is damaged: {what}" in line, line
        assert "`mcx run SPEC`" in line and f"rm -r .mcx/runs/{other}" in line, line
    assert mcx_inprocess(project, "show", rid).code == 0
