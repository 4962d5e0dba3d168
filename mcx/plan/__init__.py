"""The planner: pure functions from a spec to its layout, memory, FLOPs, time, cost and smoke stage.

``planner.make_plan`` puts the modules together: ``hardware`` (GPU table), ``params`` (parameter
counts), ``layout`` (parallel degrees, Megatron's rules, recommendations), ``flops`` (Megatron's
FLOPs accounting), ``memory`` (peak memory per GPU), ``cost`` (time, GPU-hours, budget gate),
``stages`` (the smoke stage's shrunk spec) and ``smoketime`` (its job's time limit). Nothing here
imports torch or touches files.
"""
