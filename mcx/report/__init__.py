"""Reports: run data, comparisons (terminal, Markdown, JSON, HTML with SVG plots), reproduction verdicts.

Import the submodules you need (``mcx.report.compare``, ``mcx.report.verdict``, ...); nothing here
imports torch, megatron or mlflow, so ``mcx compare`` starts quickly.
"""
