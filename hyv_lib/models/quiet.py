"""Library log lines that say nothing to hyv_lib's users, silenced for one block."""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def errors_only(logger_name: str):
    """The named logger (a diffusers or transformers module's) passes only errors inside the block; its level is
    restored after."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
