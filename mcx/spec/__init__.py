"""Experiment specs: schema (attrs), the strict converter, loading (extends, presets, --set), rules."""

from mcx.spec.load import dump_spec, load_spec, loads_spec, spec_to_dict
from mcx.spec.schema import ExperimentSpec

__all__ = ["ExperimentSpec", "dump_spec", "load_spec", "loads_spec", "spec_to_dict"]
