"""Writing files safely: output folders checked up front, and atomic writes (a temp name, then rename)."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from typing import Iterator

from .errors import HyvInputError


def ensure_output_dir(path: str, argument: str = "--output_dir") -> str:
    """Create ``path`` if needed and check it is writable; a HyvInputError names ``argument`` otherwise."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".hyv-write-test-"):
            pass
    except OSError as err:
        raise HyvInputError(argument, f"cannot write to {path!r}: {err.strerror or err}") from None
    return path


@contextlib.contextmanager
def atomic_path(final_path: str) -> Iterator[str]:
    """Yield a temporary path next to ``final_path``; rename it into place only if the block succeeds.

    The temporary name keeps the extension, so tools that infer the format from it (ffmpeg) still work.
    """
    directory, base = os.path.split(os.path.abspath(final_path))
    stem, ext = os.path.splitext(base)
    # An exclusive create with mode 0666 gets the process umask applied by the kernel, as any new file does
    # (mkstemp's 0600 would need the umask read back, and reading it means setting it: a race with other threads).
    while True:
        tmp = os.path.join(directory, f".{stem}.{secrets.token_hex(6)}.partial{ext}")
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # flushed to disk before the rename, so a crash cannot leave a short file
            os.fsync(f.fileno())
        os.replace(tmp, final_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
