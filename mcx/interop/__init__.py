"""Megatron-LM interoperability: launch scripts -> specs (``import_script``) and back (``export_args``).

Control plane only: nothing here imports torch or megatron, and no script is ever run.

Modules: ``flags.py`` (the one spec-key <-> flag table); ``unmapped.py`` (flags with no key and why); a bash
reader that never executes (``lexer.py``, ``script.py``, ``expand.py``); ``importer.py``; ``exporter.py``;
``options.py`` + ``megatron_options.json`` (every Megatron-LM 0.19.2 argument, generated from its parser as
package data: an unknown one is refused with did-you-mean); ``overrides.py`` (``mcx import --set``, the
missing-value error); ``corrections.py`` (arguments Megatron-LM accepts and then overrides, written as they
train); ``data_blend.py`` (weighted and per-split data paths <-> [data] and its mixtures); ``notes.py`` (Megatron-LM defaults a LLaMA-like script relies on); ``carried.py`` (the ``# mcx:``
lines that carry what no argument does, so spec -> export -> import keeps the run ID); ``docgen.py``
(docs/spec.md). docs/migration.md is the user's guide.
"""

from mcx.interop.exporter import args_text, export, export_args, export_script
from mcx.interop.importer import ImportResult, import_file, import_script, summary, to_toml
from mcx.interop.pretrain_args import Mapped

__all__ = ["ImportResult", "Mapped", "args_text", "export", "export_args", "export_script", "import_file",
           "import_script", "summary", "to_toml"]
