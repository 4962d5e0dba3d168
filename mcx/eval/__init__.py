"""Downstream evaluation: EleutherAI's lm-evaluation-harness on a run's weights, content-addressed (D68).

Importing this package is cheap: the harness, torch and transformers load only in the worker
(``python -m mcx.eval JOB_DIR``), a subprocess the control plane starts as it starts training.

Modules: ``tasks.py`` (task names and local task directories, and the identity of each: the harness's
version, or the directory's files); ``job.py`` (what one evaluation is: the job file the worker reads, and its
content key); ``scores.py`` (the harness's results as typed scores with standard errors, the record's file,
the flat ``eval/<task>/<metric>`` metrics); ``worker.py`` (the harness's Hugging Face model on the exported
weights, or a model given to it); ``megatron_lm.py`` (the harness's model interface over the run's own
Megatron-Core model, D72; run by ``python -m mcx.train.eval_model``). Side effects: the worker's files.
"""
