"""A run's metrics: ``curves`` reads a stage's metrics.jsonl, ``summary`` defines every summary metric once.

Pure standard library and attrs, so the worker, the control plane and the reports share them.
"""
