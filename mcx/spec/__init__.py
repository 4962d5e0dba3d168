"""Experiment specs: schema (attrs), the strict converter, loading (extends, presets, --set), rules.

Modules: ``schema.py`` the frozen attrs classes; ``convert.py`` the strict cattrs converter and its error
flattening; ``load.py`` TOML, ``extends``, presets, ``--set``; ``presets.py`` model shapes as data;
``rules.py`` single-spec cross-field rules; ``container.py`` ``[launch.container]`` read as an image kind and mounts, and its rules (D67); ``keys.py`` every spec key as a dotted path with its type and
default, from the schema. Side effects: reads files.
"""

from mcx.spec.load import dump_spec, load_spec, loads_spec, spec_to_dict
from mcx.spec.schema import ExperimentSpec

__all__ = ["ExperimentSpec", "dump_spec", "load_spec", "loads_spec", "spec_to_dict"]
