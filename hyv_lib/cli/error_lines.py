"""The command line's ``error:`` lines: the Python parameters hyv_lib's errors name, written as the command's flags."""

from __future__ import annotations

import argparse
import re

from ..base.errors import one_line

#: How hyv_lib's messages name a parameter (:class:`hyv_lib.base.errors.HyvInputError`): in backticks.
PARAMETER = re.compile(r"`([a-z][a-z0-9_]*)`")


def flag_text(text: str, args: argparse.Namespace) -> str:
    """``text`` with each `parameter` that the command has a flag of that name for written as ``--parameter``; other
    backquoted names stay as they are."""
    return PARAMETER.sub(lambda m: f"--{m.group(1)}" if m.group(1) in vars(args) else m.group(0), str(text))


def flag_name(argument: str, args: argparse.Namespace) -> str:
    """An error's ``argument`` as the command line spells it: ``--name`` when the command has that flag, else as it
    is (a path, a line of a prompts file, a parameter no flag sets)."""
    return f"--{argument}" if argument in vars(args) and argument != "command" else argument


def error_line(argument: str, message: str, args: argparse.Namespace) -> str:
    """``error: <argument>: <message>`` on one line, in the command's flags."""
    return f"error: {flag_name(argument, args)}: {one_line(flag_text(message, args))}"
