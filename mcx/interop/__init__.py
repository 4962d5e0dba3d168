"""Megatron-LM interoperability: launch scripts -> specs (``import_script``) and back (``export_args``).

Control plane only: nothing here imports torch or megatron, and no script is ever run.
"""

from mcx.interop.exporter import args_text, export, export_args, export_script
from mcx.interop.importer import ImportResult, import_file, import_script, summary, to_toml
from mcx.interop.pretrain_args import Mapped

__all__ = ["ImportResult", "Mapped", "args_text", "export", "export_args", "export_script", "import_file",
           "import_script", "summary", "to_toml"]
