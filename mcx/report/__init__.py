"""Reports: run data, comparisons (terminal, Markdown, JSON, HTML with SVG plots), reproduction verdicts.

Import the submodules you need (``mcx.report.compare_view``, ``mcx.report.verdict``, ...); nothing here
imports torch, megatron or mlflow, so ``mcx compare`` starts quickly.

Modules: ``notes.py`` (the notes ``mcx run`` returns beside its summary: cached, its error, records left to
sync); compare tables, Markdown, JSON, HTML with SVG plots (``cells.py``: a metric cell and ABSENT, shared
by compare and fmt; ``heldout.py`` and ``outcome.py``: the summary at the top, which run is better on the
held-out metric against the seed noise; ``rolling.py``: smoothed train loss and the throughput's p10-p90
band); the ``mcx gc`` table; the results of run, reproduce and tune (``run_view.py``); a sweep's trials
(``sweep_view.py``) and its section of ``mcx compare --sweep`` (``sweep_report.py``: the objective against
each parameter); ``mcx ls``/``show`` (``records_view.py``); ``plain.py`` (plain, unwrapped text off a
terminal: the CLI's console and ``compare --format table -o``); ``titled.py`` (table titles never wrapped).
"""
