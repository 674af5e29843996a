"""The two exception types and the exit codes: bad user input (naming the Python parameter) and a fault while running
(naming the file or step that failed)."""

from __future__ import annotations

#: Exit codes of ``python -m hyv_lib``. 0: done. 1: ``generate --prompts_file`` ran, but some entries or lines failed
#: (each has its ``error:`` line). 2: bad input, refused before any work: a flag, or a file given as input (model
#: folder, stage file, image, prompts file) that is missing, corrupt or holds NaN/Inf. 3: a fault while running: a
#: write the operating system refused (disk full, read-only or forbidden folder, I/O error) or a denoising step that
#: made NaN/Inf latents. Codes 2 and 3 print one ``error: ...`` line and leave no partial file.
EXIT_OK, EXIT_ENTRIES_FAILED, EXIT_BAD_INPUT, EXIT_FAULT = 0, 1, 2, 3


class HyvInputError(ValueError):
    """Bad input to a function of hyv_lib or to the CLI.

    ``argument`` names what was wrong: a Python parameter (``"video_length"``), or a file or line where no parameter
    fits. The message names other parameters in backquotes (``"needs `runtime` jax"``). The command line prints
    ``error: <argument>: <message>`` on one line and exits with code 2, each parameter that one of its flags sets
    written as that flag (``--video_length``, ``--runtime``: :mod:`hyv_lib.cli.error_lines`); its own checks name
    flags directly.
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


def one_line(text: str) -> str:
    """An error's text on one line (ffmpeg's and the OS's messages may hold several)."""
    return " ".join(str(text).split())
