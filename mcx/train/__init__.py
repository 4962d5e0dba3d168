"""The training worker: the only package that imports torch and megatron.

``python -m mcx.train STAGE_DIR`` or, in process, :func:`train_stage`. The contract (job.json in;
metrics.jsonl, checkpoints/, result.json, worker.log out) is in docs/stage-directory.md. Importing this
package is cheap: torch and megatron load when a stage runs.

Modules: ``job.py`` (the job file; docs/stage-directory.md); ``warmstart.py`` (a full stage's weights from
``[init]``: the source read as canonical weights, mcx.weights, and a strict load naming every tensor that
does not fit); ``fullstate.py`` (canonical weights into the shards of a model of any layout and layer spec,
each shard found by the model's own ``sharded_state_dict()``: the GPU backend's ``hf:`` and CPU-run
sources); ``model.py`` (GPTModel from the spec; on the local spec MCore's RoPE torch.compile'd, D21);
``wgrad.py`` (Megatron's fused weight-gradient accumulation on cuBLAS where apex is absent, checked on the
GPU first); ``fused_mlp.py`` (``train.te_op_fuser``: MCore's TEFusedMLP with its ops' FP8 state in
checkpoints and DDP's pre-hooks run at each forward, D29); ``gpu.py`` (MCore's DDP, distributed optimizer,
schedules and dist_checkpointing; asynchronous saves through one persistent writer per rank with a cached
save plan, D19, each save's pause logged by phase, D28, the first save's copy rehearsed after step 1, D30;
Transformer Engine may unpickle FP8 state only during the backend's own loads, D25); ``writer.py``
(MCore's checkpoint writer: started right after Megatron-Core is imported, its results queue warmed up in a
thread, each request timed inside the writer process and logged to worker.log, D31); ``cpu.py`` (the CPU
adaptations, one small module); ``data.py`` (MCore datasets); ``loop.py``; ``checkpoint.py`` (the
directory protocol, docs/stage-directory.md; pruned checkpoints renamed out and deleted by a background
thread, D32; damaged ones set aside, D36); ``worklog.py`` (worker.log for the worker and its checkpoint
writer); ``metrics.py``; ``batch_hash.py`` (each step's micro-batches hashed on the host, one file a
data-parallel rank, D69); ``system.py`` (GPU and host sampler thread); ``smoke.py``. Side effects: torch,
megatron, NVML / nvidia-smi, files in the stage directory.
"""

from __future__ import annotations

from mcx.train.worker import train_stage

__all__ = ["train_stage"]
