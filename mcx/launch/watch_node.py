"""``python -m mcx.launch.watch_node STAGE_DIR [policy] -- AGENT ARGV``: a node's watchdog, as the torchrun
launcher and the sbatch script start it (mcx.launch.watchdog holds what it does)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from mcx.launch.watchdog import MODULE, Watchdog
from mcx.spec.schema import WatchdogSpec


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description="Run a node's torchrun agent under the hang watchdog (mcx.launch.watchdog).")
    parser.add_argument("stage_dir", type=Path)
    defaults = WatchdogSpec()
    parser.add_argument("--max-restarts", type=int, default=defaults.max_restarts)
    parser.add_argument("--step-factor", type=float, default=defaults.step_factor)
    parser.add_argument("--min-seconds", type=int, default=defaults.min_seconds)
    parser.add_argument("--startup-seconds", type=int, default=defaults.startup_seconds)
    parser.add_argument("--predicted-step-s", type=float, default=None)
    parser.add_argument("--restart-in-place", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("the agent's command goes after --")
    cut = argv.index("--")
    args, agent = parser.parse_args(argv[:cut]), argv[cut + 1:]
    policy = WatchdogSpec(max_restarts=args.max_restarts, step_factor=args.step_factor, min_seconds=args.min_seconds,
                          startup_seconds=args.startup_seconds)
    return Watchdog(args.stage_dir.resolve(), policy, agent, predicted_step_s=args.predicted_step_s,
                    in_place=args.restart_in_place).run()


if __name__ == "__main__":
    sys.exit(main())
