"""The worker's log, ``worker.log`` in the stage directory: its format and levels (rank 0 at INFO,
the other ranks at WARNING), for the worker (mcx.train.worker) and the checkpoint writer process
(mcx.train.writer) alike."""

from __future__ import annotations

import logging
from pathlib import Path

from mcx.contract.files import LOG_FILE


def start_logging(stage_dir: Path, rank: int) -> logging.Handler:
    handler = logging.FileHandler(stage_dir / LOG_FILE, encoding="utf-8")
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for name, level in (("mcx", logging.INFO), ("megatron", logging.WARNING), ("py.warnings", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(min(logger.level or level, level))
    logging.captureWarnings(True)
    return handler


def stop_logging(handler: logging.Handler) -> None:
    for name in ("mcx", "megatron", "py.warnings"):
        logging.getLogger(name).removeHandler(handler)
    logging.captureWarnings(False)
    handler.close()
