"""``python -m mcx.train STAGE_DIR``: run one stage; the exit code is result.json's ``exit_code``
(0 finished or preempted, 1 failed or diverged, 2 bad input)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write("usage: python -m mcx.train STAGE_DIR  (a stage directory holding job.json)\n")
        return 2
    from mcx.train.worker import train_stage

    result = train_stage(args[0])
    if result.get("error"):
        sys.stderr.write(f"mcx.train: {result['status']}: {result['error']}\n")
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
