"""`mcx import` and `mcx export`: Megatron-LM launch scripts <-> specs."""

from __future__ import annotations

from pathlib import Path

from mcx.errors import InputError
from mcx.interop import export, import_file, summary
from mcx.ops.plan import te_for_plan
from mcx.plan.planner import make_plan
from mcx.spec import load_spec


def import_script(path: str, out: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> tuple[str, str]:
    """The spec TOML for a launch script (``overrides``: `--set KEY=VALUE` items that win over it), and the
    report of what was mapped and what was not."""
    text, result = import_file(path, overrides=overrides)
    if out:
        dest = Path(out)
        if dest.exists():
            raise InputError(f"{out} already exists;", "choose another -o path or remove it first.")
        dest.write_text(text, encoding="utf-8")
    return text, summary(result)


def export_spec(path: str, overrides: list[str], script: bool = True) -> str:
    """pretrain_gpt.py arguments (or a whole launch script) for the planned layout of a spec."""
    spec = load_spec(path, overrides)
    layout = make_plan(spec, te_available=te_for_plan(spec)).layout
    return export(spec, layout, script=script)
