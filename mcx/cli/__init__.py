"""The thin argparse shell over ``mcx.ops``.

``main.py`` declares the verbs' arguments, checks output paths (``mcx/ops/outputs.py``) and maps ``McxError``
to exit codes (docs/cli.md); each verb in ``verbs.py`` calls one ops function and prints the result on stdout
(progress events on stderr, ``output.show_progress``; plain, unwrapped text off a terminal: ``output.py``).
"""
