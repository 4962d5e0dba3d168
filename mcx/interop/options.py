"""Every option string of Megatron-LM 0.19.2's pretrain_gpt.py parser, as data, and what it refuses.

The control plane never imports megatron, so the list is committed as a generated data file,
mcx/interop/megatron_options.json (package data), made from the real parser (``add_megatron_arguments``
from megatron.training.arguments on ``argparse.ArgumentParser(allow_abbrev=False)``, as Megatron-LM's
``parse_args`` builds it):

    python -m mcx.interop.options            # rewrite megatron_options.json (needs megatron-core)
    python -m mcx.interop.options --check    # exit 1 when the file is out of date

tests/test_interop.py checks the file against the parser.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from mcx.errors import InputError
from mcx.interop.script import Launch

FILE = Path(__file__).with_name("megatron_options.json")
MEGATRON_LM = "0.19.2"  # the release whose parser the file lists
# argparse's reading of a negative number: a value, not an option (the parser has no options like it)
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


@cache
def megatron_options() -> frozenset[str]:
    """The option strings Megatron-LM's parser accepts (``--lr``, ``-h``, ...)."""
    return frozenset(json.loads(FILE.read_text(encoding="utf-8"))["options"])


def is_option(word: str) -> bool:
    """Whether argparse reads ``word`` as an option rather than a value (its ``_parse_optional``)."""
    return (word.startswith("-") and len(word) > 1 and not _NEGATIVE.match(word) and " " not in word) \
        or word.partition("=")[0] in megatron_options()


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def unknown_options(words: Iterable[object]) -> dict[str, str]:
    """{option: what to say of it} for each option Megatron-LM's parser would refuse: its closest
    Megatron-LM options, or, for a number argparse takes for an option (-1e-5), how to pass it."""
    known = megatron_options()
    out: dict[str, str] = {}
    previous: object = None
    for w in words:
        if isinstance(w, str) and is_option(w):
            flag = w.partition("=")[0] if w.startswith("--") else w
            if flag not in known and flag not in out:
                near = difflib.get_close_matches(flag, sorted(known), n=3, cutoff=0.6)
                if _number(w) and isinstance(previous, str) and previous in known:
                    out[flag] = f"argparse reads it as an option, not a value: write {previous}={w}"
                elif near:
                    out[flag] = f"did you mean {_or(near)}?"
                else:
                    out[flag] = "no argument is close"
        previous = w
    return out


def _or(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + f" or {words[-1]}"


def check_options(launch: Launch, source: str) -> None:
    """InputError naming every argument Megatron-LM's parser would refuse, each with its closest matches."""
    unknown = unknown_options(launch.args)
    if not unknown:
        return
    items = [f"{flag} ({say})" for flag, say in unknown.items()]
    listed = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    raise InputError(f"line {launch.line} of {source} passes {listed}, which Megatron-LM's pretrain_gpt.py does not "
                     "know, so it would refuse the command;",
                     f"correct or remove {'it' if len(items) == 1 else 'them'} in the script, then import again.")


def parser_options() -> list[str]:
    """The option strings of the real parser (imports megatron: for regeneration and tests only)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.training.arguments import add_megatron_arguments
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    return sorted(parser._option_string_actions)


def render(options: Iterable[str]) -> str:
    """The text of megatron_options.json: the options sorted, one a line, so a new release's diff reads."""
    record = {"megatron_lm": MEGATRON_LM, "parser": "pretrain_gpt.py",
              "generated_by": "python -m mcx.interop.options (from the real parser; do not edit)",
              "options": sorted(options)}
    return json.dumps(record, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcx.interop.options", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is out of date")
    ns = parser.parse_args(argv)
    new = render(parser_options())
    old = FILE.read_text(encoding="utf-8") if FILE.exists() else ""
    if ns.check:
        return 0 if new == old else 1
    if new != old:
        FILE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
