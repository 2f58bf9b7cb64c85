"""One logging set-up for every entry script: tunesmith's own messages at INFO on the main
process, warnings only on the others."""

from __future__ import annotations

import logging
import os


def setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        format=f"[%(asctime)s rank{rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        level=logging.WARNING,
    )
    logging.getLogger("tunesmith").setLevel(logging.INFO if rank == 0 else logging.WARNING)
