"""The files a run uploads, staged as redacted copies under ``<run_dir>/track/artifacts/``.

What is uploaded is exactly what was staged: the copy is made when the record is journaled, so a
replay days later (``mcx sync``) sends the same bytes even if the originals changed or vanished,
and the redaction is applied once, to the copy. Text (anything that decodes as UTF-8, JSON
structurally) goes through mcx.track.redact; other files (images) are copied as they are.

The parent run's artifacts:

    spec.toml           the resolved spec
    fingerprint.json    the fingerprint record (without the patch, which is code.patch)
    code.patch          the uncommitted change the run trained with (``git apply`` restores it)
    lockfile/<name>.txt the lockfile the environment component names
    environment.json    python, platform, host, package versions, training-relevant environment
    plan.json           the plan
    smoke/result.json   the smoke report
    checkpoints/<stage>.dvc  DVC pointers of the tracked checkpoints
    run.json, plots/    at the end of the run
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from mcx.jsonfile import write_bytes_atomic
from mcx.track import paths
from mcx.track.mlflow_records import environment_report
from mcx.track.redact import redact, redact_text

ARTIFACTS = "artifacts"


class Stager:
    """Makes upload copies inside ``<run_dir>/track/artifacts``; returns paths relative to run_dir."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / paths.TRACK_DIR / ARTIFACTS

    def _out(self, dest: str) -> Path:
        out = self.root / dest
        out.parent.mkdir(parents=True, exist_ok=True)
        return out

    def _rel(self, out: Path) -> str:
        return out.relative_to(self.run_dir).as_posix()

    # Copies are written whole (renamed into place): an `mcx sync` may upload one while the run rewrites it.
    def json(self, dest: str, data: Any) -> str:
        out = self._out(dest)
        text = json.dumps(redact(data), indent=1, sort_keys=True, default=str) + "\n"
        write_bytes_atomic(out, text.encode("utf-8"))
        return self._rel(out)

    def data(self, dest: str, raw: bytes) -> str:
        """Text bytes, redacted (undecodable bytes pass through unchanged)."""
        out = self._out(dest)
        text = raw.decode("utf-8", "surrogateescape")
        write_bytes_atomic(out, redact_text(text).encode("utf-8", "surrogateescape"))
        return self._rel(out)

    def file(self, dest: str, src: Path) -> str:
        raw = Path(src).read_bytes()
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:  # binary (a PNG plot): nothing in it reads as a secret
            out = self._out(dest)
            write_bytes_atomic(out, raw)
            return self._rel(out)
        return self.data(dest, raw)


def lockfile_path(project_root: Path, fingerprint: dict[str, Any]) -> Path | None:
    """``lockfiles/<name>.txt`` named by the fingerprint's environment component, if it exists."""
    name = ((fingerprint.get("environment") or {}).get("info") or {}).get("lockfile")
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        return None
    path = Path(project_root) / "lockfiles" / f"{name}.txt"
    return path if path.is_file() else None


def run_artifacts(stager: Stager, project_root: Path) -> list[tuple[str, str | None]]:
    """Stage the parent run's start artifacts; ``(file relative to run_dir, artifact dir)`` pairs."""
    run_dir = stager.run_dir
    out: list[tuple[str, str | None]] = []
    if (run_dir / "spec.toml").is_file():
        out.append((stager.file("run/spec.toml", run_dir / "spec.toml"), None))
    fp = paths.read_json(run_dir / "fingerprint.json")
    if isinstance(fp, dict):
        side = dict(fp.get("side") or {})
        patch = side.pop("patch", None)
        encoding = side.pop("patch_encoding", "utf-8")
        out.append((stager.json("run/fingerprint.json", {**fp, "side": side}), None))
        if patch:
            raw = base64.b64decode(patch) if encoding == "base64" else patch.encode("utf-8")
            out.append((stager.data("run/code.patch", raw), None))
        lockfile = lockfile_path(project_root, fp)
        if lockfile is not None:
            out.append((stager.file(f"run/lockfile/{lockfile.name}", lockfile), "lockfile"))
    report = environment_report(fp if isinstance(fp, dict) else None)
    out.append((stager.json("run/environment.json", report), None))
    plan = paths.read_json(run_dir / "plan.json")
    if plan is not None:
        out.append((stager.json("run/plan.json", plan), None))
    return out


def end_artifacts(stager: Stager) -> list[tuple[str, str | None]]:
    """Stage run.json and every file under plots/ (kept in its folder layout)."""
    run_dir = stager.run_dir
    out: list[tuple[str, str | None]] = []
    run_json = paths.read_json(run_dir / "run.json")
    if run_json is not None:
        out.append((stager.json("run/run.json", run_json), None))
    plots = run_dir / "plots"
    if plots.is_dir():
        for f in sorted(p for p in plots.rglob("*") if p.is_file()):
            rel = f.relative_to(plots)
            dest = Path("plots", rel.parent).as_posix()
            out.append((stager.file(f"run/plots/{rel.as_posix()}", f), dest))
    return out
