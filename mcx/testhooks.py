"""Test-only behaviour, behind one switch: ``MCX_TEST_HOOKS="name=value[,name=value]"``.

Tests use it to do what no user should: make a rerun depart at a known step, or record a run as if
on another CPU. Nothing else in mcx reads a test variable. The control plane copies the hooks into
the job file (``test_hooks``), which makes the job a test job and says so on stderr; the worker
takes its hooks only from there, and refuses to start where the switch is set but its job file is
not a test job (a stray variable on a node). ``MCX_TEST_*`` variables of older versions are refused.

Hooks:

- ``perturb_params_at_step=N`` or ``N:AMOUNT``: the worker adds AMOUNT (default 1e-2) to every
  floating-point model tensor just before step N of every stage that reaches it (tests/test_reproduce.py:
  ``mcx reproduce`` must say where the rerun departs). Pick N outside the smoke stage's resume check.
- ``cpu_model=TEXT``: the hardware fingerprint records TEXT as the CPU model (a reproduction "on other
  hardware" on one machine).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mcx.errors import InputError

ENV = "MCX_TEST_HOOKS"
HOOKS = ("perturb_params_at_step", "cpu_model")


def parse(text: str) -> dict[str, str]:
    """``"a=1,b=x"`` -> ``{"a": "1", "b": "x"}``; an unknown hook or a malformed item is an InputError."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, eq, value = item.partition("=")
        if not eq or name.strip() not in HOOKS:
            raise InputError(f"{ENV}={text!r}: {item!r} is not a test hook;",
                             f"it takes name=value items of {', '.join(HOOKS)}, and is for mcx's tests only: unset it.")
        out[name.strip()] = value.strip()
    return out


def active(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The hooks the switch sets here ({} when it is unset)."""
    env = os.environ if environ is None else environ
    stale = sorted(k for k in env if k.startswith("MCX_TEST_") and k != ENV)
    if stale:
        raise InputError(f"{', '.join(stale)} is set: mcx no longer reads test variables of that name;",
                         f"unset it (tests use {ENV}).")
    return parse(env.get(ENV, ""))


def perturbation(hooks: Mapping[str, str]) -> tuple[int, float] | None:
    """``perturb_params_at_step``'s (step, amount), or None."""
    raw = hooks.get("perturb_params_at_step")
    if not raw:
        return None
    at, _, amount = raw.partition(":")
    try:
        return int(at), float(amount or 1e-2)
    except ValueError:
        raise InputError(f"{ENV}: perturb_params_at_step={raw!r} is not N or N:AMOUNT;",
                         "give a step number, e.g. perturb_params_at_step=7 or 7:0.01.") from None
