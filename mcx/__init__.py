"""mcx: declarative, reproducible Megatron-Core experiments.

The control plane (everything outside ``mcx.train``) never imports torch, megatron, mlflow or dvc
at module level; ``mcx plan`` and friends stay fast.
"""

__version__ = "0.1.0"
