"""The two exception types and the exit codes: bad user input (naming the argument, as the caller used it: CLI flag
or Python parameter) and a fault while running (naming the file or step that failed)."""

from __future__ import annotations

import contextlib
import contextvars
import re
from typing import Iterator

#: Exit codes of ``python -m hyv_lib``. 0: done. 1: ``generate --prompts_file`` ran, but some entries or lines failed
#: (each has its ``error:`` line). 2: bad input, refused before any work: a flag, or a file given as input (model
#: folder, stage file, image, prompts file) that is missing, corrupt or holds NaN/Inf. 3: a fault while running: a
#: write the operating system refused (disk full, read-only or forbidden folder, I/O error) or a denoising step that
#: made NaN/Inf latents. Codes 2 and 3 print one ``error: ...`` line and leave no partial file.
EXIT_OK, EXIT_ENTRIES_FAILED, EXIT_BAD_INPUT, EXIT_FAULT = 0, 1, 2, 3


class HyvInputError(ValueError):
    """Bad input to a stage or the CLI.

    ``argument`` is the flag or parameter name (e.g. ``"--video_length"``); the CLI prints
    ``error: <argument>: <message>`` on one line and exits with code 2.
    """

    def __init__(self, argument: str, message: str):
        self.argument = argument
        self.message = message
        super().__init__(f"{argument}: {message}")


class HyvFaultError(RuntimeError):
    """A run that failed for a reason other than its input: what failed (``subject``: a file path, a denoising step)
    and why. The CLI prints ``error: <subject>: <message>`` on one line and exits with code 3 (:data:`EXIT_FAULT`),
    as it does for an ``OSError`` (a write the operating system refused)."""

    def __init__(self, subject: str, message: str):
        self.subject = subject
        self.message = message
        super().__init__(f"{subject}: {message}")


# The validation is shared by the CLI and the Python API and raises with CLI flags (``--height``). Inside
# :func:`cli_names` (the CLI's command runner) they stay flags; :func:`python_names` around a public Python entry
# point turns them into the parameters' names everywhere else.
_CALLED_FROM_CLI = contextvars.ContextVar("hyv_lib_called_from_cli", default=False)
_FLAG = re.compile(r"--([a-z][a-z0-9_]*)")


@contextlib.contextmanager
def cli_names() -> Iterator[None]:
    """Within this block (the CLI running a command), HyvInputError keeps naming CLI flags."""
    token = _CALLED_FROM_CLI.set(True)
    try:
        yield
    finally:
        _CALLED_FROM_CLI.reset(token)


def _python_text(message: str) -> str:
    """``message`` with each ``--flag`` written as the parameter ``flag``, unless the message quotes a command to run
    (``python -m hyv_lib calibrate_cache --preset ...``), whose flags must stay as typed."""
    return message if "python -m" in message else _FLAG.sub(r"\1", message)


@contextlib.contextmanager
def python_names() -> Iterator[None]:
    """Re-raise HyvInputError with the Python parameter's name (``height``) instead of the CLI flag (``--height``),
    in the argument and in the message, unless the CLI is the caller (:func:`cli_names`). Also a decorator."""
    try:
        yield
    except HyvInputError as err:
        if _CALLED_FROM_CLI.get() or (not err.argument.startswith("--") and "--" not in err.message):
            raise
        raise HyvInputError(err.argument.removeprefix("--"), _python_text(err.message)) from None


def one_line(text: str) -> str:
    """An error's text on one line (ffmpeg's and the OS's messages may hold several)."""
    return " ".join(str(text).split())
