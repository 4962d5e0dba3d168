"""The contract between the control plane and the worker: what one writes into a stage directory and the
other reads back (docs/stage-directory.md).

* :mod:`mcx.contract.files`: the stage directory's file names (job.json, metrics.jsonl, result.json, ...);
* :mod:`mcx.contract.job`: the job (job.json): what the control plane asks the worker to train;
* :mod:`mcx.contract.result`: the stage result (result.json): how the stage ended, typed;
* :mod:`mcx.contract.status`: the ``Status`` of a stage and a run, as the files spell it;
* :mod:`mcx.contract.checkpoints`: the checkpoint directory's layout (``latest``, iter_NNNNNNN, ...).

Both sides import these modules and nothing else of each other; they import nothing heavy.
"""
