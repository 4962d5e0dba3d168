"""Does a DVC remote hold a version? Every object of it is looked for on the remote itself.

``dvc status --cloud`` is not enough before a local copy is deleted: once a directory's ``.dir``
manifest is on the remote, DVC takes its files to be there too (measured: a checkpoint whose 22 MB
weight file was taken off the remote still showed as in sync). Here the manifest is read from the
remote and each file object it names is looked up there.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from mcx.errors import McxError


class RemoteCheck:
    """Answers "does DVC remote R hold version M?"; the repository is opened once, at the first question."""

    def __init__(self, project_root: Path) -> None:
        self.project_root = Path(project_root)
        self._stack = ExitStack()
        self._repo: Any = None
        self._error: str | None = None

    def lacks(self, remote: str, md5: str) -> str | None:
        """None when ``remote`` holds every object of ``md5``; else what it lacks, or why it cannot be asked."""
        repo = self._open()
        if repo is None:
            return self._error
        try:
            odb = repo.cloud.get_remote_odb(remote, hash_name="md5")
            return _lacks(odb, md5, remote)
        except Exception as exc:  # noqa: BLE001 - a remote that cannot be read is not known to hold anything
            return f"the DVC remote {remote!r} cannot be read ({type(exc).__name__}: {exc})"

    def _open(self) -> Any:
        if self._repo is None and self._error is None:
            from mcx.track.dvc_store import _repo, _root

            try:
                self._repo = self._stack.enter_context(_repo(_root(self.project_root), git_view=False))
            except McxError as exc:
                self._error = f"DVC cannot be asked ({exc.message})"
        return self._repo

    def close(self) -> None:
        self._stack.close()
        self._repo = None

    def __enter__(self) -> RemoteCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lacks(odb: Any, md5: str, remote: str) -> str | None:
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree

    oids = [md5]
    if md5.endswith(".dir"):
        try:
            tree = Tree.load(odb, HashInfo("md5", md5))
        except (OSError, ValueError):
            return f"the DVC remote {remote!r} lacks the directory manifest {md5}"
        oids += [hi.value for _, _, hi in tree]
    present = set(odb.oids_exist(oids))
    absent = [o for o in oids if o not in present]
    if absent:
        return f"the DVC remote {remote!r} lacks {len(absent)} of the {len(oids)} objects of {md5}"
    return None
