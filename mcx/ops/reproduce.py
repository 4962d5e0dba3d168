"""`mcx reproduce RUN_ID`: restore code, environment check, data and config; rerun; give a verdict.

Code: the run ID holds mcx's modules by content (mcx.fingerprint.code). Where the modules the worker would
import here are the recorded ones, the rerun runs here, whatever the project's commit. Where they are not
(or the data must be restored), the tree is rebuilt from the code's provenance: a git worktree at the
recorded commit with the recorded patch applied, and the worker runs from there (PYTHONPATH), so a
project that holds mcx reruns the recorded mcx; any module that still differs is named. The reproduction
is its own run directory (.mcx/runs/<id>/reproductions/<n>/) and its own MLflow run, tagged with the ID it
reproduces.

Data: when the workspace's dataset is not the recorded version (missing, edited, or another
version checked out), the recorded version is restored by its DVC hash from the project's cache or
remote into the worktree, and the rerun reads it there; the workspace is never overwritten.

Bands: on the recorded hardware a correct rerun is expected to be bitwise. On other hardware or
topology the band is the spread between recorded runs that differ only in their seed
(``mcx.report.seeds``), else the spec's ``[baseline] tolerances``, else the defaults; the verdict
names its source.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import evolve

from mcx.contract.job import OUTPUTS
from mcx.errors import DataError, InputError, RunIdError
from mcx.fingerprint.code import module_changes, module_hashes, worker_package
from mcx.fingerprint.components import Component, InitComponent
from mcx.fingerprint.data import collect_data, content_identity, data_paths
from mcx.fingerprint.diff import flatten
from mcx.fingerprint.environment import collect_environment
from mcx.fingerprint.filehashes import FileHashes
from mcx.fingerprint.hardware import collect_hardware
from mcx.fingerprint.init_from import collect_init
from mcx.fingerprint.record import FingerprintRecord, load_record, patch_bytes
from mcx.metrics.batches import compare_batches, read_batches
from mcx.ops.data import tracked_outputs
from mcx.ops.progress import Note, Progress
from mcx.ops.run import run_spec, RunOptions
from mcx.ops.worktrees import CODE, PREFIX
from mcx.report.rundata import load_run_dir
from mcx.report.seeds import seed_runs
from mcx.report.reproduction import (CodeUsed, DataChange, Drift, ParentCheckpoint, Reproduction, RestoredData,
                                     SeedRef)
from mcx.report.verdict import seed_spread_band, verdict
from mcx.spec import ExperimentSpec, loads_spec
from mcx.spec.load import with_debug
from mcx.track.dvc_store import restore_into
from mcx.track.paths import check_run_id, run_dir
from mcx.track.run_summary import RunSummary
from mcx.track.runcache import acquire

if TYPE_CHECKING:
    from mcx.report.seeds import SeedRun
    from mcx.report.verdict import Band


def _record_dir(project: Path, run_id: str) -> Path:
    run_path = run_dir(project, check_run_id(run_id))
    if not (run_path / "spec.toml").is_file() or not (run_path / "fingerprint.json").is_file():
        raise RunIdError(f"unknown run ID {run_id}: no recorded run in {run_path};",
                         "list runs with `mcx ls`; a run recorded elsewhere needs its run directory here.")
    if not (run_path / "full" / "metrics.jsonl").is_file() and not (run_path / "smoke" / "metrics.jsonl").is_file():
        raise RunIdError(f"run {run_id} has no recorded metrics;", "only runs that trained can be reproduced.")
    return run_path


def _git(project: Path, *args: str, ok: bool = False) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(["git", "-C", str(project), *args], capture_output=True)
    if proc.returncode and not ok:
        raise InputError(f"git {' '.join(args[:2])} failed: {proc.stderr.decode(errors='replace').strip()};",
                         "check that the project is the git repository the run was recorded in.")
    return proc


def code_worktree(project: Path, record: FingerprintRecord, dest: Path) -> CodeUsed:
    """A worktree at the recorded commit (the code's provenance) with the recorded patch applied."""
    commit = record.code.commit
    if not commit:
        raise InputError("the run was recorded outside git (no commit), and its code or data is not the recorded "
                         "one here;", "put mcx's recorded modules or the recorded data back, or reproduce where "
                         "they are.")
    if _git(project, "cat-file", "-e", f"{commit}^{{commit}}", ok=True).returncode:
        raise InputError(f"commit {commit} of this run is not in this repository, and its code or data is not the "
                         "recorded one here;",
                         "fetch it (git fetch --all) or run reproduce in the repository where the run was made.")
    _git(project, "worktree", "add", "--detach", "--force", str(dest), commit)
    patch = patch_bytes(record)
    if patch:
        proc = subprocess.run(["git", "-C", str(dest), "apply", "--binary", "--whitespace=nowarn", "-"],
                              input=patch, capture_output=True)
        if proc.returncode:
            _git(project, "worktree", "remove", "--force", str(dest), ok=True)
            raise InputError(f"the recorded uncommitted diff does not apply to {commit}: "
                             f"{proc.stderr.decode(errors='replace').strip()};", "the record is damaged.")
    return CodeUsed(commit=commit, patched=bool(patch), worktree=str(dest), rebuilt=True)


def mcx_drift(record: FingerprintRecord, code_path: Path | None) -> list[str]:
    """The module files of the mcx the rerun's worker imports (``code_path``'s own, else the installed one)
    whose content is not the recorded one; [] when the run will execute the recorded code."""
    recorded = record.code.id
    if record.code.modules is None and code_path is not None and worker_package(code_path).parent == Path(code_path).resolve():
        return []  # recorded before D52: the rebuilt commit + patch is that record's code, mcx included
    return module_changes(recorded, {"modules": module_hashes(worker_package(code_path))})


def next_label(reps: Path) -> str:
    """The next free reproduction label: r<highest + 1>, never a deleted one's (its stages would be reused)."""
    taken = [int(p.name[1:]) for p in reps.iterdir() if re.fullmatch(r"r[0-9]+", p.name)] if reps.is_dir() else []
    return f"r{max(taken, default=0) + 1}"


def _drift(recorded: Component, now: dict[str, Any]) -> tuple[Drift, ...]:
    """Each hashed key of a component that differs between the record and what is collected here now."""
    a, b = flatten(recorded.id), flatten(now["id"])
    return tuple(Drift(key=k, recorded=a.get(k), now=b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def data_changes(project: Path, spec: ExperimentSpec, record: FingerprintRecord) -> list[DataChange]:
    """The spec's data paths that are not, here, the version the run trained on (missing, changed
    since their DVC record, or another version). Every data
    file is read: a change that kept a file's inode, mtime and size is found too."""
    recorded = record.data.paths
    changes: list[DataChange] = []
    hashes = FileHashes.for_project(project.resolve(), full=True)  # every file read: no kept hash trusted
    try:
        for name, (key, value) in data_paths(spec.data).items():
            try:
                now = content_identity(project.resolve(), value, key, [], require_data=True, hashes=hashes)["id"]
            except DataError as exc:
                changes.append(DataChange(key=key, path=value, reason=exc.message.rstrip(";")))
                continue
            if name not in recorded or now != recorded[name].id:
                was = recorded[name].value if name in recorded else None
                reason = f"{key} = {value!r} is version {now.get('value')} here; the run trained on {was}"
                changes.append(DataChange(key=key, path=value, reason=reason))
    finally:
        hashes.save()
    return changes


def restore_data(project: Path, worktree: Path, spec: ExperimentSpec, record: FingerprintRecord, run_id: str,
                 changes: list[DataChange]) -> list[RestoredData]:
    """Bring the recorded data versions back into the reproduction's worktree, by DVC hash.

    The user's workspace is left as it is (see docs/decisions.md); the rerun reads the worktree's
    copy. DataError when a version cannot be brought back or does not match the record after.
    """
    recorded = record.data.id
    paths = record.data.paths
    why = "; ".join(c.reason for c in changes)
    untracked = [key for name, (key, _) in data_paths(spec.data).items()
                 if name not in paths or paths[name].source != "dvc"]
    if untracked:
        raise DataError(f"{why}; {', '.join(untracked)} was not tracked by DVC when run {run_id} was recorded, "
                        "so its version cannot be restored by hash;",
                        "put the recorded version back (its sha256 is in the run's fingerprint.json) and run "
                        "reproduce again; `dvc add` datasets so that future runs can be restored.")
    restored: list[RestoredData] = []
    for rel, (md5, key) in tracked_outputs(project, spec.data, recorded).items():
        try:
            restore_into(project, worktree, md5=md5, path=rel, remote=spec.tracking.dvc_remote)
        except DataError as exc:
            raise DataError(f"{why}; so the recorded version must be restored, but {exc.message}", exc.hint) from None
        restored.append(RestoredData(key=key, path=rel.as_posix(), md5=md5))
    now = collect_data(spec, worktree, rehash=True)["id"]
    if now != recorded:
        raise DataError(f"{why}; the data restored into the recorded commit's worktree is {now}, not the "
                        f"recorded {recorded};", "the record and the commit's .dvc files disagree: restore the data "
                        "yourself (dvc checkout at the recorded commit) and run reproduce again.")
    return restored


def restore_parent(project: Path, spec: ExperimentSpec, record: FingerprintRecord,
                   progress: Progress) -> ParentCheckpoint | None:
    """The checkpoint a child run started from ([init] from = "run:..."), back by its content hash: fetched
    from DVC (`mcx pull`) when it is not in this project, then checked against what the child recorded.
    A model directory (hf:, megatron:) must be where the spec says, with the recorded content."""
    recorded = record.init
    if recorded is None:
        return None
    pulled = False
    try:
        now = collect_init(spec, project)
    except InputError:
        if recorded.kind != "run" or recorded.run_id is None:
            raise
        from mcx.ops.pull import pull

        parent = recorded.run_id
        progress(Note(text=f"init: the checkpoint of run {parent} is not here; fetching it from DVC"))
        pull(parent, project=project)
        pulled, now = True, collect_init(spec, project)
    assert now is not None  # the run's own spec names the source its record holds
    here = InitComponent(id=now["id"], info=now["info"])
    if here.id != recorded.id:
        what = f"run {recorded.run_id}'s checkpoint" if recorded.kind == "run" else spec.init.source
        raise InputError(f"init.from: {what} is not the one this run started from (content "
                         f"{str(here.content)[:12]}, recorded {str(recorded.content)[:12]});",
                         "restore the recorded source (`mcx pull PARENT` for a run), or reproduce the parent first.")
    return ParentCheckpoint(id=recorded.id, path=here.path, pulled=pulled)


def reproduce(run_id: str, *, project: Path, output: str, progress: Progress,
              debug: tuple[str, ...] = ()) -> Reproduction:
    """Rerun ``run_id`` and judge it. ``debug``: ``debug.KEY=VALUE`` items, a fault injected into the rerun
    (docs/spec.md, [debug]): the verdict must then find the departure it causes."""

    run_path = _record_dir(project, run_id)
    record = load_record(project, run_id)
    spec = loads_spec((run_path / "spec.toml").read_text(encoding="utf-8"), str(run_path / "spec.toml"))
    if debug:
        spec = with_debug(spec, debug, str(run_path / "spec.toml"))
        progress(Note(level="warning", text="fault injection: " + ", ".join(debug) + " (the rerun must depart there)"))
    env_drift = _drift(record.environment, collect_environment(project, record.environment.lockfile,
                                                                    spec.launch.container))
    hw_drift = _drift(record.hardware, collect_hardware(spec))
    changes = data_changes(project, spec, record)
    parent = restore_parent(project, spec, record, progress)
    for drift in env_drift:
        progress(Note(level="warning", text=f"environment drift: {drift.key}: recorded {drift.recorded}, "
                                            f"now {drift.now}"))
    for drift in hw_drift:
        progress(Note(level="warning", text=f"hardware differs: {drift.key}: recorded {drift.recorded}, "
                                            f"now {drift.now}"))
    # The band a rerun is held to where bitwise is not expected (other hardware or topology): the
    # spread between recorded seeds, else the spec's tolerances, else the default.
    band_source: str = "default"
    tolerances: Mapping[str, float | Band] | None = None
    seeds: list[SeedRun] = []
    if hw_drift:
        seeds = seed_runs(project, run_id)
        if len(seeds) >= 2:
            band_source, tolerances = "seed spread", seed_spread_band([s.data.curves for s in seeds])
            progress(Note(text="band: the seed spread of " + ", ".join(f"{s.run_id} (seed {s.seed})" for s in seeds)))
        elif spec.baseline.tolerances:
            band_source, tolerances = "spec tolerances", dict(spec.baseline.tolerances)
        if band_source != "seed spread":
            progress(Note(level="warning", text=f"band: {band_source}; no run of this config with another seed is "
                          "recorded (record some on the original hardware with `mcx run SPEC --set train.seed=N` to "
                          "judge by the seed spread)"))
    reps = run_path / "reproductions"
    original = load_run_dir(run_path)
    stages = list(original.stages) or ["full"]
    options = RunOptions(stage="all" if stages == ["smoke", "full"] else stages[0], skip_smoke="smoke" not in stages,
                         yes=True, output=next((o for o in OUTPUTS if o == output), "quiet"), verify_data=True)
    restored: list[RestoredData] = []
    # The code is rebuilt from its provenance (commit + patch) only where mcx's modules here are not the recorded
    # ones, or where the data must be restored (the recorded commit's .dvc files identify it); else it runs here.
    rebuild = bool(changes) or bool(mcx_drift(record, None))
    # The lock, held while the worktree lives, tells `mcx gc` that the worktree is in use.
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{run_id}-") as tmp, acquire(Path(tmp)):
        code = code_worktree(project, record, Path(tmp) / CODE) if rebuild else CodeUsed(
            commit=record.code.commit, patched=False, worktree=None, rebuilt=False)
        worktree = Path(code.worktree) if code.worktree else None
        try:
            if changes and worktree is not None:  # before a label is taken: data that cannot be restored leaves nothing behind
                restored = restore_data(project, worktree, spec, record, run_id, changes)
                for c in changes:
                    progress(Note(level="warning", text=f"data: {c.reason}"))
                progress(Note(level="warning", text="data: restored " + ", ".join(f"{r.path} {r.md5}" for r in restored)
                              + " by hash into the reproduction's worktree; the workspace's copy is left as it is"))
            code = evolve(code, drift=tuple(mcx_drift(record, worktree)))
            if code.drift:
                progress(Note(level="warning", text="mcx's modules differ from the recorded ones (the rerun runs the "
                              f"mcx at {worker_package(worktree)}): " + ", ".join(code.drift)))
            reps.mkdir(exist_ok=True)
            # The next free label: counting directories would reuse a label after one is deleted, and
            # run_spec would then take that reproduction's finished stages for a rerun.
            label = next_label(reps)
            rep_dir = reps / label
            where = (f" at commit {(code.commit or '')[:12]}{' + recorded diff' if code.patched else ''}" if rebuild
                     else " with this project's mcx (its modules are the recorded ones)")
            progress(Note(lead=f"reproducing {run_id}", text=f"{where} -> {rep_dir}"))
            rerun_result = run_spec(spec, project=project, options=options, progress=progress, run_dir=rep_dir,
                                    reproduces=run_id, reproduction=label, code_path=worktree,
                                    data_root=worktree if changes else None)
            for note in rerun_result.notes:  # the rerun's notes are the reproduction's progress
                progress(note)
            summary = rerun_result.summary
            assert isinstance(summary, RunSummary)  # a rerun trains: never a dry run
        finally:
            if worktree is not None:
                _git(project, "worktree", "remove", "--force", str(worktree), ok=True)
    rerun = load_run_dir(rep_dir)
    main = "full" if "full" in original.stages else stages[0]  # the stage whose curves the verdict compares
    batches = compare_batches(read_batches(run_path / main), read_batches(rep_dir / main))
    v = verdict(original.curves, rerun.curves, tolerances=tolerances, band_source=band_source, batches=batches)
    out = Reproduction(run_id=run_id, reproduction=label, reproduction_dir=str(rep_dir),
                       mlflow_run=summary.tracking.mlflow_run if summary.tracking else None, verdict=v,
                       status=summary.status, code=code, environment_drift=env_drift, hardware_drift=hw_drift,
                       data_changes=tuple(changes), data_restored=tuple(restored), parent=parent,
                       seed_runs=tuple(SeedRef(s.run_id, s.seed) for s in seeds) if band_source == "seed spread" else (),
                       debug=debug)
    (rep_dir / "verdict.json").write_text(json.dumps(out.to_dict(), indent=1, sort_keys=True, default=str),
                                          encoding="utf-8")
    return out  # the verdict is the result: the CLI prints it on stdout (mcx.report.run_view.render_verdict)
