"""The planner: pure functions from a spec to its layout, memory, FLOPs, time, cost and smoke stage.

``planner.make_plan`` puts the modules together: ``hardware`` (GPU table), ``params`` (parameter
counts), ``layout`` (parallel degrees, Megatron's rules, recommendations), ``flops`` (Megatron's
FLOPs accounting), ``memory`` (peak memory per GPU), ``cost`` (time, GPU-hours, budget gate),
``stages`` (the smoke stage's shrunk spec) and ``smoketime`` (its job's time limit). Nothing here
imports torch or touches files.

In detail, all pure: ``hardware.py`` the GPU table (peak FLOPs, memory); ``params.py`` parameter counts;
``degrees.py`` the one ``Layout`` (planner, launchers and worker); ``layout.py`` layout rules and the choice
of unset degrees; ``flops.py`` Megatron's FLOPs accounting; ``fusions.py`` which optional fused kernels run
(one rule for the planner's memory model and the worker); ``memory.py`` memory per GPU; ``steptime.py`` the
step-time model (a step's compute, exposed communication and pipeline bubble from the GPU table, calibrated
on measured steps in benchmarks/calibration/; docs/steptime.md); ``tuning.py`` every layout that fits,
ranked by it (``mcx tune --layouts``); ``cost.py`` time, GPU-hours and budget (the model's step, or
``budget.assumed_mfu`` where set); ``stages.py`` smoke shapes; ``smoketime.py`` the smoke job's time limit;
``sweep.py`` a sweep's trials before anything runs (its keys and values checked against the spec, the grid,
each trial's spec, whether the objective is recorded); ``mixture.py`` what a run reads of each dataset of a
mixture (tokens, share, epochs); ``planner.py`` puts them into one ``Plan``.
"""
