"""``python -m mcx.eval EVAL_DIR``: the evaluation worker (mcx.eval.worker)."""

import sys

from mcx.eval.worker import main

sys.exit(main())
