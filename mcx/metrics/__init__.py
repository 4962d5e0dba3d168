"""A run's metrics: ``curves`` reads a stage's metrics.jsonl, ``summary`` defines every summary metric once.

Pure standard library and attrs, so the worker, the control plane and the reports share them.

``summary`` defines every summary metric once: curve, reduction, window, unit, direction, definition,
step-to-step spread; the worker's result.json finals, ``mcx show``/``ls``, the baseline gate, MLflow's
summary metrics and every compare format read it (docs/metrics.md). ``ranks`` reads each rank's step times;
``batches`` the per-step batch hashes and where two stages' batches first differ (D69). Side effects: reads files.
"""
