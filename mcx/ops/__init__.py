"""One module per verb; each composes the library and returns data (never prints or exits).

The verbs: ``plan``; ``run`` (the orchestrator; ``stage`` one stage: job file, launch, result, checkpoint
into DVC; docs/runs.md has it step by step); ``reproduce``; ``pull``; ``compare``; ``explain``; ``data``;
``interop``; ``hf`` (``import-hf``, ``export-hf``); ``sweep`` (``mcx sweep``: Optuna's study in
``.mcx/sweeps/<name>/``, trials run through ``run_spec`` ``parallel`` at a time with disjoint GPUs, resumed;
``sweep_plan`` every trial known up front planned and the sweep's GPU-hours gated; ``sweep_watch`` the pruner
and the interrupt as the run's watch; D43); ``records`` (ls, show, lineage, sync, baseline); ``tune``
(micro-batch sweep; a trial out of memory from fragments runs again with ``train.expandable_segments``, D27;
``tune_layouts`` ``--layouts``: the planner's ranking, its top layouts measured where the GPUs are, D44);
``gc`` (what of .mcx/ can go, D35; ``usage`` its byte counts); ``worktrees`` (reproduction worktrees and which
are left over); ``project`` (where .mcx/ lives). Ops report progress as typed events (``progress.py``:
``Note``, ``PlanShown``) to a callable the CLI renders.
"""
