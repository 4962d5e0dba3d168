"""The supervisor of a detached run (`mcx run --detach`, mcx.ops.detach): ``python -m mcx.cli.supervisor FD REQUEST``.

It forks at once (the process `mcx run --detach` started ends, its child is reparented to init and holds no
session of its own, so it never gets a terminal), then runs `mcx run` as the request says, its progress and
result in the run directory's ``supervisor.log`` (its stdout and stderr). Its first word goes to the pipe ``FD``,
one JSON line, and the pipe is closed: ``launched`` once the first stage's workers are started, else ``ended``
(the run's result) or ``error`` (an McxError before any stage started). SIGTERM stops it as Ctrl-C stops
`mcx run` (its local workers checkpoint; a Slurm job is left to `mcx cancel`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import IO, Any

from attrs import asdict


def main(argv: list[str]) -> int:
    fd, request = int(argv[0]), json.loads(argv[1])
    if os.fork():  # the parent ends; `mcx run --detach` waits for it
        os._exit(0)
    from mcx.ops.detach import Request

    pipe: IO[str] | None = os.fdopen(fd, "w", encoding="utf-8")

    def tell(message: dict[str, Any]) -> None:
        nonlocal pipe
        if pipe is None:
            return
        try:
            pipe.write(json.dumps({"pid": os.getpid(), **message}, default=str) + "\n")
            pipe.close()
        except OSError:  # `mcx run --detach` is gone (killed): the chain goes on
            pass
        pipe = None

    print(f"mcx supervisor: pid {os.getpid()} started {time.strftime('%Y-%m-%d %H:%M:%S')}", file=sys.stderr, flush=True)
    return _run(Request.from_dict(request), tell)


def _run(req: Any, tell: Any) -> int:
    from pathlib import Path

    from mcx.cli.output import children_to_stderr, show_progress
    from mcx.errors import McxError
    from mcx.ops.interrupts import term_interrupts
    from mcx.ops.progress import Event, Launched
    from mcx.ops.run import RunOptions, run

    def progress(event: Event) -> None:
        if isinstance(event, Launched):
            tell({"launched": asdict(event)})
        show_progress(event)

    from mcx.contract.profile import parse_profile_steps

    options = RunOptions(stage=req.stage, force=req.force, yes=True, skip_smoke=req.skip_smoke, output="quiet",
                         verify_data=req.verify_data, expect_run_id=req.run_id,
                         profile=parse_profile_steps(req.profile) if req.profile else None)
    try:
        with children_to_stderr(), term_interrupts():
            result = run(req.spec, list(req.overrides), project=Path(req.project), options=options, progress=progress)
    except McxError as exc:
        tell({"error": {"message": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}})
        print(f"mcx: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        tell({"error": {"message": "the supervisor was stopped (SIGTERM or SIGINT) before the first stage started",
                        "hint": "run the spec again.", "exit_code": 130}})
        return 130
    summary = result.summary.to_dict()
    tell({"ended": {"summary": summary, "notes": [asdict(n) for n in result.notes]}})
    for note in result.notes:
        show_progress(note)
    print(json.dumps(summary, sort_keys=True, default=str), flush=True)
    print(f"mcx supervisor: ended {time.strftime('%Y-%m-%d %H:%M:%S')}, exit code {result.summary.exit_code}",
          file=sys.stderr, flush=True)
    return int(result.summary.exit_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
