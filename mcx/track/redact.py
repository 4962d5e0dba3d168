"""The one redaction function: nothing that looks like a secret leaves this machine in a record.

Everything mcx.track sends to MLflow (params, tags, artifact files, error messages it logs or
reports) passes through :func:`redact` first. What counts as a secret:

- a value under a secret-looking *name* (a dict key, an environment variable, ``NAME=value`` or
  ``"name": "value"`` inside text): a name whose words include token, secret, password, passwd,
  pass, passphrase, credential(s), key(s), apikey, or that ends in token/secret/password/apikey
  (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``wandbApiKey``; not ``tokenizer`` or ``tokens_per_s``);
- the user-info part of a URI (``https://user:pass@host`` -> ``https://***@host``);
- strings shaped like well-known access tokens (GitHub, Hugging Face, OpenAI-style, AWS key IDs,
  Slack, GitLab, ``Bearer ...``);
- the current value of any secret-named environment variable, wherever it appears (6+ characters).
"""

from __future__ import annotations

import os
import re
from typing import Any

REDACTED = "***"

_SECRET_WORDS = frozenset({
    "token", "secret", "secrets", "password", "passwords", "passwd", "pass", "passphrase",
    "credential", "credentials", "key", "keys", "apikey", "privatekey", "accesskey", "secretkey",
})
_SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "apikey", "credential", "credentials")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

# scheme://userinfo@ ; userinfo has no '/', '@' or whitespace.
_URI_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s'\"]+)@")
# NAME = value, NAME: value, "name": "value", --name=value (value up to whitespace, quote, comma, ;).
_ASSIGNMENT = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)(?P<q1>[\"']?)(?P<sep>\s*[:=]\s*)(?P<q2>[\"']?)(?P<value>[^\s\"',;}\]]+)"
)
_TOKEN_SHAPES = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}"
    r"|sk-[A-Za-z0-9_\-]{20,}|AKIA[0-9A-Z]{16}|xox[abposr]-[A-Za-z0-9\-]{10,}|glpat-[A-Za-z0-9_\-]{20,})\b"
    r"|(?i:\bbearer\s+)[A-Za-z0-9._~+/\-]{8,}=*"
)
_MIN_ENV_SECRET_LEN = 6


def is_secret_name(name: str) -> bool:
    """Whether a variable or key called ``name`` holds a secret (see the module docstring)."""
    words = [w.lower() for w in _WORD_SPLIT.split(name) if w]
    if any(w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) for w in words):
        return True
    # camelCase runs already split; also catch e.g. "APIKEY" spelled as one upper-case word.
    joined = "".join(words)
    return joined.endswith(_SECRET_SUFFIXES)


def _env_secrets() -> list[str]:
    values = {v for k, v in os.environ.items() if len(v) >= _MIN_ENV_SECRET_LEN and is_secret_name(k)}
    return sorted(values, key=len, reverse=True)  # longest first: a secret containing another


def _assignment(m: re.Match[str]) -> str:
    if not is_secret_name(m["name"]) or m["value"] == REDACTED:
        return m[0]
    return f"{m['name']}{m['q1']}{m['sep']}{m['q2']}{REDACTED}"


def redact_text(text: str, env_secrets: list[str] | None = None) -> str:
    """``text`` with every secret-looking part replaced by ``***``."""
    for secret in _env_secrets() if env_secrets is None else env_secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _URI_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    text = _TOKEN_SHAPES.sub(REDACTED, text)
    return _ASSIGNMENT.sub(_assignment, text)


def redact(value: Any, *, name: str | None = None, _env: list[str] | None = None) -> Any:
    """A copy of ``value`` (str, number, dict, list, tuple, None) with secrets replaced by ``***``.

    ``name`` is the key ``value`` is stored under, if any: a secret-looking name redacts the whole
    scalar value. Dict keys are kept (they name what was redacted); their values are checked by name.
    """
    env = _env_secrets() if _env is None else _env
    if isinstance(value, dict):
        return {k: redact(v, name=str(k), _env=env) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v, _env=env) for v in value)
    if value is None or isinstance(value, bool):
        return value
    if name is not None and is_secret_name(name):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value, env)
    return value
