"""Paths a command writes to (`compare -o`, `import -o`, `tune -o`, `data prepare --out`): checked before
any work, so a bad one is bad input (exit 2) that names the path and the fix, with nothing written.

The checks write nothing themselves (no probe file): the place must exist, be a directory, be writable
by its permissions, and not be on a read-only mount or a pseudo file system such as /proc. A write
that fails anyway (a full disk) is turned into the same kind of error by ``write_text``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from mcx.errors import InputError

# File systems that hold no user files: writing there fails or means something else.
PSEUDO_FS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs",
                       "pstore", "bpf", "efivarfs", "fusectl", "binfmt_misc", "devpts", "mqueue", "autofs"})


def _mount(path: Path) -> tuple[str, str, set[str]] | None:
    """(mount point, file system type, mount options) of the mount holding ``path``; None if unknown."""
    best: tuple[str, str, set[str]] | None = None
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    target = str(path)
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 6 or len(rest) < 1:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, rest[0], set(fields[5].split(",")))
    return best


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _refuse(flag: str, value: str, what: str, fix: str) -> InputError:
    return InputError(f"{flag} {value}: {what};", f"{fix}. Nothing was written.")


def _place(base: Path, flag: str, value: str) -> None:
    """``base`` (an existing directory) can take new files: permissions, read-only and pseudo mounts."""
    mount = _mount(base.resolve())
    if mount is not None and mount[1] in PSEUDO_FS:
        raise _refuse(flag, value, f"{base} is on the {mount[1]} file system ({mount[0]}), which holds no files "
                      "mcx can write", "choose a path in a normal directory, e.g. in the project")
    if mount is not None and "ro" in mount[2]:
        raise _refuse(flag, value, f"{base} is on a read-only mount ({mount[0]})", "choose a writable directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise _refuse(flag, value, f"{base} is not writable by this user", "choose a writable directory or fix its "
                      "permissions")


def _takes_text(path: Path) -> bool:
    """An existing path text can be written to: not a device, except /dev/null and terminals (/dev/full
    and disks fail or do harm only once the work is done)."""
    st = path.stat()
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        return True
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.stat(os.devnull).st_rdev:
        return True
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        return os.isatty(fd)
    finally:
        os.close(fd)


def check_output_file(value: str, flag: str) -> Path:
    """A file mcx will create or replace at ``value``: its directory must exist and take files."""
    if not value or "\x00" in value:
        raise _refuse(flag, repr(value), "not a file path", "give a file path, e.g. " + flag + " report.html")
    path = Path(value)
    try:
        if path.is_dir():
            raise _refuse(flag, value, "is a directory", f"give a file path inside it, e.g. {flag} {path / 'NAME'}")
        parent = path.absolute().parent
        if not parent.exists():
            _place(_existing_ancestor(parent), flag, value)  # /proc/x/r.html: /proc is the problem, not x
            raise _refuse(flag, value, f"directory {parent} does not exist", f"create it (mkdir -p {parent}) or "
                          "choose another path")
        if not parent.is_dir():
            raise _refuse(flag, value, f"{parent} is not a directory", "choose a path in a directory")
    except OSError as exc:  # a name too long, a loop of links...
        raise _refuse(flag, value[:80], f"cannot be used ({exc.strerror or exc})", "choose another path") from None
    _place(parent, flag, value)
    if path.exists() and not os.access(path, os.W_OK):
        raise _refuse(flag, value, "exists and is not writable", "choose another path or fix its permissions")
    try:
        takes_text = not path.exists() or _takes_text(path)
    except OSError as exc:
        raise _refuse(flag, value, f"cannot be opened ({exc.strerror or exc})", "choose another path") from None
    if not takes_text:
        raise _refuse(flag, value, "is a device, which takes no report (of devices, only /dev/null and terminals "
                      "do)", "choose a file path")
    return path


def check_output_dir(value: str, flag: str, base: Path | None = None) -> Path:
    """A directory mcx will create (with its parents) or fill at ``value`` (relative to ``base``)."""
    if not value or "\x00" in value:
        raise _refuse(flag, repr(value), "not a directory path", f"give a directory, e.g. {flag} datasets/mine")
    path = Path(value) if base is None or Path(value).is_absolute() else base / value
    try:
        probe = path.absolute()
        while not probe.exists() and probe != probe.parent:
            if probe.is_symlink():  # a dangling link: the directory cannot be made there
                raise _refuse(flag, value, f"{probe} is a broken symbolic link", "remove it or choose another path")
            probe = probe.parent
        if not probe.is_dir():
            what = "is a file, not a directory" if probe == path.absolute() else f"would be made inside {probe}, " \
                   "which is a file"
            raise _refuse(flag, value, what, "choose a directory path")
    except OSError as exc:
        raise _refuse(flag, value[:80], f"cannot be used ({exc.strerror or exc})", "choose another path") from None
    _place(probe, flag, value)
    return path


def write_text(path: Path, text: str, flag: str) -> None:
    """``text`` into ``path`` whole or not at all (a temporary file beside it, then renamed)."""
    tmp = path.with_name(f".{path.name}.mcx-tmp")
    try:
        if path.exists() and not path.is_file():  # /dev/null, a FIFO: written in place, never replaced
            path.write_text(text, encoding="utf-8")
            return
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise _refuse(flag, str(path), f"cannot be written ({exc.strerror or exc})",
                      "choose another path, or free space or fix permissions there") from None
