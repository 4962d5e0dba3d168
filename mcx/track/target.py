"""Which MLflow store a project records to, and the client that talks to it.

The URI comes from ``[tracking] uri``, else ``$MLFLOW_TRACKING_URI``, else the embedded store: a
SQLite database at ``<project>/.mcx/mlflow.db`` with artifacts under ``<project>/.mcx/mlartifacts``.
Credentials come only from the environment (``MLFLOW_TRACKING_USERNAME``/``PASSWORD``/``TOKEN``,
read by MLflow itself); a URI holding ``user:pass@`` is refused, so no secret is ever stored.

The client is made with short network limits (no retries, and ``MLFLOW_HTTP_REQUEST_TIMEOUT``
10 s unless the environment sets it): mcx retries on its own
schedule from its spool, so a slow or absent server costs a background thread seconds, never the
training. MLflow's own retries are always off in mcx's process (``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` 0:
its default backoff waits minutes per request, and the spool retries anyway); a timeout the user set
is kept. A command waits on a down store once: the first request that fails marks it down for the
rest of the command (mcx.track.outage, D50).
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from attrs import frozen

from mcx.errors import EnvironmentProblem, InputError
from mcx.track import paths
from mcx.track.redact import redact_text

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

EMBEDDED = "embedded"
# Set unless the environment sets them: a short wait per request, and no usage telemetry from MLflow
# (training clusters rarely allow egress; opt in with MLFLOW_DISABLE_TELEMETRY=false).
CLIENT_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_DISABLE_TELEMETRY": "true"}
# Set always in mcx's process: MLflow's own retries (7 with exponential backoff by default, minutes per
# request) would multiply every wait, and mcx's spool is the retry (`mcx sync`); D50.
CLIENT_ENV_FIXED = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
_TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})
_TIMEOUTS = frozenset({"ReadTimeout", "ConnectTimeout", "ReadTimeoutError", "ConnectTimeoutError", "Timeout"})
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
_client_lock = threading.Lock()


@frozen
class Target:
    """A tracking store. ``name`` is what the spool records: "embedded" or the URI itself."""

    uri: str
    embedded: bool
    project_root: Path

    @property
    def name(self) -> str:
        return EMBEDDED if self.embedded else self.uri

    def artifact_location(self, experiment: str) -> str | None:
        """Per-experiment artifact root for the embedded store; None lets a server choose."""
        if not self.embedded:
            return None
        slug = _SLUG.sub("-", experiment).strip("-") or "experiment"
        return (paths.state_dir(self.project_root) / paths.EMBEDDED_ARTIFACTS / slug).resolve().as_uri()


def embedded_uri(project_root: Path) -> str:
    return "sqlite:///" + str((paths.state_dir(project_root) / paths.EMBEDDED_DB).resolve())


def check_uri(uri: str, where: str) -> str:
    uri = uri.strip()
    if not uri:
        raise InputError(f"{where} is empty", "leave it unset for the embedded store, or give a server URI.")
    parts = urlsplit(uri)
    if parts.username or parts.password:
        raise InputError(
            f"{where} holds credentials ({redact_text(uri)})",
            "remove user:password@ from the URI and set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD "
            "(or MLFLOW_TRACKING_TOKEN) in the environment instead.",
        )
    return uri


def resolve_target(project_root: Path, uri: str | None = None) -> Target:
    """``uri`` (the spec's ``[tracking] uri``), else ``$MLFLOW_TRACKING_URI``, else the embedded store."""
    root = Path(project_root).resolve()
    if uri is not None:
        return _named(root, check_uri(uri, "tracking.uri"))
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return _named(root, check_uri(env, "MLFLOW_TRACKING_URI"))
    return Target(embedded_uri(root), True, root)


def target_from_name(project_root: Path, name: str) -> Target:
    """The Target a spool recorded (``Target.name``)."""
    root = Path(project_root).resolve()
    return Target(embedded_uri(root), True, root) if name == EMBEDDED else _named(root, name)


def _named(root: Path, uri: str) -> Target:
    if uri in (EMBEDDED, embedded_uri(root)):
        return Target(embedded_uri(root), True, root)
    return Target(uri, False, root)


def open_client(target: Target) -> MlflowClient:
    """An MlflowClient for ``target`` (imports mlflow: about 4 s the first time in a process)."""
    for key, value in CLIENT_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ.update(CLIENT_ENV_FIXED)
    with _client_lock:  # mlflow's first import and its store registry are not thread-safe
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise EnvironmentProblem(f"MLflow is not importable here ({exc})",
                                     "install the tracking extra (`pip install 'mcx[track]'`, or ./dev env), then "
                                     "`mcx sync` sends the records kept in the run's journal.") from None

        if target.embedded:
            paths.state_dir(target.project_root).mkdir(parents=True, exist_ok=True)
        return MlflowClient(tracking_uri=target.uri)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` means "the store is not reachable now" (retry later) rather than "refused"."""
    for err in _chain(exc):
        mod = type(err).__module__
        if isinstance(err, (ConnectionError, TimeoutError)):
            return True
        if mod.startswith(("requests", "urllib3")):
            return True
        if mod.startswith("sqlalchemy") and type(err).__name__ in ("OperationalError", "TimeoutError"):
            return True
        status = _http_status(err)
        if status is not None and status in _TRANSIENT_HTTP:
            return True
    return False


def _http_status(err: BaseException) -> int | None:
    get = getattr(err, "get_http_status_code", None)
    if get is None:
        return None
    try:
        return int(get())
    except (TypeError, ValueError):
        return None


def outage_reason(exc: BaseException) -> str:
    """Why the store could not be reached, in a few words (never MlflowException's whole text)."""
    import socket

    chain = _chain(exc)
    for err in chain:  # the network's own errors first: MlflowException wraps them as HTTP 500
        if isinstance(err, ConnectionRefusedError):
            return "connection refused"
        if isinstance(err, socket.gaierror):
            return "its host name does not resolve"
        if isinstance(err, TimeoutError) or type(err).__name__ in _TIMEOUTS:
            return f"no answer within {os.environ.get('MLFLOW_HTTP_REQUEST_TIMEOUT', '120')} s"
        if type(err).__module__.startswith("sqlalchemy"):
            return "its database is locked or unreadable"
    for err in reversed(chain):  # the innermost cause says most: "[Errno 113] No route to host"
        if isinstance(err, OSError) and err.strerror:
            return err.strerror[0].lower() + err.strerror[1:]
    for err in chain:
        status = _http_status(err)
        if status is not None and status in _TRANSIENT_HTTP:
            return f"it answered HTTP {status}"
    return describe_error(exc)


def unreachable_hint(target: str) -> str:
    """The fix for records left spooled because ``target`` (Target.name) could not be reached."""
    if target == EMBEDDED:
        return "run `mcx sync` again once .mcx/mlflow.db is not locked by another process."
    return ("start the server (or check the URI), then run `mcx sync` again, or send them to another server "
            "with `mcx sync --to URI`.")


def describe_error(exc: BaseException) -> str:
    """One redacted line for reports and logs."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return redact_text(f"{type(exc).__name__}: {text}")[:500]
